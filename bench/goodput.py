"""Goodput of a spot job that checkpoints every 5 minutes and is preempted every hour.

Issue 5, item 7: "a spot job that checkpoints every 5 (simulated) minutes and is preempted
every (simulated) hour; report its goodput; the target is 97% or more."

Time is compressed: one simulated minute is --minute-seconds real seconds (default 1 s, so
a simulated hour is a real minute). Each run submits examples/train (packed and uploaded as
`tpujobs submit` does with code_dir) as a spot v4-8 job with on_preemption resume:
--steps = hours x 60, one step per simulated minute, a checkpoint every 5 steps. The bench
watches the job document and, once the current attempt has held its capacity for 60
simulated minutes (from usage[-1].held_from), preempts its queued resource through the
simulator, as spot capacity is taken back. Two variants run side by side in each repeat:

  periodic  checkpoints every 5 minutes only
  sigterm   also saves a checkpoint on SIGTERM, the preemption notice (train.py --save-on-sigterm)

The arithmetic. A preemption loses the work since the last checkpoint: half the interval
on average at a random phase, 2.5 of every 60 minutes, so goodput ~ 1 - 2.5/60 = 95.8%
(91.7% at worst, 100% when a checkpoint lands just before the preemption). The 97% target
allows 1.8 lost minutes an hour, so periodic checkpoints alone meet it only when the phases
happen to align, or when they come every 3.6 minutes or less: with a 5-minute interval
variant `periodic` cannot meet the target by arithmetic. Here the phase is not even random:
the preemption comes 60 held minutes after the capacity became active, the checkpoints every
5 minutes after the command started, so every preemption falls at the same point of the
interval (about 4 of its 5 minutes lost here: 93.4% measured). Saving on SIGTERM keeps
every completed step; only the step in progress is redone, which meets the target.

What it reports per variant: goodput, chip-hours and lost chip-hours as the job document
holds them (what `tpujobs list` and `describe` show), lost simulated minutes per
preemption, preemptions, wall time; cross-checked against the held time the bench measures
with its own clock (each queued resource ACTIVE in the simulator, until the bench preempts
it or it is released). From each attempt's output it reads the step it resumed from and the
last step it reached, which say how many steps were really redone, and whether a checkpoint
printed after SIGTERM was also counted on the job document (a checkpoint at or after the
attempt's end), and what goodput the document would show had it been.

Measured (README): the SIGTERM checkpoint is saved well within the grace (the next attempt
resumes from it, no step redone, although the old capacity is released right after the
notice), and the agent still reports checkpoints after the notice, so the document counts it.

    .venv/bin/python bench/goodput.py [--hours 3 --repeats 3 --minute-seconds 1.0] [--quick]
    .venv/bin/python bench/goodput.py --drill [--repeats 3]

With --drill it measures instead what `tpujobs drill` reports for each variant (issue 30): the
toy example drilled with the drill's default faults (a preemption with notice, then SIGTERM with
none, each after the attempt's first checkpoint), beside an uninterrupted run; per variant the
median goodput (the accounting's, on the drilled job's document), steps redone, whether it passed.

It starts the local stack in a temporary directory (or uses the running one) and stops
what it started. Exits non-zero if a job did not finish SUCCEEDED.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpujobs.domain.accounting import AttemptUsage, account
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import SUBMIT
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl

OWNER = "bench@example.com"
ACCELERATOR = "v4-8"  # one worker host, 4 chips
CHECKPOINT_MINUTES = 5
PREEMPT_AFTER_MINUTES = 60
TARGET = 0.97
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train"
VARIANTS = {"periodic": "", "sigterm": " --save-on-sigterm"}
POLL_SECONDS = 0.1
SETTLE_SECONDS = 3.0  # after the end: late checkpoint reports and the last log chunks land

RESUMED = re.compile(r"worker 0-0: attempt \d+ (?:resumes from|starts from) step (\d+)")
STEP = re.compile(r"worker 0-0: step (\d+)$")
SIGTERM_CHECKPOINT = re.compile(r"^TPUJOBS_CHECKPOINT step=(\d+) on SIGTERM")  # train.py's


# -- the arithmetic (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """What a job of `hours` of work gets if each preemption loses `lost_minutes`."""

    lost_minutes: float
    preemptions: int
    held_minutes: float
    goodput: float


def expectation(hours: float, lost_minutes: float, preempt_after: float = PREEMPT_AFTER_MINUTES) -> Expectation:
    """Each preempted attempt holds `preempt_after` minutes and keeps all but `lost_minutes`;
    the last attempt does what is left. Start-up time is left out: the accounting counts it
    as held and kept, it only adds attempts at the margin."""
    if not 0 <= lost_minutes < preempt_after:
        raise ValueError("a preemption must lose less than the attempt holds")
    work, done, preemptions = hours * 60.0, 0.0, 0
    while work - done > preempt_after:
        done += preempt_after - lost_minutes
        preemptions += 1
    held = work + preemptions * lost_minutes
    return Expectation(lost_minutes, preemptions, held, 1.0 - preemptions * lost_minutes / held)


def allowed_loss_minutes(target: float = TARGET, preempt_after: float = PREEMPT_AFTER_MINUTES) -> float:
    """The most a preemption may lose for goodput >= target, in steady state (1 - L/T)."""
    return (1.0 - target) * preempt_after


def analytic(hours: float, interval: float = CHECKPOINT_MINUTES) -> dict[str, Expectation]:
    """Periodic checkpoints every `interval` minutes: a random phase loses interval/2."""
    return {
        "aligned (checkpoint just before)": expectation(hours, 0.0),
        f"random phase (interval/2 = {interval / 2:g} min)": expectation(hours, interval / 2),
        f"worst (a whole interval, {interval:g} min)": expectation(hours, interval),
    }


# -- what one run measured ----------------------------------------------------------------


@dataclass(frozen=True)
class AttemptLog:
    """One attempt as worker 0-0's output tells it."""

    attempt: int
    resumed_from: int | None
    last_step: int | None
    sigterm_checkpoint: int | None  # a checkpoint line printed after the SIGTERM


