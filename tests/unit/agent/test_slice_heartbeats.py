"""One host speaks for its slice: the agent's peer protocol (`agent/slice_link.py`, SliceLink).

The pure parts (signing, SliceWatch, PeerState, the heartbeat schedule) are tested with
times passed in; the sockets once, on two loopback addresses, as two hosts of a slice.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from typing import Any

import pytest

from tpujobs.agent import slice_link
from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import REQUIRED, check_config
from tpujobs.agent.slice_link import (
    ADDRESS_METADATA,
    ENDPOINTS_METADATA,
    PEER_MAX_BYTES,
    PEER_PORT,
    PEER_SKEW_SECONDS,
    DatagramGate,
    PeerRefused,
    PeerState,
    SliceLink,
    SliceWatch,
    heartbeat_period,
    seal,
    slice_addresses,
    unseal,
    worker_address,
)
from tpujobs.agent.wire import encode_payload
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.worker_reports import WorkerReport
from tpujobs.local.testing import wait_for

KEY = hashlib.sha256(b"the attempt key of the tests").digest()
OTHER_KEY = hashlib.sha256(b"another attempt's key").digest()
IDENTITY = {"job_id": "train-1", "attempt": 2, "slice_id": 1}
NOW = 1_800_000_000.0  # wall time of the tests (epoch seconds)


def beat(worker_id: int = 1, seq: int = 1, at: float = NOW, kind: str = "beat", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, **IDENTITY, "worker_id": worker_id, "seq": seq, "at": at, **extra}


def a_watch(hosts: int = 4, timeout: float = 10.0) -> SliceWatch:
    return SliceWatch({**IDENTITY, "worker_id": 0}, hosts, timeout)


# --- signing --------------------------------------------------------------------------


def test_a_sealed_datagram_opens_with_its_key_only() -> None:
    """seal/unseal round-trip; another attempt's key, or a changed byte, is refused."""
    datagram = seal(KEY, beat())
    assert unseal(KEY, datagram) == beat()
    with pytest.raises(PeerRefused, match="not signed"):
        unseal(OTHER_KEY, datagram)
    with pytest.raises(PeerRefused, match="not signed"):
        unseal(KEY, datagram.replace(b'"seq":1', b'"seq":9'))
    with pytest.raises(PeerRefused, match="not signed"):
        unseal(KEY, b"unsigned")


def test_a_datagram_of_another_kind_or_too_big_is_refused() -> None:
    """Only beat, ack and bye; nothing past PEER_MAX_BYTES."""
    with pytest.raises(PeerRefused, match="beat, an ack or a bye"):
        unseal(KEY, seal(KEY, beat(kind="heartbeat")))
    with pytest.raises(PeerRefused, match="bytes"):
        unseal(KEY, seal(KEY, beat(pad="x" * PEER_MAX_BYTES)))


# --- worker 0: SliceWatch -------------------------------------------------------------


def test_worker_0_takes_a_peers_beat_and_refuses_its_replay() -> None:
    """A beat is taken once: the same sequence number again (a replayed datagram) is refused."""
    watch = a_watch()
    assert watch.accept(beat(seq=5), NOW, clock=100.0) == 5
    with pytest.raises(PeerRefused, match="'seq'"):
        watch.accept(beat(seq=5), NOW, clock=101.0)
    with pytest.raises(PeerRefused, match="'seq'"):
        watch.accept(beat(seq=4), NOW, clock=101.0)
    assert watch.accept(beat(seq=6), NOW, clock=102.0) == 6


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (beat(at=NOW - PEER_SKEW_SECONDS - 1), "'at'"),  # an old datagram: a replay
        (beat(at=None), "'at'"),
        ({**beat(), "attempt": 1}, "'attempt'"),  # another attempt's host
        ({**beat(), "slice_id": 0}, "'slice_id'"),  # another slice's host
        ({**beat(), "job_id": "other"}, "'job_id'"),
        (beat(worker_id=0), "'worker_id'"),  # worker 0 is no peer of itself
        (beat(worker_id=4), "'worker_id'"),  # a slice of 4 hosts has peers 1..3
        (beat(kind="ack"), "'worker_id'"),
        (beat(seq="7"), "'seq'"),
    ],
)
def test_worker_0_refuses_a_datagram_that_is_not_a_peers_word_now(fields: dict[str, Any], field: str) -> None:
    """Each refusal names the field that is wrong."""
    with pytest.raises(PeerRefused, match=field):
        a_watch().accept(fields, NOW, clock=100.0)


