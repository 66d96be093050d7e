"""Hostile text in every spec field that reaches the startup script runs no shell command of its own.

test_startup_script.py runs a fixed list of hostile values through the whole agent; here
hypothesis builds them from shell pieces (quotes, `$(...)`, backticks, `;`, newlines,
backslashes, the heredoc delimiters on lines of their own) and puts them in command, setup,
env values, the path of code_uri, and the pattern-bound fields (labels, owner,
runtime_version, reservation). Specs the door refuses are skipped: what matters is what a
valid spec can do. The script then runs under bash with PATH starting at a fake `python3`
that decodes the config as the real one would, records its argv and the config the agent
would get, and exits 0: the agent itself never runs, this is about the shell script alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import (
    MAX_COMMAND_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_SPEC_BYTES,
    OWNER_PATTERN,
    RESERVATION_PATTERN,
    RUNTIME_PATTERN,
    SpecError,
    decode_spec,
    parse_spec,
)
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import DECODE, UNPACK, agent_config, agent_zipapp, render_startup_script

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

SETTINGS = Settings(project="proj-1", prefix="t-", logs_bucket="logs-bucket")
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
MAX_METADATA_VALUE_BYTES = 256 * 1024  # GCE's limit on one metadata value, the startup-script

# Pieces of shell syntax; {mark} becomes an absolute marker path in the example's tmp dir.
PIECES = [
    "'",
    '"',
    "\\",
    "\\'",
    '\\"',
    "`",
    "$",
    "(",
    ")",
    "{",
    "}",
    ";",
    "&",
    "|",
    "<",
    ">",
    "!",
    "#",
    "*",
    "~",
    "\n",
    "\r",
    "\t",
    " ",
    "\x01",
    "\x7f",
    "é",
    "\u202e",
    "\U0001f600",
    "\ufeff",
    "$(touch {mark})",
    "`touch {mark}`",
    "; touch {mark};",
    "&& touch {mark}",
    "| touch {mark}",
    "\ntouch {mark}\n",
    "> {mark}",
    "${PATH:+$(touch {mark})}",
    "$'\\x41'",
    "$((1+1))",
    "${IFS}",
    "x'; touch {mark}; '",
    '"; touch {mark}; "',
    "'\"'\"'$(touch {mark})'\"'\"'",
    "\nTPUJOBS_AGENT_EOF\n",
    "\nTPUJOBS_CONFIG_EOF\n",
    "TPUJOBS_CONFIG_EOF\ntouch {mark}\n",
    "\nTPUJOBS_CONFIG_EOF\ntouch {mark}\nTPUJOBS_AGENT_EOF\ntouch {mark}\n",
    "<<'EOF'\ntouch {mark}\nEOF\n",
    "\\\ntouch {mark}",
    "touch pwned-relative",
    "-c",
    "--",
    "%s%n",
]
hostile = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(st.characters(exclude_characters="\x00"), max_size=6)),
    min_size=1,
    max_size=10,
).map("".join)
no_control = hostile.map(lambda text: "".join(c for c in text if c >= " " and c != "\x7f"))
env_names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,6}\Z").filter(lambda name: not name.startswith("TPUJOBS_"))

spec_fields = st.fixed_dictionaries(
    {
        "command": hostile,
        "env": st.dictionaries(env_names, hostile, min_size=1, max_size=3),
        "owner": st.from_regex(OWNER_PATTERN, fullmatch=True),
        "runtime_version": st.from_regex(RUNTIME_PATTERN, fullmatch=True),
        "labels": st.dictionaries(
            st.from_regex(r"\A[a-z][a-z0-9_-]{0,8}\Z").filter(lambda key: not key.startswith("tpujobs")),
            st.from_regex(r"\A[a-z0-9_-]{0,63}\Z"),
            max_size=3,
        ),
    },
    optional={
        "setup": hostile,
        "code_uri": no_control.map(lambda path: f"gs://code-bucket/{path}"),
        "reservation": st.from_regex(RESERVATION_PATTERN, fullmatch=True),
    },
)


def a_job(fields: dict[str, Any], mark: str) -> Job:
    """The job new_job makes of a spec with these fields ({mark} filled in), or reject() if invalid."""
    filled = json.loads(json.dumps(fields).replace("{mark}", mark))
    data = {"job_id": "hostile-1", "name": "hostile", "accelerator_type": "v4-8", **filled}
    if "reservation" in data:
        data["capacity"] = "reserved"
    try:
        spec = parse_spec(data)
    except SpecError:
        reject()
    job, _ = new_job(spec, "us-central2-b", NOW)
    return job


FAKE_PYTHON = """#!{bash}
# Records its argv (count, then each argument, NUL-terminated), decodes like python3 -c would,
# and, instead of running the agent, keeps the config it was given.
{{ printf '%s\\0' "$#"; printf '%s\\0' "$@"; }} >> '{record}/argv'
if [ "$1" = "-c" ]; then exec '{python}' -I -S "$@"; fi
if [ "$1" = "agent.pyz" ]; then cp "$2" '{record}/config.json'; fi
exit 0
"""


def calls(record: Path) -> list[list[str]]:
    """The argv of every call of the fake python3, in order."""
    words = (record / "argv").read_bytes().decode("utf-8").split("\0")[:-1]
    out: list[list[str]] = []
    while words:
        count = int(words.pop(0))
        out.append(words[:count])
        del words[:count]
    return out


def run_script(script: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Run the startup script with bash and the fake python3 first on PATH; (result, workdir, record)."""
    bindir, record, workdir, home = tmp / "bin", tmp / "record", tmp / "work", tmp / "home"
    for folder in (bindir, record, home):
        folder.mkdir()
    fake = bindir / "python3"
    fake.write_text(FAKE_PYTHON.format(bash=BASH, record=record, python=sys.executable))
    fake.chmod(0o755)
    path = tmp / "startup.sh"
    path.write_text(script)
    env = {
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "TPUJOBS_WORKDIR": str(workdir),
    }
    result = subprocess.run(
        [BASH or "bash", str(path)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result, workdir, record


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(fields=spec_fields)
@example(
    fields={
        "command": "x'; touch {mark}; '",
        "setup": "\nTPUJOBS_CONFIG_EOF\ntouch {mark}\nTPUJOBS_AGENT_EOF\ntouch {mark}\n",
        "env": {"A": "$(touch {mark})", "B": "`touch {mark}`", "C": '"; touch {mark}; "'},
        "code_uri": "gs://code-bucket/$(touch {mark});`touch {mark}`'\"\\",
        "owner": "a",
        "runtime_version": "a",
        "labels": {"team": "x"},
    }
)
def test_hostile_spec_values_run_no_command_and_reach_the_agent_exactly(
    fields: dict[str, Any],
) -> None:
    """bash runs only python3 -c UNPACK, -c DECODE and python3 agent.pyz config.json; the spec's config, exactly."""
    with tempfile.TemporaryDirectory(prefix="tpujobs-inject-") as name:
        tmp = Path(name)
        mark = str(tmp / "pwned-absolute")
        job = a_job(fields, mark)
        result, workdir, record = run_script(render_startup_script(job, SETTINGS), tmp)

        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert result.stdout == f"tpujobs: starting the worker agent in {workdir}\n"
        assert calls(record) == [["-c", UNPACK], ["-c", DECODE], ["agent.pyz", "config.json"]]

        made = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
        assert [p for p in made if "pwned" in p] == []
        assert made == sorted(
            [
                "bin",
                "bin/python3",
                "home",
                "record",
                "record/argv",
                "record/config.json",
                "startup.sh",
                "work",
                "work/agent.pyz",
                "work/config.json",
            ]
        )
        assert (workdir / "agent.pyz").read_bytes() == agent_zipapp()

        received = json.loads((record / "config.json").read_bytes())
        spec = job.spec
        assert received == agent_config(job, SETTINGS)
        assert (received["command"], received["setup"], received["code_uri"]) == (
            spec.command,
            spec.setup,
            spec.code_uri,
        )
        assert "env" not in received  # env values come with the attempt's key, never in metadata
        assert "hostile-1" in received["queued_resource"] and received["attempt"] == 1


def test_the_fake_python_sees_a_marker_command_if_the_script_ever_ran_one() -> None:
    """The harness itself: a script that does run `touch` leaves the marker the property looks for."""
    with tempfile.TemporaryDirectory(prefix="tpujobs-inject-") as name:
        tmp = Path(name)
        script = f"#!/bin/bash\ntouch {tmp}/pwned-absolute\npython3 -c 'print(1)'\n"
        result, _, record = run_script(script, tmp)
        assert result.returncode == 0 and result.stdout == "1\n"
        assert (tmp / "pwned-absolute").exists()
        assert calls(record) == [["-c", "print(1)"]]


# --- size: a spec the door accepts must give a script a TPU VM accepts ---------------------------

BASE = {"job_id": "big-1", "name": "big", "owner": "ada", "accelerator_type": "v4-8"}


def largest_spec(char: str) -> bytes:
    """A spec under MAX_SPEC_BYTES as full of `char` as the limits allow: command, setup, env values."""
    data: dict[str, Any] = {**BASE, "command": "", "setup": "", "env": {}}

    def size() -> int:
        return len(json.dumps(data, ensure_ascii=False).encode("utf-8"))

    width = len(json.dumps(char, ensure_ascii=False).encode("utf-8")) - 2
    for field, limit in (("command", MAX_COMMAND_CHARS), ("setup", MAX_COMMAND_CHARS)):
        room = (MAX_SPEC_BYTES - size() - 64) // width
        data[field] = char * max(1, min(limit, room))
    for i in range(64):
        room = (MAX_SPEC_BYTES - size() - 64) // width
        if room < 1:
            break
        data["env"][f"V{i}"] = char * min(MAX_ENV_VALUE_CHARS, room)
    return json.dumps(data, ensure_ascii=False).encode("utf-8")


@settings(max_examples=40, deadline=None)
@given(char=st.characters(exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")))
@example(char="x")
@example(char="é")
@example(char="\U0001f600")
def test_any_spec_the_door_accepts_renders_a_script_that_fits_in_a_metadata_value(
    char: str,
) -> None:
    """A spec of at most 64 KiB must give a startup-script of at most 256 KiB, whatever its characters.

    The config travels as base64 of json.dumps with ensure_ascii: one 4-byte UTF-8 character
    becomes a 12-byte surrogate-pair escape, then 16 bytes of base64, so a spec of emoji or
    accented letters grows about fourfold and the TPU API would refuse the node's metadata.
    """
    raw = largest_spec(char)
    assert len(raw) <= MAX_SPEC_BYTES
    spec = decode_spec(raw)
    job, _ = new_job(spec, "us-central2-b", NOW)
    size = len(render_startup_script(job, SETTINGS).encode("utf-8"))
    assert size <= MAX_METADATA_VALUE_BYTES, f"{len(raw)} bytes of spec gave a {size}-byte startup script"