def parse_output(attempt: int, text: str) -> AttemptLog:
    resumed = last = on_term = None
    for line in text.splitlines():
        if m := RESUMED.search(line):
            resumed = int(m.group(1))
        elif m := STEP.search(line):
            last = int(m.group(1))
        elif m := SIGTERM_CHECKPOINT.match(line):
            on_term = int(m.group(1))
    return AttemptLog(attempt, resumed, last, on_term)


@dataclass(frozen=True)
class Result:
    variant: str
    job_id: str
    state: str
    wall_seconds: float
    minute_seconds: float
    chips: int
    totals: dict[str, Any]  # chip_hours, lost_chip_hours, ... straight from the job document
    usage: tuple[AttemptUsage, ...]
    logs: tuple[AttemptLog, ...]
    observed_held_seconds: float  # by the bench's clock

    @property
    def preemptions(self) -> int:
        return sum(u.capacity_lost for u in self.usage)

    @property
    def goodput(self) -> float:
        return float(self.totals.get("goodput") or 0.0)

    def simulated_hours(self, real_hours: float) -> float:
        return real_hours * 60.0 / self.minute_seconds

    @property
    def lost_minutes_per_preemption(self) -> float:
        lost = float(self.totals.get("lost_seconds") or 0.0) / self.minute_seconds
        return lost / self.preemptions if self.preemptions else 0.0

    def redone_steps(self) -> list[int | None]:
        """Per preemption: steps the next attempt did again (last reached - resumed from)."""
        by_attempt = {log.attempt: log for log in self.logs}
        redone: list[int | None] = []
        for u in self.usage:
            if not u.capacity_lost:
                continue
            this, after = by_attempt.get(u.attempt), by_attempt.get(u.attempt + 1)
            if this and after and this.last_step is not None and after.resumed_from is not None:
                redone.append(max(0, this.last_step - after.resumed_from))
            else:
                redone.append(None)
        return redone

    def late_checkpoints_counted(self) -> int:
        """Preempted attempts whose document loses less than one step: their last checkpoint,
        the one saved on SIGTERM, was counted (its agent timestamp may precede the end the
        control plane committed by the notice's own delivery time)."""
        return sum(1 for u in self.usage if u.capacity_lost and u.lost_seconds() < self.minute_seconds)

    def sigterm_checkpoints_printed(self) -> int:
        lost = {u.attempt for u in self.usage if u.capacity_lost}
        return sum(1 for log in self.logs if log.attempt in lost and log.sigterm_checkpoint is not None)

    def kept_work_goodput(self) -> float | None:
        """Goodput counting a preemption as lost only when steps were redone: what the
        document would say had every checkpoint the next attempt resumed from been counted."""
        redone = iter(self.redone_steps())
        usage = []
        for u in self.usage:
            if u.capacity_lost and next(redone) == 0 and u.ended_at is not None:
                u = dataclasses.replace(u, last_checkpoint_at=u.ended_at)
            usage.append(u)
        if not usage or usage[-1].ended_at is None:
            return None
        return account(tuple(usage), usage[-1].ended_at).goodput


