"""Posting a notification: https to a public address only, no redirects, short timeouts.

The owner of a job picks the URL, and this runs inside the deployment, next to the metadata
server and private networks. So the host is resolved here, every address it resolves to is
checked (tpujobs.domain.notify_delivery.address_refusal), and the connection goes to the checked
address itself, with TLS verifying the URL's host name: a DNS answer that changes between the
check and the connection cannot move the post. http.client follows no redirect and reads no proxy
variable. Errors never carry the URL (a Slack or Chat URL holds its credential).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from tpujobs.domain.notify import check_webhook_url
from tpujobs.domain.notify_delivery import address_refusal
from tpujobs.engine.errors import PermanentError, TransientError

TIMEOUT_S = 5.0  # per connect and per read: a slow receiver costs a retry, never a stuck instance
MAX_ANSWER_BYTES = 64 * 1024
Resolve = Callable[[str, int], list[str]]


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, for a TCP connection on `port`."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class _PinnedHttp(http.client.HTTPConnection):
    """Plain http (the local stack's loopback receivers only) to an address checked beforehand."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHttps(http.client.HTTPSConnection):
    """https to an address checked beforehand; the certificate must still name the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float, tls: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self.address, self.tls = address, tls

    def connect(self) -> None:
        raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(raw, server_hostname=self.host)


class HttpWebhookPoster:
    """The WebhookPoster port on http.client; `allow_loopback` (http to loopback) on the local stack only."""

    def __init__(self, *, allow_loopback: bool = False, timeout_s: float = TIMEOUT_S, resolve: Resolve = resolve_host):
        self.allow_loopback = allow_loopback
        self.timeout_s = timeout_s
        self.resolve = resolve
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
        address = self.checked_address(host, port, https=parts.scheme == "https")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme == "https":
            connection: http.client.HTTPConnection = _PinnedHttps(host, port, address, self.timeout_s, self.tls)
        else:
            connection = _PinnedHttp(host, port, address, self.timeout_s)
        try:
            connection.request("POST", target, body=body, headers={"User-Agent": "tpujobs-notify", **headers})
            answer = connection.getresponse()
            answer.read(MAX_ANSWER_BYTES)
        except (OSError, http.client.HTTPException) as error:
            raise TransientError(f"the post failed: {type(error).__name__}: {_short(error)}") from None
        finally:
            connection.close()
        _judge(answer.status)

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
