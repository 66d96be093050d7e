"""The HTTP plumbing the local stand-ins for Google (TPU simulator, Secret Manager, Cloud Logging) share: reading a
request, routing it (werkzeug), answering JSON or Google's error JSON, and serving until signalled.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter, Map, Rule

from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.messages import BadBody

_log = logging.getLogger(__name__)

Query = dict[str, list[str]]
Json = dict[str, Any]
Api = TypeVar("Api")
Endpoint = TypeVar("Endpoint")


class _Id(BaseConverter):
    """`<id:name>`: one path segment without a colon, so `{name}:verb` leaves the verb out."""

    regex = "[^/:]+"


class Routes(Generic[Endpoint]):
    """A REST API's paths, as werkzeug rules (`/v1/projects/<id:project>/secrets`), each with
    its method and endpoint; a path matches whole, and its parameters come percent-decoded."""

    def __init__(self, rules: list[tuple[str, str, Endpoint]]) -> None:
        self._endpoints = [endpoint for _, _, endpoint in rules]
        routes = Map(
            [Rule(path, methods=[method], endpoint=index) for index, (method, path, _) in enumerate(rules)],
            converters={"id": _Id},
            strict_slashes=False,  # a trailing slash is another path, never a redirect
            merge_slashes=False,
        )
        self._adapter = routes.bind("localhost")

    def match(self, method: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
        """The endpoint and parameters of `method path`, or None when no rule has both."""
        try:
            index, params = self._adapter.match(path, method=method)
        except HTTPException:  # NotFound, or MethodNotAllowed: the caller says which is which
            return None
        return self._endpoints[index], {key: unquote(value) for key, value in params.items()}


def google_answer(
    call: Callable[[], tuple[int, Json]], service: str, request: str, *, tell_failures: bool
) -> tuple[int, Json]:
    """`call`'s status and JSON, or Google's error JSON for what it raised: a SimulatorError as
    itself, a BadBody as INVALID_ARGUMENT, anything else as INTERNAL (a bug: logged, and the
    server keeps serving). `tell_failures`: a bug's message and traceback may be shown; False
    where they might quote a secret, so only its type is."""
    try:
        return call()
    except SimulatorError as error:
        refused = error
    except BadBody as error:
        refused = SimulatorError(Code.INVALID_ARGUMENT, str(error))
    except Exception as error:
        if tell_failures:
            _log.exception("%s failed on %s", service, request)
        else:
            _log.error("%s failed on %s: %s", service, request, type(error).__name__)
        what = repr(error) if tell_failures else f"{type(error).__name__}."
        refused = SimulatorError(Code.INTERNAL, f"{service} bug: {what}")
    return refused.http_status, refused.to_json()


class ApiServer(ThreadingHTTPServer, Generic[Api]):
    """A threading HTTP server that hands each request to one API object."""

    daemon_threads = True  # an idle keep-alive connection must not hold up stop()

    def __init__(self, address: tuple[str, int], api: Api, handler: type[JsonRequestHandler]) -> None:
        self.api = api
        super().__init__(address, handler)


class BackgroundApi(Generic[Api]):
    """One API object served on a local port by a daemon thread: the stand-ins' start, url and stop."""

    def __init__(self, address: tuple[str, int], handler: type[JsonRequestHandler], what: str) -> None:
        self._address = address
        self._handler = handler
        self._what = what  # "the local Secret Manager": for errors and the thread's name
        self._http: ApiServer[Api] | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError(f"{self._what} is not started")
        host, port = self._http.socket.getsockname()[:2]  # the bound address, never bytes for TCP
        return f"http://{host}:{port}"

    def serve(self, api: Api) -> str:
        """Bind and serve `api` in the background; the base URL (a client's api_endpoint)."""
        if self._http is not None:
            raise RuntimeError(f"{self._what} is already started")
        self._http = ApiServer(self._address, api, self._handler)
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name=f"tpujobs {self._what}", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._http is None:
            return
        http, self._http = self._http, None
        http.shutdown()
        http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class JsonRequestHandler(BaseHTTPRequestHandler):
    """Reads a request whole and hands it to `answer`; subclasses say what the API is."""

    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection
    disable_nagle_algorithm = True  # else headers and body wait out a delayed ACK: 40 ms a call
    timeout = 60
    server: ApiServer[Any]

    def do_GET(self) -> None:
        self._read("GET")

    def do_POST(self) -> None:
        self._read("POST")

    def do_DELETE(self) -> None:
        self._read("DELETE")

    def do_PATCH(self) -> None:
        self._read("PATCH")

    def _read(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        self.answer(method, url.path, parse_qs(url.query, keep_blank_values=True), body)

    def answer(self, method: str, path: str, query: Query, body: bytes) -> None:
        raise NotImplementedError

    def send_json(self, status: int, payload: Any) -> None:
        self.send(status, json.dumps(payload).encode("utf-8"), "application/json; charset=UTF-8")

    def send(self, status: int, data: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # The request line only (method, path, status): paths may name secrets, never values.
        _log.debug("%s " + format, self.address_string(), *args)


def serve_until_signalled(start: Callable[[], str], stop: Callable[[], None], name: str) -> int:
    """Start a server, print where it listens, and serve until SIGTERM or SIGINT."""
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    url = start()
    print(f"{name} listening on {url}", flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        stop()
    return 0
