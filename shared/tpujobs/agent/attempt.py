"""One attempt on one worker host, start to end: secrets, code, setup and command, reports, and
the stops (preemption notice, withdrawal, time limit).

`Agent` is small: it owns its parts and passes each what it needs. The job's steps are
`job_run.JobRun`'s, its processes `commands.CommandRunner`'s, its heartbeats
`liveness.Liveness`'s, its stops `stops.Stops`'s, and its reports go through `reports.Reporter`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .basics import AGENT_FAILED, AGENT_STARTED_AGAIN, Refused, log, rfc3339, safe_name
from .boot_record import AttemptRecord, boot_id, process_start, started_again_detail
from .cloud_logging import build_sink
from .commands import CommandRunner
from .confine import Confinement
from .containers import Docker, ImageProblem
from .job_run import JobRun
from .last_output import LastOutput, last_lines, match_retry_output
from .liveness import Liveness
from .notices import watch_host_notices
from .output import LogShipper
from .reports import Preemption, Reporter
from .rest import GoogleApi, Metadata, Publisher, SecretReader, Storage, TokenSource, split_gs_uri
from .stops import Stops
from .wire import MAX_DETAIL_CHARS, MAX_RETRY_LINE_CHARS


class Agent:
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
        self.config = config
        self.metadata = metadata
        self.worker_id = worker_id
        self.slice_id = slice_id
        self.workdir = workdir
        self.environ = environ
        tokens = tokens or TokenSource(metadata)
        secret_reader = secret_reader or SecretReader(GoogleApi.secrets_from_env(environ, tokens), metadata)
        docker = docker if docker is not None or not config.get("image") else Docker.find(environ, tokens)
        identity = {
            "job_id": config["job_id"],
            "attempt": config["attempt"],
            "slice_id": slice_id,
            "worker_id": worker_id,
        }
        self.reporter = Reporter(publisher, config["worker_events_topic"], identity)
        # The notice's stop is the stops' (made below): the Agent passes it on.
        self.preemption = Preemption(publisher, config["preemption_topic"], identity, self._stop_for_preemption)
        self.withdrawn = threading.Event()  # pool mode: the unit was given other work (`withdraw`)
        bucket, log_prefix = split_gs_uri(config["log_prefix"])
        if log_prefix and not log_prefix.endswith("/"):
            log_prefix += "/"
        chunk_prefix = f"{log_prefix}chunks/slice-{slice_id}-worker-{worker_id}/"
        mirror = build_sink(config, metadata, environ, tokens, publisher, slice_id, worker_id)  # Cloud Logging, if on
        self.shipper = LogShipper(storage, bucket, chunk_prefix, config["chunk_seconds"], echo, mirror=mirror)
        self.last_output = LastOutput()  # setup's and the command's, for a failed `exited`
        self.stop_watching = threading.Event()
        self.record = AttemptRecord.beside(workdir, config, slice_id, worker_id)
        self.boot = boot_id()
        self.started_again = False  # this attempt had started on this host before: nothing ran
        stop_events = (self.preemption.noticed, self.withdrawn)
        self.liveness = Liveness(config, identity, self.reporter, self.note, stop_events, publisher.key, metadata)
        self.runner = CommandRunner(
            grace=float(config["grace_seconds"]),
            docker=docker,
            shipper=self.shipper,
            last_output=self.last_output,
            liveness=self.liveness,
            record=self.record,
            boot=self.boot,
            stopping=lambda: self.stops.stopping(),  # the stops' word, asked as each process starts
            preempted=self.preemption.noticed,
            note=self.note,
        )
        self.stops = Stops(config, self.preemption, self.withdrawn, self.runner, self.reporter, self.shipper, self.note)
        self.job = JobRun(
            config,
            slice_id=slice_id,
            worker_id=worker_id,
            workdir=workdir,
            environ=environ,
            megascale=dict(megascale or {}),
            storage=storage,
            secret_reader=secret_reader,
            runner=self.runner,
            stops=stop_events,
            note=self.note,
        )

    @property
    def confinement(self) -> Confinement | None:
        """The attempt's user and cgroup, once its commands may start (pool mode cleans them up)."""
        return self.runner.confinement

    def note(self, message: str) -> None:
        """A line for the agent's stderr and for the job's output."""
        log(message)
        self.shipper.write(f"[tpujobs-agent] {message}\n".encode("utf-8", "replace"))

    def _stop_for_preemption(self, reason: str) -> None:
        self.stops.for_preemption(reason)

    def withdraw(self, reason: str) -> bool:
        """Pool mode: the unit was given other work (or none); see `Stops.withdraw`."""
        return self.stops.withdraw(reason)

    def kill_now(self) -> int:
        """Pool mode: every process of the attempt killed at once (withdrawn for another job,
        whose assignment the job could read); how many."""
        return self.runner.kill_now()

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
        self.stops.watch_deadline(self.stop_watching)
        self.liveness.join_slice()  # before the command: worker 0 may speak for it from its `started`
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
        self.stops.finish()  # a notice now has nothing to stop or silence
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
        """The job's steps (`JobRun.run`) with the attempt's user and cgroup (`confine.py`); at its end,
        before any report says it ended, every process of the attempt is killed and the user
        deleted, so nothing of it runs when the host is given to another job."""
        tag = safe_name(f"{self.config['job_id']}-a{self.config['attempt']}-s{self.slice_id}-w{self.worker_id}")
        confinement = Confinement.for_attempt(self.environ, tag, os.path.join(self.workdir, "home"))
        self.runner.confine(confinement)
        try:
            return self.job.run(confinement)
        finally:
            killed = confinement.end()
            if killed:
                self.note(f"{killed} leftover process{'es' if killed != 1 else ''} killed")

    def _finish(self, code: int, aborted: str | None = None, detail: str | None = None) -> int:
        """The last report: `exited` with the code (`detail`: the agent ended it), `aborted` with why
        nothing ran, or after a preemption notice only `stopped`; nothing after a withdrawal."""
        self.stop_watching.set()
        withdrawn, preempted = self.stops.finish()  # preempted or withdrawn: either way, no end is told
        limit = self.stops.limit
        failed = (
            failed_output(self.config, self.last_output, self.job.secret_values, self.note)
            if not preempted and aborted is None and code != 0
            else {}
        )
        started_at = self.liveness.started_at
        if started_at is not None:  # an exit handled before its `started` still counts the time
            failed = {**failed, "command_started_at": started_at}
        if limit is not None and aborted is None:  # the agent stopped it: the limit, not an error
            detail = f"time limit reached: the job's {limit} ran out and the agent stopped the command"
            failed = {**failed, "limit": limit}
        self.shipper.close(None if preempted else code)
        if not preempted and aborted is not None:
            self.reporter.report("aborted", detail=aborted[:MAX_DETAIL_CHARS])
        elif not preempted and detail is not None:
            self.reporter.report("exited", exit_code=code, detail=detail[:MAX_DETAIL_CHARS], **failed)
        elif not preempted:
            speaking = self.liveness.still_speaking(code, limited=limit is not None)
            self.reporter.report("exited", exit_code=code, **failed, **speaking)
        elif not withdrawn:  # after its notice: the command is done, its save landed
            self.reporter.report("stopped", exit_code=code)
        self.liveness.leave_slice(speaks=not preempted and aborted is None and code == 0 and limit is None)
        self.reporter.close()
        self.preemption.wait(30.0)
        ended = (
            "withdrawn" if withdrawn else "preempted" if preempted else "aborted" if aborted is not None else "exited"
        )
        self.record.update(ended=ended, exit_code=code, ended_at=rfc3339())  # and said so
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
