"""Containers: the job's image pulled and run as TPU VMs run containers (`agent/containers.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    a_config,
)

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import job_environment, load_config
from tpujobs.agent.containers import (
    GOOGLE_REGISTRY,
    MAX_DOCKER_WORDS,
    WRAPPER,
    Docker,
    ImageProblem,
    container_environment,
    container_labels,
    container_name,
    docker_failure,
    docker_run_argv,
    image_repository,
    pull_problem,
    registry_host,
)
from tpujobs.agent.wire import MAX_DETAIL_CHARS

# --- containers: configuration and the docker command -----------------------------------


IMAGE = "us-docker.pkg.dev/proj-1/repo/trainer:2026-11"


def test_a_config_with_an_image_gets_the_default_pull_policy(tmp_path: Path) -> None:
    """No image: image and policy null; a tagged image: if-missing; untagged or :latest: always."""
    path = tmp_path / "config.json"
    for image, policy in [(None, None), (IMAGE, "if-missing"), ("trainer", "always"), ("r.io/t:latest", "always")]:
        path.write_text(json.dumps(a_config(image=image)))
        config = load_config(str(path))
        assert (config["image"], config["image_pull_policy"]) == (image, policy)


@pytest.mark.parametrize(
    "changes",
    [
        {"image": "-v/etc:/x busybox"},
        {"image": "--privileged"},
        {"image": "trainer latest"},
        {"image": ""},
        {"image": 7},
        {"image": IMAGE, "image_pull_policy": "never"},
        {"image": IMAGE, "image_pull_policy": 1},
    ],
)
def test_a_config_with_a_bad_image_or_pull_policy_is_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    """An image reference with whitespace or a leading dash, or an unknown policy, names its key."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(**changes)))
    with pytest.raises(AgentError, match=list(changes)[-1]):
        load_config(str(path))


@pytest.mark.parametrize(
    ("image", "host", "google_registry"),
    [
        (IMAGE, "us-docker.pkg.dev", True),
        ("europe-west4-docker.pkg.dev/p/r/t@sha256:" + "a" * 64, "europe-west4-docker.pkg.dev", True),
        ("gcr.io/p/t:1", "gcr.io", True),
        ("eu.gcr.io/p/t:1", "eu.gcr.io", True),
        ("127.0.0.1:5000/team/t:1", "127.0.0.1:5000", False),
        ("localhost/t", "localhost", False),
        ("ubuntu:22.04", "docker.io", False),
        ("library/ubuntu", "docker.io", False),
        ("evilgcr.io/t:1", "evilgcr.io", False),
        ("pkg.dev.example.com/t:1", "pkg.dev.example.com", False),
    ],
)
def test_only_googles_registries_get_the_hosts_token(image: str, host: str, google_registry: bool) -> None:
    """The registry is the first component when it names a host; *.pkg.dev and (*.)gcr.io are Google's."""
    assert registry_host(image) == host
    assert bool(GOOGLE_REGISTRY.fullmatch(host)) is google_registry


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        (IMAGE, "us-docker.pkg.dev/proj-1/repo/trainer"),
        ("127.0.0.1:5000/t", "127.0.0.1:5000/t"),
        ("127.0.0.1:5000/t:v1", "127.0.0.1:5000/t"),
        ("r.io/t@sha256:" + "b" * 64, "r.io/t"),
        ("ubuntu:22.04", "ubuntu"),
    ],
)
def test_an_images_repository_is_its_reference_without_tag_or_digest(image: str, repository: str) -> None:
    """A registry's port is not a tag."""
    assert image_repository(image) == repository


