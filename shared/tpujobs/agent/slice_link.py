"""One host speaks for its slice: worker 0 hears its peers over the slice's network in signed
UDP datagrams and heartbeats for them; a peer never acknowledged heartbeats for itself.
"""

from __future__ import annotations

import contextlib
import hmac
import http.client
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import AgentError, log
from .rest import Metadata
from .wire import encode_payload, sign

#
# In a slice of several hosts, worker 0 alone publishes heartbeats: the others tell it they
# are alive over the slice's own network, in small UDP datagrams, and it says so for them
# (one invocation and one Firestore write per slice per period, not per host). The table of
# what each side sends and does:
#
#   datagram  from        to          when                        what the receiver does
#   beat      worker k>0  worker 0    every peer_seconds          notes k alive, with its last output
#                                                                 and checkpoint; answers `ack`
#   ack       worker 0    worker k    for every accepted beat     k knows worker 0 speaks for it: it
#                                                                 stops its own heartbeats (sticky)
#   bye       worker k>0  worker 0    when k's agent ends         k is not reported silent
#
# A peer worker 0 heard and then hears nothing from for peer_timeout_seconds is reported at
# once in a signed `peer_silent` report naming it (the service's CAPACITY_LOST for that host).
# A peer never acknowledged (worker 0 not up yet, a firewall, a port taken) publishes its own
# heartbeats as a single host does, so nothing depends on the slice network being there.
#
# Every datagram is `v1=<hex HMAC-SHA256 under the attempt's report key> <JSON>`, and names
# the job, attempt, slice and worker, a sequence number that only grows and the sender's
# time; a receiver drops any datagram that is unsigned, for another attempt or slice, older
# than PEER_SKEW_SECONDS or not newer than the last it took from that sender, so another
# team's VM on the same network can neither forge nor replay a peer's liveness.

PEER_PORT = 8479  # UDP, on each host's own address: where worker 0 of a slice hears its peers
ENDPOINTS_METADATA = "instance/attributes/worker-network-endpoints"  # id:host:ip,... worker 0 first
ADDRESS_METADATA = "instance/network-interfaces/0/ip"
PEER_MAX_BYTES = 2048
PEER_SKEW_SECONDS = 30.0  # a datagram's `at` may differ this much from the receiver's clock
PEER_KINDS = frozenset({"beat", "bye", "ack"})
RATE_MARGIN = 4.0  # a sender may send this many times the one datagram per `peer_seconds` it needs


REFUSALS_LOG_SECONDS = 60.0  # refused datagrams are counted, and said in one line at most this often
PEER_BURST = 20.0  # datagrams a sender may send at once before its rate counts


class DatagramGate:
    """Which datagrams a host even looks at (pure: times are passed in): only those from the
    slice's own addresses, each sender at most a few times its expected rate. Anything else is
    dropped before the HMAC and counted by reason, never a log line each: a flood from another
    VM costs this host next to nothing and never drowns its peers' beats."""

    def __init__(self, allowed: frozenset[str], per_second: float, burst: float = PEER_BURST) -> None:
        self.allowed = allowed
        self.per_second = per_second
        self.burst = burst
        self._tokens: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self.refused: dict[str, int] = {}  # reason -> datagrams since the last summary
        self._said_at: float | None = None

    def admit(self, address: str, clock: float) -> bool:
        """Whether to open a datagram from `address` now; a refusal is counted."""
        if address not in self.allowed:
            return self.refuse("not from this slice")
        tokens, at = self._tokens.get(address, (self.burst, clock))
        tokens = min(self.burst, tokens + (clock - at) * self.per_second)
        if tokens < 1.0:
            self._tokens[address] = (tokens, clock)
            return self.refuse("over the rate")
        self._tokens[address] = (tokens - 1.0, clock)
        return True

    def refuse(self, reason: str) -> bool:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return False

    def summary(self, clock: float) -> str | None:
        """One line of what was refused since the last, at most every REFUSALS_LOG_SECONDS."""
        if self._said_at is None:
            self._said_at = clock
        if not self.refused or clock - self._said_at < REFUSALS_LOG_SECONDS:
            return None
        counts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.refused.items()))
        self.refused, self._said_at = {}, clock
        return f"datagrams refused in the last {REFUSALS_LOG_SECONDS:g} s: {counts}"