def test_a_peer_quiet_past_the_timeout_is_reported_once() -> None:
    """Silent once its last beat is older than the timeout; not before; never twice."""
    watch = a_watch(timeout=10.0)
    watch.accept(beat(worker_id=1, seq=1), NOW, clock=100.0)
    watch.accept(beat(worker_id=2, seq=1), NOW, clock=105.0)
    assert watch.silent(clock=109.0) == []
    assert watch.silent(clock=111.0) == [(1, 11.0)]
    assert watch.silent(clock=120.0) == [(2, 15.0)]
    assert watch.silent(clock=200.0) == []
    assert watch.watching() == 0


def test_a_peer_that_said_bye_is_never_reported_silent() -> None:
    """A bye ends the watch of that peer: its exit is its own `exited` report's business."""
    watch = a_watch(timeout=10.0)
    watch.accept(beat(worker_id=1, seq=1), NOW, clock=100.0)
    watch.accept(beat(worker_id=1, seq=2, kind="bye"), NOW, clock=101.0)
    assert watch.silent(clock=500.0) == []
    assert watch.watching() == 0


def test_worker_0s_heartbeat_repeats_the_peers_it_reported_silent_until_their_bye() -> None:
    """A peer reported silent is named in every heartbeat after (`peers_silent`), so a lost `peer_silent` is said
    again; one that said bye since is not."""
    watch = a_watch(timeout=10.0)
    watch.accept(beat(worker_id=1, seq=1), NOW, clock=100.0)
    watch.accept(beat(worker_id=3, seq=1), NOW, clock=100.0)
    assert "peers_silent" not in watch.progress()
    assert watch.silent(clock=111.0) == [(1, 11.0), (3, 11.0)]
    assert watch.progress()["peers_silent"] == [1, 3]
    assert watch.progress()["peers_silent"] == [1, 3]  # every heartbeat, not once
    watch.accept(beat(worker_id=3, seq=2, kind="bye"), NOW, clock=112.0)
    assert watch.progress() == {"peers_heard": 0, "peers_silent": [1]}


def test_a_peer_never_heard_is_not_worker_0s_to_report() -> None:
    """Worker 0 reports only peers it heard: one it never heard reports its own heartbeats."""
    assert a_watch(hosts=4, timeout=1.0).silent(clock=1e9) == []


def test_worker_0s_heartbeat_carries_the_slices_latest_progress() -> None:
    """The latest last output and the newest checkpoint (step and time) among its peers, and how many it hears."""
    watch = a_watch()
    watch.accept(beat(worker_id=1, seq=1, last_output_at=NOW - 5, checkpoint_step=10, checkpoint_at=NOW - 50), NOW, 1.0)
    watch.accept(beat(worker_id=2, seq=1, last_output_at=NOW - 1, checkpoint_step=12, checkpoint_at=NOW - 9), NOW, 1.0)
    watch.accept(beat(worker_id=3, seq=1), NOW, 1.0)
    assert watch.progress() == {
        "peers_heard": 3,
        "last_output_at": NOW - 1,
        "checkpoint_step": 12,
        "checkpoint_at": NOW - 9,
    }


# --- a peer: PeerState ----------------------------------------------------------------


def test_a_peer_takes_an_ack_only_of_a_beat_it_sent() -> None:
    """The first ack says worker 0 speaks for it; an ack of a beat never sent, a replayed ack, or a forged one
    (worker 1 posing as worker 0) is refused."""
    peer = PeerState({**IDENTITY, "worker_id": 1})
    seq = peer.next_seq(NOW)
    assert not peer.watched
    with pytest.raises(PeerRefused, match="never sent"):
        peer.accept_ack(beat(worker_id=0, seq=seq + 1, kind="ack"), NOW)
    with pytest.raises(PeerRefused, match="'worker_id'"):
        peer.accept_ack(beat(worker_id=1, seq=seq, kind="ack"), NOW)
    assert peer.accept_ack(beat(worker_id=0, seq=seq, kind="ack"), NOW) is True
    assert peer.watched
    with pytest.raises(PeerRefused, match="'seq'"):
        peer.accept_ack(beat(worker_id=0, seq=seq, kind="ack"), NOW)
    later = peer.next_seq(NOW)
    assert peer.accept_ack(beat(worker_id=0, seq=later, kind="ack"), NOW) is False  # not the first


def test_a_peers_sequence_numbers_only_grow_even_across_agents() -> None:
    """Counted from the wall clock in ms, so a later agent on the host never reuses an earlier one's numbers."""
    first = PeerState(IDENTITY)
    numbers = [first.next_seq(NOW) for _ in range(3)]
    assert numbers == sorted(set(numbers))
    assert PeerState(IDENTITY).next_seq(NOW + 1) > numbers[-1]


# --- the schedule and the endpoints ---------------------------------------------------