@dataclass(frozen=True)
class Summary:
    variant: str
    goodputs: tuple[float, ...]
    median_goodput: float
    kept_work_goodput: float | None
    chip_hours: float  # simulated, median
    lost_chip_hours: float  # simulated, median
    lost_minutes_per_preemption: float  # median
    preemptions: float  # median
    wall_seconds: float  # median
    meets_target: bool


def summarize(variant: str, results: list[Result], target: float = TARGET) -> Summary:
    """Medians over the repeats of one variant."""
    goodputs = tuple(r.goodput for r in results)
    kept = [g for r in results if (g := r.kept_work_goodput()) is not None]
    median = statistics.median(goodputs)
    return Summary(
        variant=variant,
        goodputs=goodputs,
        median_goodput=median,
        kept_work_goodput=statistics.median(kept) if kept else None,
        chip_hours=statistics.median(r.simulated_hours(r.totals["chip_hours"]) for r in results),
        lost_chip_hours=statistics.median(r.simulated_hours(r.totals["lost_chip_hours"]) for r in results),
        lost_minutes_per_preemption=statistics.median(r.lost_minutes_per_preemption for r in results),
        preemptions=statistics.median(r.preemptions for r in results),
        wall_seconds=statistics.median(r.wall_seconds for r in results),
        meets_target=median >= target,
    )


# -- the local stack ------------------------------------------------------------------------


@dataclass
class Seen:
    """One attempt's held time by the bench's clock: its queued resource ACTIVE in the simulator."""

    held: float | None = None
    ended: float | None = None


@dataclass
class Run:
    """One job being driven: submitted, preempted hourly, watched to its end."""

    variant: str
    job_id: str
    submitted: float
    seen: dict[int, Seen] = field(default_factory=dict)
    preempted: set[int] = field(default_factory=set)
    finished: float | None = None
    job: Any = None


