"""Pool mode: the long-lived agent of a warm pool unit's host. It waits on the node metadata's
`tpujobs-assignment` and runs each assigned attempt with `attempt.Agent`, one at a time, each in
a fresh directory; after each, whatever the job left is killed and its directory deleted.
Before any job runs, it keeps the unit's secret (`unit_secret.py`) and registers its hash, and
every key it asks for proves it: a job's leftover process, which can read the next assignment,
cannot get the next job's key.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import shutil
import signal
import threading
from typing import Any

from .assignment_seq import HighestSeq
from .attempt import Agent
from .attempt_key import fetch_attempt_key
from .basics import AGENT_CANNOT_START, AGENT_FAILED, AgentError, log, safe_name
from .boot_record import AttemptRecord, boot_id, still_running
from .config import check_config, check_image, check_required, check_timings, read_json_object
from .confine import stop_recorded
from .containers import Docker, ImageProblem
from .megascale import key_with_slices
from .notices import watch_metadata
from .processes import kill_descendants, signal_group
from .reports import Reporter
from .rest import GoogleApi, Metadata, Publisher, SecretReader, Storage, TokenSource
from .unit_secret import UnitSecret
from .wire import MAX_DETAIL_CHARS

ASSIGNMENT_METADATA = "instance/attributes/tpujobs-assignment"
POOL_REQUIRED = {
    "mode": str,
    "pool": str,
    "unit": int,
    "queued_resource": str,
    "project": str,
    "num_slices": int,
    "hosts_per_slice": int,
    "worker_events_topic": str,
    "preemption_topic": str,
}

# What the pool agent does with an assignment (the parsed `tpujobs-assignment`), while idle or
# while one job runs: the one table of its behaviour.
#   stale (seq below the highest acted on, kept across boots)     ignored, logged
#   unusable                                                       ignored, logged
#   idle ({"seq": N}) while idle                                   nothing
#   idle while a job runs                                          the job is withdrawn
#   the running job's (job_id, attempt) again                      nothing: it keeps running
#   another job while idle                                         it starts (unless it already ran in this boot)
#   another job while one runs                                     the running one is withdrawn, then it starts
# A job withdrawn for another job is killed at once, with no grace: the next assignment is
# readable on the host. After each job (ended, withdrawn, or not run again after a reboot),
# everything in its cgroup or of its user, and every process still descended from the pool
# agent, is killed, the user deleted and the job's work directory deleted; only then is the
# next assignment's key fetched.


def load_pool_config(path: str) -> dict[str, Any]:
    """The pool-mode config written by a unit's startup script, checked, with defaults filled in."""
    config = read_json_object(path)
    check_required(config, POOL_REQUIRED)
    if config["mode"] != "pool":
        raise AgentError(f"config key 'mode' must be 'pool', got {config['mode'][:20]!r}")
    check_image(config)
    check_timings(config, pool=True)
    return config


def parse_assignment(text: str) -> dict[str, Any]:
    """A `tpujobs-assignment` value: {"seq": N} (idle), or with job_id, attempt and config (the
    attempt's; its key is fetched with the VM's identity token). AgentError with a sentence naming
    the field."""
    try:
        data = json.loads(text)
    except ValueError:
        raise AgentError("the assignment is not JSON") from None
    if not isinstance(data, dict):
        raise AgentError("the assignment is not a JSON object")
    seq = data.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise AgentError("the assignment's 'seq' must be a whole number, 0 or more")
    if data.get("job_id") is None:
        return {"seq": seq}
    job_id, attempt, config = data.get("job_id"), data.get("attempt"), data.get("config")
    if not isinstance(job_id, str) or not job_id:
        raise AgentError(f"assignment seq {seq}: 'job_id' must be a non-empty string")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise AgentError(f"assignment seq {seq}: 'attempt' must be a whole number, 1 or more")
    if not isinstance(config, dict):
        raise AgentError(f"assignment seq {seq}: 'config' must be a JSON object")
    if config.get("job_id") != job_id or config.get("attempt") != attempt:
        raise AgentError(f"assignment seq {seq}: 'config' is for another job or attempt than 'job_id' and 'attempt'")
    return data


