"""One attempt on one worker host, start to end: secrets, code, setup and command, reports, and
the stops (preemption notice, withdrawal, time limit). Its processes are `commands.CommandRunner`'s,
its heartbeats `liveness.Liveness`'s.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import AGENT_FAILED, AGENT_STARTED_AGAIN, AgentError, Refused, log, rfc3339, safe_name
from .boot_record import AttemptRecord, boot_id, process_start, started_again_detail
from .cloud_logging import build_sink
from .code_fetch import fetch_code
from .commands import CommandRunner
from .config import attempt_deadline, job_environment
from .confine import Confinement
from .containers import (
    Docker,
    ImageProblem,
)
from .last_output import LastOutput, last_lines, match_retry_output
from .notices import watch_host_notices
from .output import LogShipper
from .reports import Preemption, Reporter
from .rest import GoogleApi, Metadata, Publisher, SecretReader, Storage, TokenSource, split_gs_uri
from .slice_link import SliceLink, heartbeat_period
from .wire import MAX_DETAIL_CHARS, MAX_RETRY_LINE_CHARS

# The last upload ends this long before a preempted VM is switched off (at most half of what the
# window leaves after the SIGKILL).
FLUSH_MARGIN_SECONDS = 2.0


class Agent(CommandRunner):
    """One attempt on one worker host: fetch, setup, command, reports, preemption."""

    def __init__(
        self,
        config: dict[str, Any],
        worker_id: int,
        slice_id: int,
        metadata: Metadata,
        publisher: Publisher,
        storage: Storage,
        workdir: str,
        environ: dict[str, str],
        echo: Any = None,
        secret_reader: SecretReader | None = None,
        tokens: TokenSource | None = None,
        megascale: dict[str, str] | None = None,
        docker: Docker | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._current: subprocess.Popen[bytes] | None = None
        self._container: str | None = None  # the running container's name, in an image
        self._kill_at: float | None = None  # when the stopped command gets SIGKILL (time.monotonic())
        self._term_delivered = False  # the container got its SIGTERM (docker kill succeeded)
        self._started = False
        self._started_at: str | None = None  # when the first of setup or command started (RFC 3339)
        self._finished = False
        self.confinement: Confinement | None = None  # made as the attempt's commands are about to run
        self.config = config
        self.metadata = metadata
        self.worker_id = worker_id
        self.slice_id = slice_id
        self.storage = storage
        self.workdir = workdir
        self.environ = environ
        tokens = tokens or TokenSource(metadata)
        self.secret_reader = secret_reader or SecretReader(GoogleApi.secrets_from_env(environ, tokens), metadata)
        self.megascale = dict(megascale or {})
        self.docker = docker if docker is not None or not config.get("image") else Docker.find(environ, tokens)
        self.grace = float(config["grace_seconds"])
        # From a preemption notice to SIGKILL: never longer than a stop of the agent's own (`grace`).
        self.preemption_grace = min(self.grace, float(config["preemption_grace_seconds"]))
        self.preemption_window = float(config["preemption_window_seconds"])  # from the notice to the VM's end
        identity = {
            "job_id": config["job_id"],
            "attempt": config["attempt"],
            "slice_id": slice_id,
            "worker_id": worker_id,
        }
        self.reporter = Reporter(publisher, config["worker_events_topic"], identity)
        self.preemption = Preemption(publisher, config["preemption_topic"], identity, self._stop_for_preemption)
        bucket, log_prefix = split_gs_uri(config["log_prefix"])
        if log_prefix and not log_prefix.endswith("/"):
            log_prefix += "/"
        self.chunk_prefix = f"{log_prefix}chunks/slice-{slice_id}-worker-{worker_id}/"
        mirror = build_sink(config, metadata, environ, tokens, publisher, slice_id, worker_id)  # Cloud Logging, if on
        self.shipper = LogShipper(storage, bucket, self.chunk_prefix, config["chunk_seconds"], echo, mirror=mirror)
        self.last_output = LastOutput()  # setup's and the command's, for a failed `exited`
        self.secret_values: dict[str, str] = {}  # to cut out of those last lines
        self.stop_watching = threading.Event()
        self.record = AttemptRecord.beside(workdir, config, slice_id, worker_id)
        self.boot = boot_id()
        self._limit: str | None = None  # the time limit that ran out, once the agent acted on it
        self._last_output_at: float | None = None  # when the command last printed a line
        self.withdrawn = threading.Event()  # pool mode: the unit was given other work (`withdraw`)
        self.started_again = False  # this attempt had started on this host before: nothing ran
        self.stop_beating = threading.Event()  # heartbeats end (worker 0 may outlive its command)
        self._period = heartbeat_period(0.0, config)  # seconds to the next heartbeat, as the last one said
        self.link: SliceLink | None = None  # a host of a multi-host slice: its slice's network
        if int(config["hosts_per_slice"]) > 1:
            self.link = SliceLink(
                publisher.key, identity, config, metadata, self._progress, self._peer_silent,
                self._watched, self._peer_checkpoint,
            )  # fmt: skip
        self._watched_said = False  # a peer told the service that worker 0 speaks for it
        self._checkpoint_at: tuple[int, float] | None = None  # this host's last checkpoint (step, epoch s)
        self._checkpoint_told = -1  # worker 0: the highest checkpoint step it published

    def note(self, message: str) -> None:
        """A line for the agent's stderr and for the job's output."""
        log(message)
        self.shipper.write(f"[tpujobs-agent] {message}\n".encode("utf-8", "replace"))

    def _stop_for_preemption(self, reason: str) -> None:
        """The VM is switched off `preemption_window` s after the notice (already sent), and what
        the command printed by then is lost unless shipped: SIGTERM now, SIGKILL
        `preemption_grace` s after the notice, output shipped often meanwhile, and the last of it
        flushed before the window ends."""
        noticed = self.preemption.noticed_at or time.monotonic()
        told = self.preemption.told  # else tpujobs stopped it (a reclaim): no VM switch-off, its own grace
        grace, window = (self.preemption_grace, self.preemption_window) if told else (self.grace, self.grace + 10)
        with self._lock:
            if self._finished:  # the command's end is known and reported: keep it
                log(f"preemption notice ({reason}) after the command ended")
                return
            self.reporter.silence()
            container = self._sigterm_locked(noticed + grace)
        self.shipper.hurry(noticed + window - min(FLUSH_MARGIN_SECONDS, (window - grace) / 2))
        self.note(
            f"{'preemption notice' if told else 'stop'} ({reason}): stopping the command, SIGKILL {grace:g} s "
            f"after the notice, output flushed within {window:g} s"
        )
        self._sigterm_container(container)

    def withdraw(self, reason: str) -> bool:
        """Pool mode: the control plane gave the unit other work (or none), so this attempt stops
        as a preemption would stop it (SIGTERM, SIGKILL after the grace) but says nothing more:
        no notice, no `exited`, not even a checkpoint, since the job has already moved on. An end
        already known, or a preemption notice already sent, stands as it is (False)."""
        with self._lock:
            if self._finished or not self.preemption.stand_down():
                return False
            self.withdrawn.set()
            self.reporter.silence(everything=True)
            container = self._sigterm_locked()
        self.note(f"withdrawn ({reason}): stopping the command, SIGKILL after {self.grace:g} s")
        self._sigterm_container(container)
        return True

    def kill_now(self) -> int:
        """Pool mode: every process of the attempt killed at once (withdrawn for another job,
        whose assignment the job could read); how many."""
        with self._lock:
            confinement = self.confinement
            if self._current is not None:
                self._kill_at = time.monotonic()  # `_wait` sends SIGKILL now (in a container: docker kill)
        return confinement.kill() if confinement is not None else 0

    def _stopping(self) -> bool:
        """Whether nothing more of the job may start: a notice, a withdrawal or a time limit."""
        return self.preemption.noticed.is_set() or self.withdrawn.is_set() or self._limit is not None

    def run(self) -> int:
        """Everything, start to end; the command's exit code.

        Only at the attempt's first start on this host: a later one (the VM rebooted and ran
        its startup script again) reports the attempt lost and runs nothing.
        """
        try:
            earlier = self.record.claim(self._first_entry())
        except OSError as error:  # without the record a reboot could run the command twice
            self.note(f"cannot record the attempt's start in {self.record.path}: {error}")
            return self._finish(AGENT_FAILED)
        if earlier is not None:
            return self._started_again(earlier)
        watch_host_notices(self.metadata, self.preemption, self.reporter, self.stop_watching)
        self._watch_deadline()
        if self.link is not None:  # before the command: worker 0 may speak for it from its `started`
            self.link.start()
        try:
            code = self._attempt()
        except Refused as refusal:  # no restart can fix it: say so, and run nothing
            self.note(str(refusal))
            return self._finish(AGENT_FAILED, aborted=str(refusal))
        except ImageProblem as problem:  # an error under the job's rules, with the reason
            self.note(str(problem))
            return self._finish(problem.code, detail=str(problem))
        except Exception as error:  # a bug or a full disk must still end in a report
            self.note(f"the agent failed: {error!r}")
            code = AGENT_FAILED
        return self._finish(code)

    def _first_entry(self) -> dict[str, Any]:
        me = os.getpid()
        return {
            "job_id": self.config["job_id"],
            "attempt": self.config["attempt"],
            "slice_id": self.slice_id,
            "worker_id": self.worker_id,
            "agent_started_at": rfc3339(),
            "agent_pid": me,
            "agent_start": process_start(me),
            "boot": self.boot,
        }

    def _started_again(self, earlier: dict[str, Any]) -> int:
        """This attempt already started on this host, so it is lost: whatever ran then was
        killed by the reboot, or still runs and must not get a twin. Says so in one signed
        `rebooted` report (unless the attempt had ended here and said so) and runs nothing;
        the job's output is left as the first start wrote it."""
        with self._lock:
            self._finished = True  # a notice now has nothing to stop or silence
            self.started_again = True
        self.stop_watching.set()
        self.shipper.close(None)  # nothing was written: no chunk, no completion marker
        where = f"attempt {self.config['attempt']} (worker {self.slice_id}-{self.worker_id})"
        if earlier.get("ended") in ("exited", "aborted", "withdrawn"):
            log(f"{where} already ended on this host and said so ({earlier['ended']}); nothing to do")
        else:
            detail = started_again_detail(earlier, self.boot)
            log(f"{where} had already started on this host: {detail}")
            self.reporter.report("rebooted", detail=detail[:MAX_DETAIL_CHARS])
        self.reporter.close()
        self.preemption.wait(30.0)
        return AGENT_STARTED_AGAIN

    def _attempt(self) -> int:
        """`_confined_attempt` with the attempt's user and cgroup (`confine.py`); at its end,
        before any report says it ended, every process of the attempt is killed and the user
        deleted, so nothing of it runs when the host is given to another job."""
        tag = safe_name(f"{self.config['job_id']}-a{self.config['attempt']}-s{self.slice_id}-w{self.worker_id}")
        confinement = Confinement.for_attempt(self.environ, tag, os.path.join(self.workdir, "home"))
        with self._lock:
            self.confinement = confinement
        try:
            return self._confined_attempt(confinement)
        finally:
            killed = confinement.end()
            if killed:
                self.note(f"{killed} leftover process{'es' if killed != 1 else ''} killed")

    def _confined_attempt(self, confinement: Confinement) -> int:
        """Read the secrets, fetch the code, run setup (once per host), run the command; or,
        with an image, setup and command in one container of it (`_contained`).

        Returns their exit code; raises Refused, before anything of the job runs, when a
        secret cannot be read or the code is not what was submitted, and ImageProblem when
        the image cannot be pulled or run.
        """
        code_dir = os.path.join(self.workdir, "code")
        os.makedirs(code_dir, exist_ok=True)
        # The values live only here and in the environment of setup and command.
        secret_values = self.secret_reader.read_all(self.config["secrets"])
        self.secret_values = secret_values
        code = _fetched(self.storage, self.config, code_dir, self.note)
        confinement.hand_over(code_dir)
        env = job_environment(self.environ, self.config, self.worker_id, self.slice_id, secret_values, self.megascale)
        if self.config.get("image"):
            return code or self._contained(self.config["image"], code_dir, env, sorted(secret_values))
        env = confinement.environment(env)
        if code == 0 and self.config.get("setup"):
            stops = (self.preemption.noticed, self.withdrawn)
            code = setup_once(self._run, self.config, self.workdir, code_dir, env, stops)
        if code == 0:
            code = self._run(["bash", "-c", self.config["command"]], code_dir, env, "command")
        return code

    def _watch_deadline(self) -> None:
        """At the attempt's deadline (`attempt_deadline`, from now), stop the command as a
        preemption would: SIGTERM, SIGKILL after the grace; `exited` then names the limit.
        The host stops on time even when the control plane cannot reach it."""
        deadline = attempt_deadline(self.config, time.time())
        if deadline is None:
            return
        at, limit = deadline
        self.note(f"the job's {limit} ends this attempt at {rfc3339(at)}")

        def wait() -> None:
            if not self.stop_watching.wait(max(0.0, at - time.time())):
                self._stop_for_limit(limit)

        threading.Thread(target=wait, name="deadline", daemon=True).start()

    def _stop_for_limit(self, limit: str) -> None:
        with self._lock:
            if self._finished or self.preemption.noticed.is_set() or self.withdrawn.is_set():
                return
            self._limit = limit
            container = self._sigterm_locked()
        self.note(f"the job's {limit} ran out: stopping the command, SIGKILL after {self.grace:g} s")
        self._sigterm_container(container)

    def _finish(self, code: int, aborted: str | None = None, detail: str | None = None) -> int:
        """The last report: `exited` with the code (`detail`: the agent ended it), `aborted` with why
        nothing ran, or after a preemption notice only `stopped`; nothing after a withdrawal."""
        self.stop_watching.set()
        with self._lock:
            self._finished = True
            withdrawn = self.withdrawn.is_set()
            preempted = self.preemption.noticed.is_set() or withdrawn  # either way, no end is told
        failed = (
            failed_output(self.config, self.last_output, self.secret_values, self.note)
            if not preempted and aborted is None and code != 0
            else {}
        )
        if self._started_at is not None:  # an exit handled before its `started` still counts the time
            failed = {**failed, "command_started_at": self._started_at}
        if self._limit is not None and aborted is None:  # the agent stopped it: the limit, not an error
            detail = f"time limit reached: the job's {self._limit} ran out and the agent stopped the command"
            failed = {**failed, "limit": self._limit}
        self.shipper.close(None if preempted else code)
        if not preempted and aborted is not None:
            self.reporter.report("aborted", detail=aborted[:MAX_DETAIL_CHARS])
        elif not preempted and detail is not None:
            self.reporter.report("exited", exit_code=code, detail=detail[:MAX_DETAIL_CHARS], **failed)
        elif not preempted:
            self.reporter.report("exited", exit_code=code, **failed, **self._still_speaking(code))
        elif not withdrawn:  # after its notice: the command is done, its save landed
            self.reporter.report("stopped", exit_code=code)
        self._leave_slice(speaks=not preempted and aborted is None and code == 0 and self._limit is None)
        self.reporter.close()
        self.preemption.wait(30.0)
        ended = (
            "withdrawn" if withdrawn else "preempted" if preempted else "aborted" if aborted is not None else "exited"
        )
        self.record.update(ended=ended, exit_code=code, ended_at=rfc3339())  # and said so
        return code