class Bench:
    def __init__(self, settings: Settings, env: dict[str, str], args: argparse.Namespace) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher
        from tpujobs.adapters.storage import build_client
        from tpujobs.cli.code_upload import upload_code_dir

        self.args = args
        self.db = firestore.Client(project=settings.project)
        self.store = FirestoreJobStore(self.db)
        self.publisher = Publisher.build(settings.project, settings.prefix)
        self.storage = build_client(settings.project)
        self.bucket = settings.logs_bucket
        self.simulator = SimulatorControl(env["TPUJOBS_TPU_ENDPOINT"])
        self.code_uri, self.code_sha256 = upload_code_dir(self.storage, self.bucket, EXAMPLE)
        self.held_limit = PREEMPT_AFTER_MINUTES * args.minute_seconds

    def submit(self, variant: str) -> Run:
        job_id = f"goodput-{variant}-{uuid.uuid4().hex[:6]}"
        steps = round(self.args.hours * 60)
        command = (
            f"python3 train.py --steps {steps} --step-seconds {self.args.minute_seconds:g} "
            f"--checkpoint-every {CHECKPOINT_MINUTES}{VARIANTS[variant]}"
        )
        self.publisher.publish_json(
            SUBMIT,
            {
                "job_id": job_id,
                "name": f"bench-goodput-{variant}",
                "owner": OWNER,
                "accelerator_type": ACCELERATOR,
                "capacity": "spot",
                "code_uri": self.code_uri,
                "code_sha256": self.code_sha256,
                "command": command,
                "on_preemption": "resume",
                "on_error": "fail",
                "max_restarts": min(100, 2 * int(self.args.hours) + 5),
            },
        )
        return Run(variant, job_id, time.time())

    def preempt(self, zone: str, queued_resource: str) -> bool:
        try:
            self.simulator.preempt(zone, queued_resource)
        except urllib.error.HTTPError as error:  # not ACTIVE after all: try on the next poll
            print(f"  preempt {queued_resource}: {error.code} {error.read()[:200]!r}", file=sys.stderr)
            return False
        return True

    def active(self) -> set[str]:
        """Names of the queued resources the simulator has ACTIVE: capacity really held."""
        state = self.simulator.state()
        return {
            qr["name"].rsplit("/", 1)[-1]
            for qr in state["queuedResources"]
            if qr.get("state", {}).get("state") == "ACTIVE"
        }

    def poll(self, run: Run, active: set[str]) -> None:
        """Time held capacity by our clock; preempt the attempt that held an hour; note the end."""
        now = time.time()
        for name in active:
            if name.startswith(f"{run.job_id}-a"):
                seen = run.seen.setdefault(int(name.rsplit("-a", 1)[-1]), Seen())
                seen.held = seen.held or now
        for attempt, seen in run.seen.items():
            if seen.held is not None and seen.ended is None and f"{run.job_id}-a{attempt}" not in active:
                seen.ended = now
        job = self.store.get(run.job_id)
        if job is None:
            return
        run.job = job
        if job.state.is_terminal:
            run.finished = run.finished or now
            return
        last = job.usage[-1] if job.usage else None
        if (
            last is not None
            and last.attempt == job.attempt
            and last.held_from is not None
            and last.ended_at is None
            and last.attempt not in run.preempted
            and now - last.held_from.timestamp() >= self.held_limit
        ):
            called = time.time()
            if self.preempt(job.zone, job.queued_resource):
                run.preempted.add(last.attempt)
                run.seen.setdefault(last.attempt, Seen(held=called)).ended = called
                held = (called - last.held_from.timestamp()) / self.args.minute_seconds
                print(
                    f"  {run.job_id}: preempted attempt {last.attempt} after {held:.2f} held minutes", file=sys.stderr
                )

    def drive(self, runs: list[Run], timeout: float) -> None:
        """Poll until every job has ended and its capacity is released, or the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = self.active()
            for run in runs:
                self.poll(run, active)
            held = any(s.ended is None for r in runs for s in r.seen.values() if s.held is not None)
            if all(r.finished is not None for r in runs) and not held:
                return
            time.sleep(POLL_SECONDS)

    def output(self, job_id: str, attempt: int) -> str:
        prefix = f"logs/jobs/{job_id}/attempt-{attempt}/chunks/slice-0-worker-0/"  # naming.job_prefix
        blobs = sorted(self.storage.list_blobs(self.bucket, prefix=prefix), key=lambda b: b.name)
        return "".join(b.download_as_text() for b in blobs)

    def result(self, run: Run) -> Result:
        job = self.store.get(run.job_id) or run.job
        totals = self.db.collection("jobs").document(run.job_id).get().to_dict() or {}
        keys = ("chip_hours", "lost_chip_hours", "useful_chip_hours", "goodput", "lost_seconds", "queue_wait_seconds")
        usage = tuple(job.usage) if job else ()
        logs = tuple(parse_output(u.attempt, self.output(run.job_id, u.attempt)) for u in usage)
        observed = sum(s.ended - s.held for s in run.seen.values() if s.held is not None and s.ended is not None)
        return Result(
            variant=run.variant,
            job_id=run.job_id,
            state=job.state.value if job else "MISSING",
            wall_seconds=(run.finished or time.time()) - run.submitted,
            minute_seconds=self.args.minute_seconds,
            chips=int(totals.get("chips") or 0),
            totals={k: totals.get(k) or 0.0 for k in keys},
            usage=usage,
            logs=logs,
            observed_held_seconds=observed,
        )

    def repeat(self) -> list[Result]:
        """Both variants side by side: the same machine load for each."""
        runs = [self.submit(variant) for variant in VARIANTS]
        work = self.args.hours * 60 * self.args.minute_seconds
        self.drive(runs, timeout=2.0 * work + 120)
        time.sleep(SETTLE_SECONDS)
        return [self.result(run) for run in runs]


# -- the drill's goodput (--drill) -----------------------------------------------------------

DRILL_COMMAND = "python3 train.py --steps 60 --step-seconds 0.2 --checkpoint-every 5"


@dataclass(frozen=True)
class DrillSummary:
    """Medians over the drills of one variant: the drill's own report (`tpujobs drill -o json`)."""

    variant: str
    goodputs: tuple[float, ...]
    median_goodput: float | None
    median_steps_redone: float
    median_step_goodput: float | None
    passed: int
    runs: int
    median_wall_seconds: float