class PoolJob:
    """One attempt the pool agent runs: its Agent, where, and the thread running it."""

    def __init__(self, seq: int, key: tuple[str, int], agent: Agent) -> None:
        self.seq = seq
        self.key = key  # (job_id, attempt)
        self.agent = agent
        self.workdir = agent.workdir  # deleted after the job; its record beside it is kept
        self.code: int | None = None

    def name(self) -> str:
        return f"job {self.key[0]} attempt {self.key[1]}"


class PoolAgent:
    """The long-lived agent of one host of a warm pool's unit (see the table above)."""

    def __init__(
        self,
        config: dict[str, Any],
        worker_id: int,
        slice_id: int,
        metadata: Metadata,
        pubsub: GoogleApi,
        storage: Storage,
        workdir: str,
        environ: dict[str, str],
        echo: Any = None,
        secret_reader: SecretReader | None = None,
        tokens: TokenSource | None = None,
        megascale: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.slice_id = slice_id
        self.metadata = metadata
        self.pubsub = pubsub
        self.storage = storage
        self.workdir = workdir
        self.environ = environ
        self.echo = echo
        self.tokens = tokens or TokenSource(metadata)
        self.secret_reader = secret_reader or SecretReader(GoogleApi.secrets_from_env(environ, self.tokens), metadata)
        self.megascale = dict(megascale or {})
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stop_watching = threading.Event()
        self._lock = threading.Lock()
        self.running: PoolJob | None = None
        self.terminating = False  # SIGTERM: no new job; the agent ends once none runs
        self.kept_seq = HighestSeq.beside(workdir, slice_id, worker_id)
        self.highest_seq = self.kept_seq.read()  # an older assignment never runs, even after a reboot
        self.pending: dict[str, Any] | None = None  # what runs once the withdrawn job is gone
        self.handled: set[tuple[str, int]] = set()  # attempts started in this boot
        self._last_text: str | None = None
        self.unit_secret: UnitSecret | None = None  # made (or read again) before any job runs

    def prepull(self) -> None:
        """The pool's image, pulled once as its policy says, so the first job starts warm; a
        failure is only logged (the job's own pull says why, in its report)."""
        image = self.config.get("image")
        if not image:
            return
        docker = Docker.find(self.environ, self.tokens)
        if docker is None:
            log(f"the pool's image {image} is not pulled ahead: this host has no docker CLI")
            return
        try:
            pulled = docker.ensure(image, self.config["image_pull_policy"], threading.Event())
            log(f"the pool's image {image} is {'pulled' if pulled else 'already here'}")
        except ImageProblem as problem:
            log(f"the pool's image is not pulled ahead: {problem}")

    def on_sigterm(self, reason: str) -> None:
        """SIGTERM (the VM is stopping): the running job's Agent sends its preemption notice,
        under its own key; with none running nothing is sent. No job starts after it."""
        with self._lock:
            self.terminating = True
            running = self.running
        if running is not None:
            running.agent.preemption.trigger(reason)
        self.events.put(("sigterm", reason))

    def run(self) -> int:
        """Waits for assignments and runs them until a SIGTERM finds no job running; 0. Without
        the unit's secret no job's key could be fetched here: AGENT_CANNOT_START."""
        try:
            self.unit_secret = UnitSecret.kept_in(self.workdir)  # before any job runs on this VM
        except (AgentError, OSError) as error:
            log(f"cannot start: the unit's secret cannot be kept: {error}")
            return AGENT_CANNOT_START
        log(
            f"pool {self.config['pool']} unit {self.config['unit']} ({self.config['queued_resource']}): "
            f"slice {self.slice_id} worker {self.worker_id}, waiting for assignments in {self.workdir}"
        )

        def seen(value: str) -> bool:
            self.events.put(("assignment", value))
            return False

        watch_metadata(self.metadata, ASSIGNMENT_METADATA, seen, self.stop_watching)
        try:
            while True:
                kind, value = self.events.get()
                try:
                    if kind == "assignment":
                        self._assigned(value)
                    elif kind == "ended":
                        self._ended(value)
                except Exception as error:  # the unit must outlive any one assignment
                    log(f"the pool agent failed on an {kind} event: {error!r}")
                with self._lock:
                    if self.terminating and self.running is None:
                        log("SIGTERM: no job runs; the pool agent stops")
                        return 0
        finally:
            self.stop_watching.set()

    def _assigned(self, text: str) -> None:
        if text == self._last_text:  # the same value again (a wait that timed out)
            return
        self._last_text = text
        try:
            assignment = parse_assignment(text)
        except AgentError as error:
            log(f"assignment ignored: {error}")
            return
        seq = assignment["seq"]
        if seq < self.highest_seq:
            log(f"assignment seq {seq} ignored: seq {self.highest_seq} was seen already (a late write)")
            return
        if seq > self.highest_seq:
            self.kept_seq.keep(seq)
        self.highest_seq = seq
        key = (assignment["job_id"], assignment["attempt"]) if "job_id" in assignment else None
        running = self.running
        if running is not None:
            if key == running.key:  # written again: it keeps running (or, withdrawn, goes on going)
                if running.agent.withdrawn.is_set():
                    self.pending = None
                return
            self.pending = assignment if key is not None else None
            if running.agent.withdraw(f"assignment seq {seq} replaces it"):
                log(f"{running.name()}: withdrawn, assignment seq {seq} replaces it")
            if key is not None:  # another job's assignment is readable here: no grace
                killed = running.agent.kill_now()
                log(f"{running.name()}: another job is assigned, so its processes are killed at once ({killed})")
            return
        if key is not None:
            self._start(assignment)

    def _start(self, assignment: dict[str, Any]) -> None:
        key = (assignment["job_id"], assignment["attempt"])
        where = f"job {key[0]} attempt {key[1]}"
        if key in self.handled:
            log(f"{where} already ran on this unit in this boot; not run again")
            return
        with self._lock:
            if self.terminating:
                log(f"{where} not started: the pool agent is stopping (SIGTERM)")
                return
        self.handled.add(key)
        secret = self.unit_secret
        assert secret is not None, "run() keeps the unit's secret before any assignment"
        try:
            config_key_url = str(assignment["config"].get("key_url") or "")
            secret.register(self.metadata, config_key_url)  # before the unit's first job's key
            attempt_key, megascale = key_with_slices(
                lambda address: fetch_attempt_key(
                    self.metadata, config_key_url, key[0], key[1], self.slice_id, self.worker_id, address, secret.value
                ),
                self.metadata,
                assignment["config"],
                self.slice_id,
                self.worker_id,
                self.megascale,
            )
        except (AgentError, OSError, http.client.HTTPException) as error:
            log(f"{where} not started: {error}: no report would be believed")
            return
        publisher = Publisher(self.pubsub, str(self.config["project"]), attempt_key.key, attempt_key.names())
        config = dict(assignment["config"])
        config["env"] = dict(attempt_key.env)  # from the key's answer: no env value is in metadata
        if not config.get("image") and self.config.get("image"):
            config["image"] = self.config["image"]  # the pool's, when the job names none
            config["image_pull_policy"] = self.config["image_pull_policy"]
        try:
            config = check_config(config)
        except AgentError as error:
            self._refuse(assignment, publisher, f"the assignment's config is unusable: {error}")
            return
        attempt_dir = os.path.join(self.workdir, "jobs", safe_name(key[0]), f"attempt-{int(key[1])}")
        workdir = os.path.join(attempt_dir, "work")
        record = AttemptRecord.beside(workdir, config, self.slice_id, self.worker_id)
        if not os.path.exists(record.path):  # a first start: whatever is there is not this attempt's
            shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir, exist_ok=True)
        agent = Agent(
            config,
            self.worker_id,
            self.slice_id,
            self.metadata,
            publisher,
            self.storage,
            workdir,
            self.environ,
            echo=self.echo,
            secret_reader=self.secret_reader,
            tokens=self.tokens,
            megascale=megascale,
        )
        job = PoolJob(int(assignment["seq"]), key, agent)
        with self._lock:
            self.running = job
            terminating = self.terminating
        if terminating:  # a SIGTERM came meanwhile: this attempt is lost here, and says so
            agent.preemption.trigger("SIGTERM")
        log(f"{where}: started (assignment seq {job.seq}) in {workdir}")
        threading.Thread(target=self._run_job, args=(job,), name=f"job {key[0]}", daemon=True).start()

    def _run_job(self, job: PoolJob) -> None:
        try:
            job.code = job.agent.run()
        except BaseException as error:  # whatever happened, the unit is cleaned for the next job
            log(f"{job.name()}: the agent failed: {error!r}")
            job.code = AGENT_FAILED
        self.events.put(("ended", job))

    def _refuse(self, assignment: dict[str, Any], publisher: Publisher, sentence: str) -> None:
        """An attempt that cannot even start here: one signed `aborted` with why, so it is not
        left waiting for a `started` that never comes."""
        log(f"job {assignment['job_id']} attempt {assignment['attempt']} not started: {sentence}")
        identity = {
            "job_id": assignment["job_id"],
            "attempt": assignment["attempt"],
            "slice_id": self.slice_id,
            "worker_id": self.worker_id,
        }
        reporter = Reporter(publisher, str(self.config["worker_events_topic"]), identity)
        reporter.report("aborted", detail=sentence[:MAX_DETAIL_CHARS])
        reporter.close()

    def _ended(self, job: PoolJob) -> None:
        """The job's Agent is done: the unit is cleaned, then what was assigned meanwhile starts."""
        with self._lock:
            self.running = None
        confinement = job.agent.confinement
        killed = confinement.end() if confinement is not None else 0  # its cgroup, its user's uid
        killed += kill_descendants(os.getpid())
        if job.agent.started_again:
            self._stop_earlier_start(job)
        shutil.rmtree(job.workdir, ignore_errors=True)
        ended = job.agent.record.read().get("ended")
        if job.agent.started_again:
            how = "not run again (it had started on this unit before)"
        elif ended == "withdrawn":
            how = f"withdrawn with exit code {job.code}"
        else:
            how = f"ended ({ended or 'unrecorded'}) with exit code {job.code}"
        extra = f"; {killed} leftover process{'es' if killed != 1 else ''} killed" if killed else ""
        log(f"{job.name()}: {how}{extra}; its work directory is deleted")
        pending, self.pending = self.pending, None
        if pending is not None:
            self._start(pending)

    def _stop_earlier_start(self, job: PoolJob) -> None:
        """After the pool agent itself was restarted (not the VM), what an earlier start of the
        attempt left running on this unit (its command's group, its container) is stopped too:
        the next job gets the unit clean."""
        running = job.agent.record.read().get("running")
        if isinstance(running, dict) and running.get("boot") == boot_id():
            killed = stop_recorded(running)  # its cgroup and user: a setsid daemon outlives the group
            if killed:
                log(f"{job.name()}: {killed} process{'es' if killed != 1 else ''} of its earlier start killed")
        if not isinstance(running, dict) or not still_running(running, boot_id()):
            return
        log(f"{job.name()}: stopping what its earlier start left running (pid {running.get('pid')})")
        signal_group(int(running["pid"]), signal.SIGKILL)
        container = running.get("container")
        docker = Docker.find(self.environ, self.tokens) if isinstance(container, str) else None
        if docker is not None and isinstance(container, str):
            docker.remove(container)
