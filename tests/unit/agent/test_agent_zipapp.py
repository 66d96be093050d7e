"""The agent ships as a deterministic zipapp, small enough for a startup script of at most 64 KiB."""

from __future__ import annotations

import ast
import base64
import bz2
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from agent_stubs import SETTINGS, a_job

import tpujobs.agent
from tpujobs.engine import startup_script as startup
from tpujobs.engine.startup_script import (
    AGENT_DELIMITER,
    ZIPAPP_PACKAGE,
    agent_blob,
    agent_zipapp,
    render_startup_script,
    render_unit_startup_script,
)

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(tpujobs.agent.__file__).parent
MAX_SCRIPT_BYTES = 64 * 1024
EVERY_OPTION = {
    "accelerator_type": "v4-16",
    "slices": 4,
    "command": "python3 -m trainer.main --config configs/big.yaml " + "--flag=value " * 60,
    "setup": "pip install -r requirements.txt && " + "echo preparing; " * 60,
    "code_uri": "gs://proj-1-tpujobs-code/jobs/train-1/code.tar.gz",
    "code_sha256": "ab" * 32,
    "image": "us-docker.pkg.dev/proj-1/repo/trainer:2026-11",
    "image_pull_policy": "always",
    "env": {f"TRAINER_SETTING_{n}": "v" * 80 for n in range(20)},
    "secrets": {f"TOKEN_{n}": f"token-{n}" for n in range(10)},
    "service_account": "trainer@proj-1.iam.gserviceaccount.com",
    "time_limit": "48h",
    "attempt_time_limit": "12h",
    "hang_timeout": "30m",
    "retry_on": {"exit_codes": [3, 75], "output": ["DEADLINE_EXCEEDED", "UNAVAILABLE", "NCCL error .*"]},
    "labels": {"team": "research", "project": "big-model"},
    "pool": "warm-v4",
}


def a_job_with_every_option():
    """The job of EVERY_OPTION, resuming at attempt 3 (so its config holds every key)."""
    return a_job(3, **EVERY_OPTION).evolve(resume_next=True)


def test_the_zipapp_holds_the_agent_package_and_an_entry_point() -> None:
    """Every module of tpujobs.agent, found through the package itself, and a __main__.py that runs main."""
    with zipfile.ZipFile(io.BytesIO(agent_zipapp())) as archive:
        names = archive.namelist()
        main = archive.read("__main__.py").decode()
    expected = {f"{ZIPAPP_PACKAGE}/{path.name}" for path in PACKAGE.glob("*.py")}
    assert set(names) == expected | {"__main__.py"}
    assert f"{ZIPAPP_PACKAGE}/wire.py" in names and f"{ZIPAPP_PACKAGE}/main.py" in names
    assert f"from {ZIPAPP_PACKAGE}.main import main" in main


def test_the_zipapp_is_deterministic_sorted_with_fixed_times_and_modes() -> None:
    """The same source gives the same bytes: built again, byte for byte equal; entries sorted, stamped 1980, 0644."""
    first = agent_zipapp()
    startup.agent_zipapp.cache_clear()
    startup.agent_blob.cache_clear()
    try:
        again = agent_zipapp()
    finally:
        startup.agent_zipapp.cache_clear()
        startup.agent_blob.cache_clear()
    assert again == first
    with zipfile.ZipFile(io.BytesIO(first)) as archive:
        infos = archive.infolist()
    assert [info.filename for info in infos] == sorted(info.filename for info in infos)
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {info.external_attr >> 16 for info in infos} == {0o644}


def test_the_zipapp_is_built_once_per_process() -> None:
    """Rendering many scripts reads and zips the package once: the cached bytes are the same object."""
    assert agent_zipapp() is agent_zipapp()
    assert agent_blob() is agent_blob()