def slice_addresses(endpoints: str) -> frozenset[str]:
    """Every host address `worker-network-endpoints` names."""
    count = len([entry for entry in endpoints.split(",") if entry.strip()])
    return frozenset(address for worker in range(count) if (address := worker_address(endpoints, worker)))


class PeerRefused(AgentError):
    """A datagram that is not a peer's word for this attempt and slice; the message says why."""


def heartbeat_period(elapsed: float, config: dict[str, Any]) -> float:
    """Seconds until the next heartbeat: `heartbeat_seconds` during the attempt's first
    `heartbeat_fast_window_seconds` on this host (a host that fails at start fails early),
    `heartbeat_sparse_seconds` after (a long run costs a third of the invocations)."""
    if elapsed < float(config["heartbeat_fast_window_seconds"]):
        return float(config["heartbeat_seconds"])
    return float(config["heartbeat_sparse_seconds"])


def worker_address(endpoints: str, worker: int) -> str | None:
    """The address of `worker` in `worker-network-endpoints` (`x:y:10.0.0.2,x:y:10.0.0.3`,
    worker 0 first, the IP last in each entry, as JAX's cloud_tpu_cluster reads it)."""
    entries = [entry.strip() for entry in endpoints.split(",") if entry.strip()]
    if not 0 <= worker < len(entries):
        return None
    address = entries[worker].rsplit(":", 1)[-1]
    return address if re.fullmatch(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}", address) else None


def seal(key: bytes, fields: dict[str, Any]) -> bytes:
    """A signed datagram: `v1=<hex HMAC> ` and the compact JSON it covers."""
    data = encode_payload(fields)
    return sign(key, data).encode("ascii") + b" " + data


def unseal(key: bytes, datagram: bytes) -> dict[str, Any]:
    """The fields of a datagram signed with `key`; PeerRefused when it is not one."""
    if len(datagram) > PEER_MAX_BYTES:
        raise PeerRefused(f"the datagram is {len(datagram)} bytes, more than {PEER_MAX_BYTES}")
    signature, sep, data = datagram.partition(b" ")
    if not sep or not hmac.compare_digest(signature, sign(key, data).encode("ascii")):
        raise PeerRefused("the datagram is not signed with this attempt's key")
    try:
        fields = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise PeerRefused("the datagram is not JSON") from None
    if not isinstance(fields, dict) or fields.get("kind") not in PEER_KINDS:
        raise PeerRefused("the datagram is not a beat, an ack or a bye")
    return fields


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_peer_fields(fields: dict[str, Any], identity: dict[str, Any], sender: int, last_seq: int, now: float) -> int:
    """The datagram's sequence number, if it is `sender`'s word for this attempt and slice,
    timely and newer than `last_seq`; PeerRefused naming the field otherwise."""
    for name in ("job_id", "attempt", "slice_id"):
        if fields.get(name) != identity[name]:
            raise PeerRefused(f"field {name!r} is not this host's {identity[name]!r}")
    if fields.get("worker_id") != sender:
        raise PeerRefused(f"field 'worker_id' is not {sender}")
    at = _number(fields.get("at"))
    if at is None or abs(now - at) > PEER_SKEW_SECONDS:
        raise PeerRefused(f"field 'at' is not within {PEER_SKEW_SECONDS:g} s of this host's clock (a replay?)")
    seq = _whole(fields.get("seq"))
    if seq is None or seq <= last_seq:
        raise PeerRefused("field 'seq' is not newer than the last one taken (a replay)")
    return seq


