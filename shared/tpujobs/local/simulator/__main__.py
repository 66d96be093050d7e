"""Run the TPU simulator in the foreground: ``python -m tpujobs.local.simulator --port 8471``.

Why a console entry point: the local stack starts the simulator as a child process and waits
for the one line ``tpujobs-simulator listening on http://HOST:PORT``, which also tells it the
port when ``--port 0`` let the system choose. SIGTERM and SIGINT stop it cleanly: every
worker process group it started is stopped before it exits (SIGKILL of the simulator itself
cannot do that, so stop it with SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tpujobs.local.simulator.http import serve_until_signalled
from tpujobs.local.simulator.model import SimulatorConfig, error_code
from tpujobs.local.simulator.server import SimulatorServer


def _capacity(text: str) -> tuple[str, int]:
    pool, _, chips = text.rpartition("=")
    if not pool or not chips.isdigit():
        raise argparse.ArgumentTypeError(f"expected FAMILY@ZONE=CHIPS such as v4@us-central2-b=32, got {text!r}")
    return pool, int(chips)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = SimulatorConfig()
    parser = argparse.ArgumentParser(
        prog="python -m tpujobs.local.simulator", description="A local Cloud TPU v2 REST API."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    parser.add_argument("--state-file", help="keep state in this JSON file across restarts")
    parser.add_argument("--accept-seconds", type=float, default=defaults.accept_seconds)
    parser.add_argument("--waiting-seconds", type=float, default=defaults.waiting_seconds)
    parser.add_argument("--provisioning-seconds", type=float, default=defaults.provisioning_seconds)
    parser.add_argument("--suspending-seconds", type=float, default=defaults.suspending_seconds)
    parser.add_argument("--deleting-seconds", type=float, default=defaults.deleting_seconds)
    parser.add_argument(
        "--capacity",
        type=_capacity,
        action="append",
        default=[],
        metavar="FAMILY@ZONE=CHIPS",
        help="chips on offer in one pool, such as v4@us-central2-b=32; repeatable; default unlimited",
    )
    parser.add_argument("--api-error-rate", type=float, default=defaults.api_error_rate)
    parser.add_argument(
        "--api-error-code",
        action="append",
        default=[],
        metavar="CODE",
        help="what random errors pick from: an HTTP status or a google.rpc.Code name; "
        "repeatable [default: 503 and 429]",
    )
    parser.add_argument("--reboot-seconds", type=float, default=defaults.reboot_seconds)
    parser.add_argument(
        "--maintenance-notice-seconds",
        type=float,
        default=defaults.maintenance_notice_seconds,
        help="how long instance/maintenance-event warns before the hosts go down",
    )
    parser.add_argument(
        "--maintenance-seconds",
        type=float,
        default=defaults.maintenance_seconds,
        help="how long hosts stay down for a maintenance before they boot again",
    )
    parser.add_argument(
        "--default-page-size",
        type=int,
        default=defaults.default_page_size,
        help="page size of list calls that name none; 0 answers with everything at once",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--workers-root",
        help="scratch directories of worker processes go under DIR/QR_ID/ "
        "[default: a temporary directory, removed on exit]",
        metavar="DIR",
    )
    parser.add_argument(
        "--preemption-grace-seconds",
        type=float,
        default=defaults.preemption_grace_seconds,
        help="preempt: SIGTERM the workers, SIGKILL them this much later",
    )
    parser.add_argument(
        "--delete-grace-seconds",
        type=float,
        default=defaults.delete_grace_seconds,
        help="delete and shutdown: SIGTERM the workers, SIGKILL them this much later",
    )
    parser.add_argument(
        "--no-workers",
        action="store_true",
        help="do not run startup scripts when queued resources turn ACTIVE",
    )
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    return SimulatorConfig(
        accept_seconds=args.accept_seconds,
        waiting_seconds=args.waiting_seconds,
        provisioning_seconds=args.provisioning_seconds,
        suspending_seconds=args.suspending_seconds,
        deleting_seconds=args.deleting_seconds,
        capacity=dict(args.capacity),
        api_error_rate=args.api_error_rate,
        api_error_codes=tuple(error_code(code) for code in args.api_error_code) or SimulatorConfig().api_error_codes,
        seed=args.seed,
        preemption_grace_seconds=args.preemption_grace_seconds,
        delete_grace_seconds=args.delete_grace_seconds,
        reboot_seconds=args.reboot_seconds,
        maintenance_notice_seconds=args.maintenance_notice_seconds,
        maintenance_seconds=args.maintenance_seconds,
        default_page_size=args.default_page_size,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"tpujobs-simulator: {exc}", file=sys.stderr)
        return 2
    server = SimulatorServer(
        config,
        host=args.host,
        port=args.port,
        state_file=args.state_file,
        run_workers=not args.no_workers,
        workers_root=args.workers_root,
    )

    def start() -> str:
        url = server.start()
        if server.workers_root is not None:
            print(f"tpujobs-simulator: worker scratch under {server.workers_root}", file=sys.stderr)
        return url

    return serve_until_signalled(start, server.stop, "tpujobs-simulator")


if __name__ == "__main__":
    sys.exit(main())