def test_the_modules_in_the_zipapp_are_the_packages_own_code_without_docstrings() -> None:
    """What ships is what is tested: each entry is its source file's code, statement for statement,
    on the same lines; only the docstrings are empty."""
    with zipfile.ZipFile(io.BytesIO(agent_zipapp())) as archive:
        for path in PACKAGE.glob("*.py"):
            shipped = archive.read(f"{ZIPAPP_PACKAGE}/{path.name}").decode()
            source = path.read_text()
            assert shipped.count("\n") == source.count("\n"), path.name
            emptied = ast.dump(docstrings_emptied(ast.parse(shipped)))
            assert ast.dump(docstrings_emptied(ast.parse(source))) == emptied, path.name
            assert all(not line.strip().strip('"') for line in docstrings_of(shipped)), path.name
            lines = [getattr(n, "lineno", None) for n in ast.walk(ast.parse(source))]
            assert lines == [getattr(n, "lineno", None) for n in ast.walk(ast.parse(shipped))], path.name
    total = sum(len(p.read_bytes()) for p in PACKAGE.glob("*.py"))
    assert len(agent_zipapp()) < total * 0.9  # the docstrings were a good part of it


def docstring_constants(tree: ast.Module) -> list[ast.Constant]:
    """The string constant of every module, class and function docstring."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append(first.value)
    return found


def docstrings_of(source: str) -> list[str]:
    return [constant.value for constant in docstring_constants(ast.parse(source))]


def docstrings_emptied(tree: ast.Module) -> ast.Module:
    for constant in docstring_constants(tree):
        constant.value = ""
    return tree


def test_the_script_carries_the_zipapp_compressed_and_base64_encoded() -> None:
    """The agent's heredoc decodes (base64, then bz2) to the zipapp, and is smaller than the zipapp itself."""
    script = render_startup_script(a_job(), SETTINGS)
    found = re.search(f"<<'{AGENT_DELIMITER}'\n(.*?)\n{AGENT_DELIMITER}\n", script, re.DOTALL)
    assert found is not None
    assert bz2.decompress(base64.b64decode(found.group(1))) == agent_zipapp()
    assert len(found.group(1)) < len(agent_zipapp())


def test_base64_text_can_never_hold_the_heredoc_delimiter() -> None:
    """The delimiter has a character base64 never writes, so no agent can cut its heredoc short."""
    assert set(AGENT_DELIMITER) - set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def test_the_startup_script_of_a_job_with_every_option_is_at_most_64_kib() -> None:
    """Secrets, image, setup, code digest, limits, retry rules, slices, pool: the metadata value stays small
    (env values are not in it: they come with the attempt's key)."""
    job = a_job_with_every_option()
    script = render_startup_script(job, SETTINGS)
    config = startup.agent_config(job, SETTINGS)
    assert config["secrets"] and config["image"] and config["setup"] and config["retry_output"]
    assert config["code_sha256"] and config["time_limit_seconds"] and config["resume"] is True
    assert len(script.encode("utf-8")) <= MAX_SCRIPT_BYTES, len(script.encode("utf-8"))


def test_the_startup_script_of_a_pool_unit_is_at_most_64_kib() -> None:
    """A warm pool unit's nodes boot the same zipapp in pool mode."""
    shape = a_job(**EVERY_OPTION).spec
    script = render_unit_startup_script("warm-v4", 7, "pool-warm-v4-u7", shape, SETTINGS)
    assert len(script.encode("utf-8")) <= MAX_SCRIPT_BYTES


def test_the_deployed_bundle_builds_the_same_zipapp(tmp_path: Path) -> None:
    """The functions run from tools/bundle.py's folder: the agent is found there and zips to the same bytes."""
    subprocess.run([sys.executable, str(ROOT / "tools" / "bundle.py"), "--out", str(tmp_path)], check=True)
    bundle = tmp_path / "function"
    probe = (
        f"import hashlib, sys; sys.path.insert(0, {str(bundle)!r})\n"
        "import tpujobs\n"
        "from tpujobs.engine.startup_script import agent_zipapp\n"
        "print(tpujobs.__file__)\n"
        "print(hashlib.sha256(agent_zipapp()).hexdigest())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    where, digest = done.stdout.split()
    assert Path(where).resolve().is_relative_to(bundle.resolve())
    assert digest == hashlib.sha256(agent_zipapp()).hexdigest()


def test_the_zipapp_runs_with_python3_and_says_how_to_use_it(tmp_path: Path) -> None:
    """`python3 agent.pyz` with no config is the agent's own usage line and exit code 2, from the zip alone."""
    (tmp_path / "agent.pyz").write_bytes(agent_zipapp())
    done = subprocess.run(
        [sys.executable, "-I", "agent.pyz"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "usage: python3 agent.pyz CONFIG_JSON" in done.stderr