class SliceWatch:
    """Worker 0's view of its peers (pure: times are passed in), fed by `accept`.

    A peer is watched from its first accepted beat until its bye, or until it is reported
    silent (once). Its last output and checkpoint join worker 0's heartbeat.
    """

    def __init__(self, identity: dict[str, Any], hosts: int, timeout: float) -> None:
        self.identity = identity
        self.hosts = hosts
        self.timeout = timeout
        self.peers: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def accept(self, fields: dict[str, Any], now: float, clock: float) -> int:
        """The sequence number to acknowledge, if the datagram is a peer's beat or bye (`now`:
        wall time, `clock`: monotonic); PeerRefused otherwise."""
        sender = _whole(fields.get("worker_id"))
        if fields.get("kind") not in ("beat", "bye") or sender is None or not 0 < sender < self.hosts:
            raise PeerRefused(f"field 'worker_id' names no peer of this slice of {self.hosts} hosts")
        with self._lock:
            peer = self.peers.get(sender, {"seq": -1, "reported": False})
            seq = check_peer_fields(fields, self.identity, sender, peer["seq"], now)
            peer.update(seq=seq, heard=clock, gone=fields["kind"] == "bye")
            for name in ("last_output_at", "checkpoint_at"):
                value = _number(fields.get(name))
                if value is not None:
                    peer[name] = max(value, peer.get(name, value))
            step = _whole(fields.get("checkpoint_step"))
            if step is not None and step >= peer.get("checkpoint_step", -1):
                peer["checkpoint_step"] = step
            self.peers[sender] = peer
        return seq

    def silent(self, clock: float) -> list[tuple[int, float]]:
        """Peers heard, not gone, and quiet past the timeout: (worker, seconds quiet), each once."""
        found = []
        with self._lock:
            for worker, peer in sorted(self.peers.items()):
                quiet = clock - peer["heard"]
                if not peer["gone"] and not peer["reported"] and quiet > self.timeout:
                    peer["reported"] = True
                    found.append((worker, quiet))
        return found

    def watching(self) -> int:
        """How many peers are heard and not yet gone nor reported."""
        with self._lock:
            return sum(1 for peer in self.peers.values() if not peer["gone"] and not peer["reported"])

    def progress(self) -> dict[str, Any]:
        """The peers' latest last output (epoch s), checkpoint step and its time, how many are
        heard, and which were reported silent: what worker 0's heartbeat adds for its slice."""
        with self._lock:
            peers = list(self.peers.values())
            # Reported and never a bye since: said again, so a lost report is not lost for good.
            reported = sorted(w for w, p in self.peers.items() if p["reported"] and not p["gone"])
        found: dict[str, Any] = {"peers_heard": sum(1 for p in peers if not p["gone"] and not p["reported"])}
        if reported:
            found["peers_silent"] = reported
        outputs = [p["last_output_at"] for p in peers if "last_output_at" in p]
        if outputs:
            found["last_output_at"] = max(outputs)
        steps = [(p["checkpoint_step"], p.get("checkpoint_at") or 0.0) for p in peers if "checkpoint_step" in p]
        if steps:
            found["checkpoint_step"], found["checkpoint_at"] = max(steps)
        return found