def summarize_drills(variant: str, answers: list[dict[str, Any]]) -> DrillSummary:
    goodputs = tuple(a["goodput"] for a in answers if a.get("goodput") is not None)
    steps = [a["step_goodput"] for a in answers if a.get("step_goodput") is not None]
    return DrillSummary(
        variant=variant,
        goodputs=goodputs,
        median_goodput=statistics.median(goodputs) if goodputs else None,
        median_steps_redone=statistics.median(a["steps_redone"] for a in answers),
        median_step_goodput=statistics.median(steps) if steps else None,
        passed=sum(1 for a in answers if a["passed"]),
        runs=len(answers),
        median_wall_seconds=statistics.median(a["wall_seconds"] for a in answers),
    )


def drill_variants(repeats: int, timeout: float = 300.0) -> dict[str, list[dict[str, Any]]]:
    """Drill each variant `repeats` times on the local stack (started in a temporary directory if none runs)."""
    import contextlib
    import os
    import tempfile

    from tpujobs.adapters.storage import build_client
    from tpujobs.cli.code_upload import upload_code_dir
    from tpujobs.local.drill import Drill, fault_plan

    with contextlib.ExitStack() as cleanup:
        state_dir = stack.default_state_dir()
        env = stack.stack_environment(state_dir)
        if not env:
            state_dir = Path(tempfile.mkdtemp(prefix="tpujobs-bench-"))
            print(f"starting a local stack in {state_dir} ...", file=sys.stderr)
            env = dict(stack.up(state_dir, Settings.from_env()).env)
            cleanup.callback(stack.down, state_dir)
        os.environ.update(env)
        settings = Settings.from_env()
        code_uri, code_sha256 = upload_code_dir(build_client(settings.project), settings.logs_bucket, EXAMPLE)
        answers: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
        for i in range(repeats):
            for variant, flag in VARIANTS.items():
                spec = {
                    "name": f"bench-drill-{variant}",
                    "owner": OWNER,
                    "accelerator_type": "v4-16",  # two hosts: one writer of two
                    "capacity": "spot",
                    "code_uri": code_uri,
                    "code_sha256": code_sha256,
                    "command": DRILL_COMMAND + flag,
                    "on_preemption": "resume",
                    "on_error": "fail",
                }
                result = Drill(settings, state_dir, spec, fault_plan(), timeout, _say).run()
                answers[variant].append(result.to_json())
                print(f"drill {i + 1}/{repeats} {variant}: passed {result.verdict.passed}", file=sys.stderr)
        return answers


def _say(line: str) -> None:
    print(f"  {line}", file=sys.stderr)


def report_drills(answers: dict[str, list[dict[str, Any]]]) -> bool:
    print(f"\ndrill goodput: the toy example (v4-16, {DRILL_COMMAND}), preempted then SIGTERMed, medians")
    ok = True
    for variant, runs in answers.items():
        s = summarize_drills(variant, runs)
        print(
            f"  {variant:<9} goodput median {pct(s.median_goodput)} (runs: {', '.join(pct(g) for g in s.goodputs)}), "
            f"steps redone median {s.median_steps_redone:g}, step goodput {pct(s.median_step_goodput)}, "
            f"passed {s.passed}/{s.runs}, wall {s.median_wall_seconds:.0f} s"
        )
        ok = ok and s.passed == s.runs
    return ok