def test_the_heartbeat_is_frequent_first_and_sparse_later() -> None:
    """heartbeat_seconds during the fast window, heartbeat_sparse_seconds after it."""
    config = check_config(
        {
            **{k: "x" for k, kind in REQUIRED.items() if kind is str},
            "attempt": 1,
            "resume": False,
            "num_slices": 1,
            "hosts_per_slice": 2,
            "heartbeat_seconds": 10,
            "heartbeat_sparse_seconds": 30,
            "heartbeat_fast_window_seconds": 300,
        }
    )
    assert [heartbeat_period(t, config) for t in (0.0, 299.0, 300.0, 86_400.0)] == [10, 10, 30, 30]
    assert heartbeat_period(0.0, {**config, "heartbeat_fast_window_seconds": 0}) == 30  # sparse at once
    assert (config["peer_seconds"], config["peer_timeout_seconds"], config["peer_port"]) == (2, 10, PEER_PORT)


@pytest.mark.parametrize("key", ["heartbeat_sparse_seconds", "peer_timeout_seconds", "peer_port"])
def test_a_bad_period_or_port_is_refused_by_name(key: str) -> None:
    """A period that is not a positive number, or a port that is not one, names its key."""
    config = {k: "x" for k, kind in REQUIRED.items() if kind is str}
    config.update(attempt=1, resume=False, num_slices=1, hosts_per_slice=2, **{key: 0})
    with pytest.raises(AgentError, match=key):
        check_config(config)


def test_worker_0s_address_is_the_first_of_the_worker_network_endpoints() -> None:
    """As TPU VMs list them (`id:host:ip`, worker 0 first); anything else is no address."""
    endpoints = "unknown:unknown:10.0.0.11,unknown:unknown:10.0.0.12"
    assert worker_address(endpoints, 0) == "10.0.0.11"
    assert worker_address(endpoints, 1) == "10.0.0.12"
    assert worker_address(endpoints, 2) is None
    assert worker_address("", 0) is None
    assert worker_address("a:b:not-an-ip", 0) is None


def test_the_service_reads_the_new_report_fields() -> None:
    """peer_silent names its peer; started and heartbeat say when they come next or that worker 0 speaks for them."""
    base = {"job_id": "train-1", "attempt": 2, "slice_id": 0, "worker_id": 0, "at": "2027-01-01T00:00:00Z"}
    silent = decode_report(
        WorkerReport,
        encode_payload({**base, "kind": "peer_silent", "peer_worker_id": 3, "nonce": "ab" * 16}),
    )
    assert (silent.kind, silent.peer_worker_id) == ("peer_silent", 3)
    beat_ = decode_report(
        WorkerReport,
        encode_payload({**base, "kind": "heartbeat", "next_report_seconds": 30, "peers_heard": 3, "nonce": "cd" * 16}),
    )
    assert (beat_.next_report_seconds, beat_.peers_heard, beat_.watch) == (30.0, 3, None)
    with pytest.raises(ReportError, match="watch"):
        decode_report(
            WorkerReport,
            encode_payload({**base, "kind": "started", "watch": "self", "nonce": "ef" * 16}),
        )


# --- sockets: two hosts of a slice on loopback ----------------------------------------


class Metadata:
    """The two metadata paths the link reads, for one host."""

    def __init__(self, address: str, endpoints: str) -> None:
        self.values = {ADDRESS_METADATA: address, ENDPOINTS_METADATA: endpoints}

    def get(self, path: str, timeout: float | None = None) -> str:
        return self.values[path]

    def get_optional(self, path: str) -> str | None:
        return self.values.get(path)


def free_udp_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class Host:
    """One host's SliceLink and what its callbacks were told."""

    def __init__(
        self,
        worker_id: int,
        port: int,
        key: bytes = KEY,
        progress: dict[str, Any] | None = None,
        timeout: float = 0.5,
    ) -> None:
        self.silent: list[tuple[int, float]] = []
        self.checkpoints: list[tuple[int, int]] = []
        self.watched = threading.Event()
        address = f"127.0.0.{worker_id + 1}"
        config = {"peer_port": port, "peer_seconds": 0.05, "hosts_per_slice": 2, "peer_timeout_seconds": timeout}
        self.link = SliceLink(
            key,
            {**IDENTITY, "worker_id": worker_id},
            config,
            Metadata(address, "unknown:unknown:127.0.0.1,unknown:unknown:127.0.0.2"),  # type: ignore[arg-type]
            lambda: dict(progress or {}),
            lambda peer, quiet: self.silent.append((peer, quiet)),
            self.watched.set,
            lambda peer, step: self.checkpoints.append((peer, step)),
        )
        self.link.start()


@pytest.fixture
def port() -> int:
    return free_udp_port("127.0.0.1")