PULL_ERRORS = {
    "not found": (
        "not found",
        "Error response from daemon: manifest for 127.0.0.1:5000/t:1 not found: manifest unknown: manifest unknown",
    ),
    "ar not found": ("not found", "Error response from daemon: failed to resolve reference: not found"),
    "denied": (
        "access denied",
        'Error response from daemon: Head "https://us-docker.pkg.dev/v2/p/r/t/manifests/1": denied: Permission '
        '"artifactregistry.repositories.downloadArtifacts" denied on resource',
    ),
    "unauthorized": ("access denied", "Error response from daemon: unauthorized: authentication failed"),
    "403": ("access denied", "Error response from daemon: received unexpected HTTP status: 403 Forbidden"),
    "refused": (
        "no network",
        'Error response from daemon: Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
    ),
    "no such host": ("no network", "dial tcp: lookup us-docker.pkg.dev on 10.0.0.1:53: no such host"),
    "timeout": (
        "no network",
        "Error response from daemon: Get https://gcr.io/v2/: net/http: request canceled while waiting for "
        "connection (Client.Timeout exceeded while awaiting headers)",
    ),
    "named like an error": (
        "not found",
        "Error response from daemon: manifest for r.io/timeout-denied:1 not found: manifest unknown",
    ),
}


@pytest.mark.parametrize(("why", "said"), PULL_ERRORS.values(), ids=PULL_ERRORS.keys())
def test_a_failed_pull_says_why_in_one_sentence_naming_the_image(why: str, said: str) -> None:
    """The reason by docker's words (the image's own name ignored), then docker's words, on one line."""
    image = "r.io/timeout-denied:1" if "timeout-denied" in said else "127.0.0.1:5000/t:1"
    sentence = pull_problem(image, said + "\n")
    assert sentence.startswith(f"cannot pull the image {image}: {why} (docker said: ")
    assert "\n" not in sentence and len(sentence) < MAX_DETAIL_CHARS


def test_a_pull_error_of_no_known_kind_is_reported_in_dockers_own_bounded_words() -> None:
    """Unknown words are quoted, cut to MAX_DOCKER_WORDS."""
    sentence = pull_problem("r.io/t:1", "something odd " * 100)
    assert sentence.startswith("cannot pull the image r.io/t:1: docker said: something odd something odd")
    assert len(sentence) <= len("cannot pull the image r.io/t:1: docker said: ") + MAX_DOCKER_WORDS


def test_dockers_own_failure_is_told_from_the_commands_exit_code() -> None:
    """A 125/126/127 is docker's when docker or its init said so last; else it is the command's."""
    tail = b"training...\n[FATAL tini (7)] exec sh failed: No such file or directory\n"
    assert docker_failure(tail) == "[FATAL tini (7)] exec sh failed: No such file or directory"
    daemon = b"docker: Error response from daemon: failed to create task: unable to apply caps.\n"
    assert docker_failure(daemon).startswith("docker: Error response from daemon")
    assert docker_failure(b"bash: train.py: command not found\n") is None


def test_the_container_environment_passes_the_jobs_names_only_and_keeps_the_host_out() -> None:
    """-e NAME for the spec's env, secrets, TPUJOBS_* and MEGASCALE_*; values only in the CLI's
    environment; the host's variables stay out; DOCKER_* names steer the CLI, so are left out."""
    host = {"PATH": "/usr/bin", "HOME": "/root", "DOCKER_HOST": "unix:///var/run/docker.sock", "TPUJOBS_WORKDIR": "/w"}
    config = a_config(env={"LR": "0.1", "DOCKER_HOST": "tcp://elsewhere:2375"})
    megascale = {"MEGASCALE_SLICE_ID": "1"}
    job_env = job_environment(host, config, 3, 1, {"HF_TOKEN": "s3cret"}, megascale)
    names, cli_env, left_out = container_environment(job_env, host, config, ["HF_TOKEN"], megascale)
    assert names == [
        "HF_TOKEN",
        "LR",
        "MEGASCALE_SLICE_ID",
        "TPUJOBS_ATTEMPT",
        "TPUJOBS_CHECKPOINT_URI",
        "TPUJOBS_JOB_ID",
        "TPUJOBS_NUM_SLICES",
        "TPUJOBS_NUM_WORKERS",
        "TPUJOBS_RESUME",
        "TPUJOBS_SLICE_ID",
        "TPUJOBS_WORKER_ID",
    ]
    assert left_out == ["DOCKER_HOST"]
    assert cli_env["DOCKER_HOST"] == "unix:///var/run/docker.sock"  # the host's: the agent's docker stays its own
    assert (cli_env["HF_TOKEN"], cli_env["PATH"], cli_env["TPUJOBS_WORKER_ID"]) == ("s3cret", "/usr/bin", "3")
    assert "TPUJOBS_WORKDIR" not in cli_env