# -- the report ------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def report_run(r: Result) -> None:
    chip_hours = r.totals["chip_hours"]
    observed = r.chips * r.observed_held_seconds / 3600.0
    redone = r.redone_steps()
    print(
        f"    {r.job_id}  {r.state}  goodput {pct(r.goodput)}  "
        f"chip-hours {r.simulated_hours(chip_hours):.2f} (lost {r.simulated_hours(r.totals['lost_chip_hours']):.3f})  "
        f"preemptions {r.preemptions}  lost {r.lost_minutes_per_preemption:.2f} min/preemption  "
        f"wall {r.wall_seconds:.0f} s"
    )
    print(
        f"      document: {chip_hours:.6f} real chip-hours, lost_seconds {r.totals['lost_seconds']:.1f}, "
        f"queue_wait_seconds {r.totals['queue_wait_seconds']:.1f}; bench clock: held "
        f"{r.observed_held_seconds:.1f} s ACTIVE = {observed:.6f} chip-hours "
        f"(the document {100 * (chip_hours - observed) / observed if observed else 0:+.2f}%)"
    )
    print(
        f"      steps redone per preemption {redone}; checkpoint printed after SIGTERM "
        f"{r.sigterm_checkpoints_printed()}/{r.preemptions}, counted on the document "
        f"{r.late_checkpoints_counted()}/{r.preemptions}; goodput if every kept checkpoint "
        f"counted {pct(r.kept_work_goodput())}"
    )


def report(args: argparse.Namespace, results: dict[str, list[Result]]) -> bool:
    print(
        f"\ngoodput: spot {ACCELERATOR}, {args.hours:g} simulated hours of steps, a checkpoint every "
        f"{CHECKPOINT_MINUTES} min, preempted after {PREEMPT_AFTER_MINUTES} held min; "
        f"1 simulated min = {args.minute_seconds:g} s; {args.repeats} repeat(s), medians"
    )
    print("\n  analytic expectation (periodic checkpoints only, start-up time left out):")
    for name, e in analytic(args.hours).items():
        print(
            f"    {name:<38} lost {e.lost_minutes:4.1f} min x {e.preemptions} preemptions "
            f"of {e.held_minutes:.1f} held min -> goodput {pct(e.goodput)}"
        )
    allowed = allowed_loss_minutes()
    print(
        f"    target {pct(TARGET)} allows {allowed:.1f} lost min per preemption an hour: periodic "
        f"checkpoints every {CHECKPOINT_MINUTES} min meet it only if the phases align (random phase "
        f"needs an interval of {2 * allowed:.1f} min or less)"
    )
    ok = True
    for variant, runs in results.items():
        s = summarize(variant, runs)
        print(
            f"\n  {variant:<9} goodput median {pct(s.median_goodput)} (runs: "
            f"{', '.join(pct(g) for g in s.goodputs)}), chip-hours {s.chip_hours:.2f}, lost chip-hours "
            f"{s.lost_chip_hours:.3f}, lost {s.lost_minutes_per_preemption:.2f} min/preemption, "
            f"{s.preemptions:g} preemptions, wall {s.wall_seconds:.0f} s"
        )
        print(
            f"            target {pct(TARGET)} on the document: {'met' if s.meets_target else 'NOT met'}; "
            f"counting every checkpoint that was resumed from: {pct(s.kept_work_goodput)}"
        )
        for r in runs:
            report_run(r)
            ok = ok and r.state == JobState.SUCCEEDED.value
    print("\n  chip-hours are simulated (real chip-hours x 60 / minute-seconds); goodput is unit-free")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=3.0, help="simulated hours of training (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--minute-seconds", type=float, default=1.0, help="real seconds per simulated minute")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1.5 hours (one preemption), 1 repeat, 0.5 s a minute"
    )
    parser.add_argument("--drill", action="store_true", help="instead: the drill's goodput of each variant")
    args = parser.parse_args()
    if args.drill:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        passed = report_drills(drill_variants(args.repeats))
        if not passed:
            print("\nA drill did not pass.", file=sys.stderr)
        return 0 if passed else 1
    if args.quick:
        args.hours, args.repeats, args.minute_seconds = 1.5, 1, 0.5
    if args.hours <= 0 or args.repeats < 1 or args.minute_seconds <= 0:
        parser.error("--hours and --minute-seconds must be positive, --repeats at least 1")

    with stack.running() as env:
        bench = Bench(Settings.from_env(), env, args)
        results: dict[str, list[Result]] = {variant: [] for variant in VARIANTS}
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats} ...", file=sys.stderr)
            for r in bench.repeat():
                results[r.variant].append(r)
                print(f"  {r.job_id}: {r.state}, goodput {pct(r.goodput)}", file=sys.stderr)
        ok = report(args, results)
    if not ok:
        print("\nA job did not finish SUCCEEDED.", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