def test_worker_0_speaks_for_a_peer_and_reports_it_when_it_goes_quiet(port: int) -> None:
    """The peer is acknowledged (its own heartbeats may stop), its checkpoint reaches worker 0, and once its beats
    stop without a bye worker 0 reports it silent."""
    speaker = Host(0, port)
    peer = Host(1, port, progress={"checkpoint_step": 7, "checkpoint_at": 1.0})
    try:
        assert peer.watched.wait(10.0)
        wait_for(lambda: speaker.checkpoints or None, timeout=10, what="the peer's checkpoint at worker 0")
        assert speaker.checkpoints[0] == (1, 7)
        peer.link.close()  # hung: no more beats, no bye
        wait_for(lambda: speaker.silent or None, timeout=10, what="worker 0 to report the peer silent")
        assert [who for who, _ in speaker.silent] == [1]
    finally:
        peer.link.close()
        speaker.link.close()


def test_a_peer_that_says_bye_is_not_reported(port: int) -> None:
    """bye: worker 0 stops watching the peer, and reports nothing however long it is quiet."""
    speaker = Host(0, port)
    peer = Host(1, port)
    try:
        assert peer.watched.wait(10.0)
        peer.link.bye()
        wait_for(lambda: speaker.link.watch.watching() == 0 or None, timeout=10, what="worker 0 to take the bye")
        assert speaker.silent == []
    finally:
        speaker.link.close()


def test_a_peer_signing_with_another_key_is_never_acknowledged(port: int) -> None:
    """Another attempt's (or team's) host on the same network: worker 0 takes none of its beats, so it is never
    spoken for and never reported."""
    speaker = Host(0, port)
    stranger = Host(1, port, key=OTHER_KEY)
    try:
        assert not stranger.watched.wait(1.0)
        assert speaker.link.watch.peers == {}
    finally:
        stranger.link.close()
        speaker.link.close()


# -- the gate: who worker 0 even listens to -----------------------------------------------------


def test_the_gate_opens_only_for_the_slices_addresses_and_counts_the_rest() -> None:
    gate = DatagramGate(frozenset({"10.0.0.3"}), per_second=10.0, burst=2.0)
    assert gate.admit("10.0.0.3", 0.0)
    assert not gate.admit("10.9.9.9", 0.0) and not gate.admit("10.9.9.9", 0.0)
    assert gate.refused == {"not from this slice": 2}


def test_the_gate_holds_each_sender_to_its_rate_after_a_burst() -> None:
    gate = DatagramGate(frozenset({"10.0.0.3"}), per_second=10.0, burst=2.0)
    assert [gate.admit("10.0.0.3", 0.0) for _ in range(3)] == [True, True, False]
    assert gate.admit("10.0.0.3", 0.1)  # a tenth of a second: one more
    assert not gate.admit("10.0.0.3", 0.1)
    assert gate.refused == {"over the rate": 2}


def test_refusals_are_said_in_one_line_at_most_once_a_minute() -> None:
    gate = DatagramGate(frozenset(), per_second=1.0)
    assert gate.summary(0.0) is None
    for _ in range(1000):
        gate.admit("10.9.9.9", 1.0)
    assert gate.summary(30.0) is None
    line = gate.summary(60.0)
    assert line is not None and "1000 not from this slice" in line
    assert gate.summary(200.0) is None  # nothing new refused


def test_worker_0_listens_to_the_addresses_of_its_slice_only() -> None:
    assert slice_addresses("a:b:10.0.0.2,a:b:10.0.0.3,a:b:not-an-ip") == frozenset({"10.0.0.2", "10.0.0.3"})


def test_a_flood_from_another_address_never_loses_a_host(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another VM on the network sends worker 0 datagrams as fast as it can: the peer's beats still
    get through (it is never reported silent), the flood is counted, and it writes no log line each."""
    lines: list[str] = []
    monkeypatch.setattr(slice_link, "log", lines.append)
    speaker = Host(0, port, timeout=5.0)  # generous: the flood shares this process's CPU
    peer = Host(1, port, timeout=5.0)
    try:
        assert peer.watched.wait(10.0)
        junk = b"v1=" + b"0" * 64 + b" {}"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flooder:
            flooder.bind(("127.0.0.9", 0))
            for _ in range(20_000):
                flooder.sendto(junk, ("127.0.0.1", port))
        flooded = speaker.link.watch.peers[1]["seq"]
        wait_for(
            lambda: speaker.link.watch.peers[1]["seq"] > flooded or None, timeout=10, what="a beat after the flood"
        )
        assert speaker.silent == []
        assert speaker.link.gate.refused.get("not from this slice", 0) > 0
        assert len(lines) < 5, lines
    finally:
        peer.link.close()
        speaker.link.close()