def test_a_jobs_home_reaches_the_container_but_the_cli_keeps_the_hosts_docker_config() -> None:
    """A config under the job's HOME could switch the CLI's context to another daemon: the CLI
    is pointed at the host's config directory; without a job HOME nothing is added."""
    host = {"PATH": "/usr/bin", "HOME": "/root"}
    config = a_config(env={"HOME": "/workspace"})
    job_env = job_environment(host, config, 0, 0)
    names, cli_env, _ = container_environment(job_env, host, config, [], {})
    assert "HOME" in names
    assert (cli_env["HOME"], cli_env["DOCKER_CONFIG"]) == ("/workspace", "/root/.docker")
    plain = a_config(env={})
    _, cli_env, _ = container_environment(job_environment(host, plain, 0, 0), host, plain, [], {})
    assert "DOCKER_CONFIG" not in cli_env
    own = {**host, "DOCKER_CONFIG": "/etc/docker-cli"}
    _, cli_env, _ = container_environment(job_environment(own, config, 0, 0), own, config, [], {})
    assert cli_env["DOCKER_CONFIG"] == "/etc/docker-cli"


def test_docker_run_is_built_as_tpu_vms_run_containers_with_no_value_on_its_command_line() -> None:
    """Privileged, host network and IPC, /dev, docker's init forwarding to the group, names and
    labels, the code mount; setup and command as arguments after the wrapper, never inside it."""
    setup, command = 'pip install -r "req.txt"; echo $HOME', "python3 train.py --lr=$LR"
    argv = docker_run_argv(
        "/usr/bin/docker", IMAGE, "tpujobs-train-1-a2-s1-w3", ["tpujobs.job=train-1"], ["HF_TOKEN", "LR"],
        setup, command, privileged=True, mount=("/var/lib/tpujobs/train-1/attempt-2/code", "/srv/app"),
    )  # fmt: skip
    assert argv[:2] == ["/usr/bin/docker", "run"]
    for option in (
        ["--rm"],
        ["--init"],
        ["--sig-proxy=false"],
        ["--privileged"],
        ["--network", "host"],
        ["--ipc", "host"],
        ["-v", "/dev:/dev"],
        ["-e", "TINI_KILL_PROCESS_GROUP=1"],
        ["--name", "tpujobs-train-1-a2-s1-w3"],
        ["--label", "tpujobs.job=train-1"],
        ["-e", "HF_TOKEN"],
        ["-e", "LR"],
        ["-v", "/var/lib/tpujobs/train-1/attempt-2/code:/srv/app", "-w", "/srv/app"],
    ):
        assert any(argv[i : i + len(option)] == option for i in range(len(argv))), option
    assert argv[-8:] == ["--entrypoint", "sh", IMAGE, "-c", WRAPPER, "tpujobs", setup, command]
    unprivileged = docker_run_argv("/usr/bin/docker", IMAGE, "n", [], [], None, "true", privileged=False)
    assert "--privileged" not in unprivileged and unprivileged[-2:] == ["", "true"]


def test_a_code_directory_that_cannot_be_mounted_safely_is_refused() -> None:
    """A ':' or ',' in a mounted path would change what -v means: a sentence, not a mount."""
    with pytest.raises(ImageProblem, match="cannot be mounted"):
        docker_run_argv("docker", IMAGE, "n", [], [], None, "true", mount=("/w/a:b/code", "/workspace"))