class PeerState:
    """A peer's side (pure): the sequence numbers it sent, and whether worker 0 acknowledged one."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity
        self.seq = -1
        self.acked_seq = -1
        self._lock = threading.Lock()

    def next_seq(self, now: float) -> int:
        """A number larger than any sent before, even by an earlier agent on this host."""
        with self._lock:
            self.seq = max(self.seq + 1, int(now * 1000))
            return self.seq

    def accept_ack(self, fields: dict[str, Any], now: float) -> bool:
        """Whether the datagram is worker 0's ack of a beat this host sent (the first such ack
        makes worker 0 its speaker); PeerRefused when it is not one."""
        if fields.get("kind") != "ack":
            raise PeerRefused("a peer takes only acks")
        seq = check_peer_fields(fields, self.identity, 0, self.acked_seq, now)
        with self._lock:
            if seq > self.seq:
                raise PeerRefused("field 'seq' acknowledges a beat this host never sent")
            first = self.acked_seq < 0
            self.acked_seq = seq
        return first

    @property
    def watched(self) -> bool:
        return self.acked_seq >= 0


def _datagram_socket(address: str, port: int) -> Any:
    import socket  # only hosts of multi-host slices open one

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    sock.settimeout(0.5)
    return sock


class SliceLink:
    """The slice's own network, for one host of a multi-host slice: worker 0 listens on
    PEER_PORT of its address and answers; a peer sends beats and reads acks. `progress` is a
    callable giving the host's last output and checkpoint (epoch seconds, step)."""

    def __init__(
        self,
        key: bytes,
        identity: dict[str, Any],
        config: dict[str, Any],
        metadata: Metadata,
        progress: Callable[[], dict[str, Any]],
        on_silent: Callable[[int, float], None],
        on_watched: Callable[[], None],
        on_peer_checkpoint: Callable[[int, int], None],
    ) -> None:
        self._key = key
        self.identity = identity
        self.worker_id = int(identity["worker_id"])
        self.port = int(config["peer_port"])
        self.every = float(config["peer_seconds"])
        self.metadata = metadata
        self.progress = progress
        self.on_silent = on_silent
        self.on_watched = on_watched
        self.on_peer_checkpoint = on_peer_checkpoint
        self.watch = SliceWatch(identity, int(config["hosts_per_slice"]), float(config["peer_timeout_seconds"]))
        self.peer = PeerState(identity)
        self.stop = threading.Event()
        self._sock: Any = None
        self.gate = DatagramGate(frozenset(), 0.0)  # until `_open` reads the slice's addresses
        self._speaker: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name="slice-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _open(self) -> bool:
        """The socket: worker 0 on its own address and PEER_PORT, a peer on any port of its own."""
        try:
            own = self.metadata.get(ADDRESS_METADATA).strip()
            endpoints = self.metadata.get_optional(ENDPOINTS_METADATA) or ""
            if self.worker_id != 0:
                speaker = worker_address(endpoints, 0)
                if speaker is None:
                    log(f"no worker 0 address in {ENDPOINTS_METADATA}: this host reports its own heartbeats")
                    return False
                self._speaker = (speaker, self.port)
                self.gate = DatagramGate(frozenset({speaker}), RATE_MARGIN / self.every)
            else:
                peers = slice_addresses(endpoints) - {own}
                if not peers:
                    log(
                        f"no peer addresses in {ENDPOINTS_METADATA}: every host of the slice reports its own heartbeats"
                    )
                    return False
                self.gate = DatagramGate(peers, RATE_MARGIN / self.every)
            self._sock = _datagram_socket(own, self.port if self.worker_id == 0 else 0)
        except (AgentError, OSError, http.client.HTTPException) as error:
            log(f"the slice link is not open ({error}): every host of the slice reports its own heartbeats")
            return False
        return True

    def _run(self) -> None:
        if not self._open():
            return
        try:
            if self.worker_id == 0:
                self._listen()
            else:
                self._beat()
        finally:
            self._sock.close()

    def _send(self, kind: str, address: tuple[str, int], **extra: Any) -> None:
        seq = extra.pop("seq", None)
        now = time.time()
        fields = {"kind": kind, **self.identity, "at": now, "seq": self.peer.next_seq(now) if seq is None else seq}
        fields.update({k: v for k, v in extra.items() if v is not None})
        with contextlib.suppress(OSError):  # a lost datagram is one of many
            self._sock.sendto(seal(self._key, fields), address)

    def _listen(self) -> None:
        while not self.stop.is_set():
            try:
                datagram, sender = self._sock.recvfrom(PEER_MAX_BYTES + 1)
            except OSError:  # the timeout, or a socket error: look at the silent ones
                datagram = b""
            if datagram and self.gate.admit(sender[0], time.monotonic()):
                try:
                    fields = unseal(self._key, datagram)
                    seq = self.watch.accept(fields, time.time(), time.monotonic())
                except PeerRefused as refusal:
                    self.gate.refuse(str(refusal))
                else:
                    self._send("ack", sender, seq=seq)
                    step = _whole(fields.get("checkpoint_step"))
                    if step is not None:
                        self.on_peer_checkpoint(int(fields["worker_id"]), step)
            for worker, quiet in self.watch.silent(time.monotonic()):
                self.on_silent(worker, quiet)
            self._say_refusals()

    def _say_refusals(self) -> None:
        said = self.gate.summary(time.monotonic())
        if said:
            log(said)

    def _beat(self) -> None:
        assert self._speaker is not None
        while not self.stop.is_set():
            self._send("beat", self._speaker, **self.progress())
            until = time.monotonic() + self.every
            while not self.stop.is_set() and time.monotonic() < until:
                self._say_refusals()
                try:
                    datagram, sender = self._sock.recvfrom(PEER_MAX_BYTES + 1)
                except OSError:
                    continue
                if not self.gate.admit(sender[0], time.monotonic()):
                    continue
                try:
                    first = self.peer.accept_ack(unseal(self._key, datagram), time.time())
                except PeerRefused as refusal:
                    self.gate.refuse(str(refusal))
                    continue
                if first:
                    log("worker 0 speaks for this host: its own heartbeats stop")
                    self.on_watched()

    def bye(self) -> None:
        """A peer's last word (sent three times: datagrams get lost), then the link closes."""
        if self.worker_id != 0 and self._speaker is not None and self._sock is not None:
            for _ in range(3):
                self._send("bye", self._speaker)
        self.close()

    def close(self) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