def setup_once(
    run: Callable[[list[str], str, dict[str, str], str], int],
    config: dict[str, Any],
    workdir: str,
    code_dir: str,
    env: dict[str, str],
    stops: tuple[threading.Event, ...],
) -> int:
    """Setup, unless it already ran on this host for this job: a marker beside the workdir, left
    when it succeeded and none of `stops` (a notice, a withdrawal) is set."""
    marker = os.path.join(os.path.dirname(os.path.abspath(workdir)), f".setup-done-{safe_name(config['job_id'])}")
    if os.path.exists(marker):
        log("setup already ran on this host for this job; skipping it")
        return 0
    code = run(["bash", "-c", config["setup"]], code_dir, env, "setup")
    if code == 0 and not any(stop.is_set() for stop in stops):
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(rfc3339() + "\n")
    elif code != 0:
        log(f"setup exited with {code}; the command does not run")
    return code


def failed_output(
    config: dict[str, Any], output: LastOutput, secret_values: dict[str, str], note: Callable[[str], None]
) -> dict[str, Any]:
    """The last lines, secrets cut out, and the retry_on.output pattern (its index) that matched
    one of them, with that line. The control plane believes the claim for this job only: it can
    change nothing but the job's own retry."""
    lines = last_lines(output.snapshot(), secret_values, output.dropped)
    extra: dict[str, Any] = {"last_lines": lines}
    found = match_retry_output(config["retry_output"], lines)
    if isinstance(found, str):
        note(found)
    elif found is not None:
        extra.update(retry_pattern=found[0], retry_line=found[1][:MAX_RETRY_LINE_CHARS])
    return extra


def _fetched(storage: Storage, config: dict[str, Any], code_dir: str, note: Callable[[str], None]) -> int:
    """The job's code into `code_dir`, if it has any: 0, or AGENT_FAILED when it could not be
    fetched (said); Refused, raised, when it is not what was submitted."""
    if not config.get("code_uri"):
        return 0
    try:
        fetch_code(storage, config["code_uri"], code_dir, config["code_sha256"])
    except Refused:
        raise
    except (AgentError, OSError, http.client.HTTPException, tarfile.TarError) as error:
        note(f"could not fetch the code from {config['code_uri']}: {error}")
        return AGENT_FAILED
    return 0