def test_container_names_and_labels_name_job_attempt_slice_worker_and_the_simulated_host() -> None:
    """Deterministic names a docker name accepts; the host label only on a simulated host."""
    config = a_config(job_id="train-1", attempt=2)
    assert container_name(config, 1, 3) == "tpujobs-train-1-a2-s1-w3"
    assert container_labels(config, 1, 3, "") == [
        "tpujobs.job=train-1",
        "tpujobs.attempt=2",
        "tpujobs.slice=1",
        "tpujobs.worker=3",
    ]
    assert container_labels(config, 1, 3, "qr/1/3/abc")[-1] == "tpujobs.host=qr/1/3/abc"


SETUP_FAILED_LINE = "[tpujobs-agent] setup exited with 4; the command does not run\n"
WRAPPER_CASES = {
    "setup then command": ("echo one > marker", "cat marker; exit 3", 3, "one\n"),
    "no setup": ("", "echo only-command", 0, "only-command\n"),
    "setup fails": ("echo trying; exit 4", "echo never", 4, f"trying\n{SETUP_FAILED_LINE}"),
    "quotes stay data": ("echo \"'$1'\" '\"; echo injected'", "echo ok", 0, "'' \"; echo injected\nok\n"),
}  # fmt: skip


@pytest.mark.parametrize(("setup", "command", "code", "output"), WRAPPER_CASES.values(), ids=WRAPPER_CASES.keys())
def test_the_wrapper_runs_setup_then_the_command_in_one_shell_session(
    tmp_path: Path, setup: str, command: str, code: int, output: str
) -> None:
    """As the container runs it (`sh -c WRAPPER tpujobs SETUP COMMAND`): setup's files are the
    command's, a failed setup stops everything with its code, arguments are never wrapper text."""
    done = subprocess.run(
        ["sh", "-c", WRAPPER, "tpujobs", setup, command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (code, output), done.stderr


class _Tokens:
    """The host's token, as TokenSource gives it."""

    def token(self) -> str:
        return "ya29.host-token-value"


def test_a_google_registry_pull_logs_in_with_the_hosts_token_on_stdin_in_a_private_directory(
    tmp_path: Path,
) -> None:
    """A recording stand-in for the docker CLI (the real one needs a real Artifact Registry):
    login gets oauth2accesstoken and the token on stdin only, in a 0700 directory that the pull
    uses and that is gone afterwards."""
    record = tmp_path / "calls.jsonl"
    stand_in = tmp_path / "docker"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import json, os, stat, sys\n"
        "args = sys.argv[1:]\n"
        "stdin = sys.stdin.read() if 'login' in args else ''\n"
        "config = args[args.index('--config') + 1] if '--config' in args else None\n"
        "mode = oct(stat.S_IMODE(os.stat(config).st_mode)) if config else None\n"
        f"with open({str(record)!r}, 'a') as out:\n"
        "    out.write(json.dumps({'args': args, 'stdin': stdin, 'mode': mode}) + '\\n')\n"
    )
    stand_in.chmod(0o755)
    docker = Docker(str(stand_in), {"PATH": os.environ["PATH"]}, _Tokens())  # type: ignore[arg-type]
    docker.pull(IMAGE, threading.Event())
    login, pull = [json.loads(line) for line in record.read_text().splitlines()]
    config = login["args"][1]
    assert login["args"] == [
        "--config", config, "login", "--username", "oauth2accesstoken", "--password-stdin", "https://us-docker.pkg.dev",
    ]  # fmt: skip
    assert (login["stdin"], login["mode"]) == ("ya29.host-token-value", "0o700")
    assert pull["args"] == ["--config", config, "pull", "--quiet", IMAGE]
    assert not Path(config).exists()
    record.unlink()
    docker.pull("127.0.0.1:5000/t:1", threading.Event())  # not Google's: no login, no config
    (only,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert only["args"] == ["pull", "--quiet", "127.0.0.1:5000/t:1"]
