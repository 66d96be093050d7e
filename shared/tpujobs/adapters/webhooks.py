"""Posting a notification: https to a public address only, no redirects, one total deadline.

The owner of a job picks the URL, and this runs inside the deployment, next to the metadata
server and private networks. So the host is resolved here, every address it resolves to is
checked (tpujobs.domain.notify_delivery.address_refusal), and the connection goes to the checked
address itself, with TLS verifying the URL's host name: a DNS answer that changes between the
check and the connection cannot move the post. http.client follows no redirect and reads no proxy
variable. Errors never carry the URL (a Slack or Chat URL holds its credential).

A post has one deadline (DEADLINE_S), from its start to the last byte of the answer, connection and
TLS handshake included: every socket operation waits at most what is left of it, so a receiver
that trickles its answer a byte at a time is cut at the deadline like a silent one. And each host
has a lane (`HostLanes`): at most PER_HOST posts to one host are in flight in an instance, so posts
to a slow host hold a bounded share of the instance and never the slots other hosts' posts need.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import SplitResult, urlsplit

from tpujobs.domain.notify import check_webhook_url
from tpujobs.domain.notify_delivery import address_refusal
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.notifications import ReceiverBusy

DEADLINE_S = 10.0  # a whole post, connection included: a slow receiver costs a retry, never a stuck slot
TIMEOUT_S = 5.0  # at most per connect, send or read, and never past the deadline
PER_HOST = 4  # posts to one host in flight at once in an instance (infra/functions.tf: notify runs 16)
LANE_WAIT_S = 1.0  # how long a post waits for its host's lane before it is left for a later try
MAX_ANSWER_BYTES = 64 * 1024
Resolve = Callable[[str, int], list[str]]
Clock = Callable[[], float]


class DeadlinePassed(TimeoutError):
    """The post's deadline passed before the receiver answered in full."""


class HostLanes:
    """At most `per_host` posts in flight per host; a post that finds its host's lane full for
    `wait_s` is not sent (ReceiverBusy), so a slow host cannot take the instance's slots."""

    def __init__(self, per_host: int = PER_HOST, wait_s: float = LANE_WAIT_S) -> None:
        self.per_host, self.wait_s = per_host, wait_s
        self._lanes: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()

    @contextmanager
    def lane(self, host: str) -> Iterator[None]:
        with self._lock:
            lane = self._lanes.setdefault(host.lower(), threading.BoundedSemaphore(self.per_host))
        if not lane.acquire(timeout=self.wait_s):
            raise ReceiverBusy(f"{self.per_host} posts to the webhook's host are in flight: it is tried later")
        try:
            yield
        finally:
            lane.release()


class _Deadline:
    """A connected socket (plain or TLS) whose every operation waits at most what is left before
    `deadline` (and at most `per_op` seconds): http.client reads and writes through it."""

    def __init__(self, sock: socket.socket, deadline: float, per_op: float, clock: Clock) -> None:
        self._sock, self.deadline, self.per_op, self.clock = sock, deadline, per_op, clock

    def _arm(self) -> None:
        left = self.deadline - self.clock()
        if left <= 0:
            raise DeadlinePassed("the post passed its deadline")
        self._sock.settimeout(min(left, self.per_op))

    def sendall(self, data: Any) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._arm()
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BufferedReader:
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]  # duck-typed as socket

    def _decref_socketios(self) -> None:
        """What SocketIO calls when its file closes; the connection closes the socket itself."""

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


def _connected(address: str, port: int, deadline: float, per_op: float, clock: Clock) -> socket.socket:
    left = deadline - clock()
    if left <= 0:
        raise DeadlinePassed("the post passed its deadline before connecting")
    return socket.create_connection((address, port), min(left, per_op))


