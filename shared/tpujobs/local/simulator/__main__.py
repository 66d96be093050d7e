"""Run the TPU simulator in the foreground: ``python -m tpujobs.local.simulator --port 8471``.

It prints ``tpujobs-simulator listening on http://HOST:PORT`` (the local stack waits for that line)
and stops every worker it started on SIGTERM or SIGINT; each SimulatorConfig number is an option.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from tpujobs.domain.quotas import RESERVATIONS
from tpujobs.local.simulator.http import serve_until_signalled
from tpujobs.local.simulator.model import SimulatorConfig, error_code
from tpujobs.local.simulator.server import SimulatorServer


def _capacity(text: str) -> tuple[str, int]:
    pool, _, chips = text.rpartition("=")
    if not pool or not chips.isdigit():
        raise argparse.ArgumentTypeError(f"expected FAMILY@ZONE=CHIPS such as v4@us-central2-b=32, got {text!r}")
    return pool, int(chips)


def _quota(text: str) -> tuple[tuple[str, ...], int]:
    """One --quota: LOCATION/FAMILY[/TIER]=CHIPS or reservations/NAME=CHIPS, as a path in the
    config/quotas document and its chips (SimulatorConfig names what the document gets wrong)."""
    where, _, chips = text.rpartition("=")
    path = tuple(where.split("/"))
    shapes = {2, 3} if path[0] != RESERVATIONS else {2}
    if not chips.isdigit() or len(path) not in shapes or not all(path):
        raise argparse.ArgumentTypeError(
            f"expected LOCATION/FAMILY[/TIER]=CHIPS such as us-east5/v5p/spot=512 or us-central2-b/v4=64, "
            f"or {RESERVATIONS}/NAME=CHIPS; got {text!r}"
        )
    return path, int(chips)


def quota_document(entries: Sequence[tuple[tuple[str, ...], int]]) -> dict[str, Any]:
    """The config/quotas document the --quota options make: LOCATION/FAMILY alone is on-demand."""
    document: dict[str, Any] = {}
    for path, chips in entries:
        if path[0] == RESERVATIONS:
            document.setdefault(RESERVATIONS, {})[path[1]] = chips
        else:
            location, family, *tier = path
            document.setdefault(location, {}).setdefault(family, {})[tier[0] if tier else "on-demand"] = chips
    return document


# Help for the config's options that need more than their name; each one is --field-name.
_HELP = {
    "api_error_rate": "share of TPU API calls refused with an injected error",
    "maintenance_notice_seconds": "how long instance/maintenance-event warns before the hosts go down",
    "maintenance_seconds": "how long hosts stay down for a maintenance before they boot again",
    "default_page_size": "page size of list calls that name none; 0 answers with everything at once",
    "preemption_grace_seconds": "preempt: SIGTERM the workers, SIGKILL them this much later",
    "delete_grace_seconds": "delete and shutdown: SIGTERM the workers, SIGKILL them this much later",
    "compute_operation_seconds": "how long a Compute Engine operation runs before it is DONE",
    "topology_activation_seconds": "how long a MIG slice's interconnect is ACTIVATING once its VMs all run",
    "run_duration_scale": "a VM's maxRunDuration counts this share of itself (tests; Google: 1)",
}
# Config fields that are no single number, each with its own option below.
_COLLECTIONS = ("capacity", "quota", "api_error_codes")


def _numbers() -> list[dataclasses.Field[object]]:
    """SimulatorConfig's number fields: each is an option of the same name, with the same default."""
    return [field for field in dataclasses.fields(SimulatorConfig) if field.name not in _COLLECTIONS]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = SimulatorConfig()
    parser = argparse.ArgumentParser(
        prog="python -m tpujobs.local.simulator", description="A local Cloud TPU v2 and Compute Engine v1 REST API."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    parser.add_argument("--state-file", help="keep state in this JSON file across restarts")
    for field in _numbers():
        default = getattr(defaults, field.name)
        option = "--" + field.name.replace("_", "-")
        parser.add_argument(option, type=type(default), default=default, help=_HELP.get(field.name))
    parser.add_argument(
        "--capacity",
        type=_capacity,
        action="append",
        default=[],
        metavar="FAMILY@ZONE=CHIPS",
        help="chips on offer in one pool, such as v4@us-central2-b=32 (FAMILY@ZONE:spot=CHIPS: Spot capacity "
        "of its own); repeatable; default unlimited",
    )
    parser.add_argument(
        "--quota",
        type=_quota,
        action="append",
        default=[],
        metavar="LOCATION/FAMILY[/TIER]=CHIPS",
        help="the project's quota, as config/quotas states it: a zone's or a region's chips of a family "
        "and tier (on-demand, spot, reserved; default on-demand), such as us-east5/v5p/spot=512 or "
        "us-central2-b/v4=64, or a reservation's size, reservations/NAME=CHIPS; repeatable; default unlimited",
    )
    parser.add_argument(
        "--api-error-code",
        action="append",
        default=[],
        metavar="CODE",
        help="what random errors pick from: an HTTP status or a google.rpc.Code name; "
        "repeatable [default: 503 and 429]",
    )
    parser.add_argument(
        "--workers-root",
        help="scratch directories of worker processes go under DIR/QR_ID/ "
        "[default: a temporary directory, removed on exit]",
        metavar="DIR",
    )
    parser.add_argument(
        "--no-workers",
        action="store_true",
        help="do not run startup scripts when queued resources turn ACTIVE",
    )
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    codes = tuple(error_code(code) for code in args.api_error_code)
    return SimulatorConfig(
        **{field.name: getattr(args, field.name) for field in _numbers()},
        capacity=dict(args.capacity),
        quota=quota_document(args.quota),
        api_error_codes=codes or SimulatorConfig().api_error_codes,
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