def _handshake(tls: ssl.SSLContext, raw: socket.socket, host: str, deadline: float, clock: Clock) -> ssl.SSLSocket:
    """TLS over `raw`, the whole handshake within the deadline (a trickling peer cannot stretch it)."""
    raw.setblocking(False)
    sock = tls.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
    while True:
        try:
            sock.do_handshake()
            return sock
        except ssl.SSLWantReadError:
            readable, writable = [sock], []
        except ssl.SSLWantWriteError:
            readable, writable = [], [sock]
        left = deadline - clock()
        if left <= 0 or not any(select.select(readable, writable, [], left)):
            sock.close()
            raise DeadlinePassed("the TLS handshake passed the post's deadline")


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, for a TCP connection on `port`."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class _Pinned(http.client.HTTPConnection):
    """http, or https with `tls`, to an address checked beforehand (plain http: the local stack's
    loopback receivers only); the certificate must still name the URL's host. Every operation,
    from the connection to the answer's last byte, ends by `deadline`."""

    def __init__(
        self, host: str, port: int, address: str, tls: ssl.SSLContext | None, deadline: float, per_op: float,
        clock: Clock,
    ) -> None:  # fmt: skip
        super().__init__(host, port, timeout=per_op)
        self.address, self.tls, self.deadline, self.per_op, self.clock = address, tls, deadline, per_op, clock

    def connect(self) -> None:
        raw = _connected(self.address, self.port, self.deadline, self.per_op, self.clock)
        sock = raw if self.tls is None else _handshake(self.tls, raw, self.host, self.deadline, self.clock)
        self.sock = _Deadline(sock, self.deadline, self.per_op, self.clock)


class HttpWebhookPoster:
    """The WebhookPoster port on http.client; `allow_loopback` (http to loopback) on the local stack only."""

    def __init__(
        self, *, allow_loopback: bool = False, timeout_s: float = TIMEOUT_S, deadline_s: float = DEADLINE_S,
        resolve: Resolve = resolve_host, lanes: HostLanes | None = None, clock: Clock = time.monotonic,
    ) -> None:  # fmt: skip
        self.allow_loopback = allow_loopback
        self.timeout_s = min(timeout_s, deadline_s)
        self.deadline_s = deadline_s
        self.resolve = resolve
        self.lanes = lanes or HostLanes()
        self.clock = clock
        self.tls = ssl.create_default_context()

    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        try:  # a secret's URL was never checked as a spec's is: the same rules, here
            check_webhook_url(url, http_by_name=False)
        except ValueError as error:
            raise PermanentError(f"the {error}") from None
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "http" and not self.allow_loopback:
            raise PermanentError("the webhook must be https:// (plain http only on the local stack)")
        port = port or (443 if parts.scheme == "https" else 80)
        with self.lanes.lane(host):
            deadline = self.clock() + self.deadline_s
            address = self.checked_address(host, port, https=parts.scheme == "https")
            tls = self.tls if parts.scheme == "https" else None
            connection = _Pinned(host, port, address, tls, deadline, self.timeout_s, self.clock)
            status = self._send(connection, parts, headers, body, deadline)
        _judge(status)

    def _send(
        self, connection: _Pinned, parts: SplitResult, headers: Mapping[str, str], body: bytes, deadline: float
    ) -> int:
        """POST and read the answer, all by `deadline`; the answer's status."""
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request("POST", target, body=body, headers={"User-Agent": "tpujobs-notify", **headers})
            answer = connection.getresponse()
            answer.read(MAX_ANSWER_BYTES)
        except DeadlinePassed:
            raise TransientError(f"the webhook did not answer within {self.deadline_s:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            if self.clock() >= deadline:
                raise TransientError(f"the webhook did not answer within {self.deadline_s:g} s") from None
            raise TransientError(f"the post failed: {type(error).__name__}: {_short(error)}") from None
        finally:
            connection.close()
        return answer.status

    def checked_address(self, host: str, port: int, *, https: bool) -> str:
        """The address to connect to; PermanentError if any address the host resolves to is refused."""
        try:
            addresses = self.resolve(host, port)
        except (OSError, UnicodeError) as error:
            raise TransientError(f"the webhook's host did not resolve: {type(error).__name__}") from None
        if not addresses:
            raise TransientError("the webhook's host resolved to no address")
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            refusal = address_refusal(address, allow_loopback=self.allow_loopback)
            if refusal is not None:
                raise PermanentError(f"the webhook's host resolves to {refusal}: refused")
            if not https and not address.is_loopback:
                raise PermanentError("plain http goes to loopback only")
        return addresses[0]


def _judge(status: int) -> None:
    """A 2xx answer delivered; a redirect, or a 4xx other than 408 and 429, is final; the rest may pass."""
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PermanentError(f"the webhook answered {status}: redirects are not followed")
    if status in (408, 429) or status >= 500:
        raise TransientError(f"the webhook answered {status}")
    raise PermanentError(f"the webhook answered {status}")


def _short(error: BaseException) -> str:
    return str(error)[:160]
