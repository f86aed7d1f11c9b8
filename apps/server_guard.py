"""What `specedge serve` refuses before a request reaches its route: cross-site requests, a missing or wrong API key,
bodies it will not parse, and calls beyond its queue (Admission).

A web page the user opens can send requests to a server on 127.0.0.1 (a "simple" POST needs no CORS preflight), and
with DNS rebinding (attacker.example re-resolved to 127.0.0.1) read the answers too, since the browser then sees one
origin. Three checks close that, as Ollama and browsers expect:

  Host     without an API key, the Host header must name this server: localhost, 127.0.0.0/8 or [::1] (any port),
           the --host it was started with, or, bound to every address (0.0.0.0 / ::), an IP address. A rebound
           name is none of these (403). With a key the key protects every route but /health, and a page cannot
           know it, so any Host is accepted (reverse proxies and DNS names keep working).
  Origin   a request carrying a browser Origin header is refused (403) unless --cors-origin lists that origin or
           `*`; listed origins get CORS headers (Starlette's CORSMiddleware, preflight OPTIONS included).
  body     a POST body must be `Content-Type: application/json` (415; a charset parameter is fine): a page can
           post text/plain without a preflight, never application/json. Its [ / { nesting is bounded (400 beyond
           MAX_JSON_DEPTH), counted without recursion before json.loads, whose C scanner recurses per level.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import re
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from .openai_errors import APIError, invalid

LOOPBACK_NAME = "localhost"
WILDCARDS = ("0.0.0.0", "::", "")
MAX_JSON_DEPTH = 128  # serde_json's default; a request's messages, tools and schemas nest far less

# a JSON string, its closing quote optional: an unterminated one matches to the end in one pass (never rescanned)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def host_name(host: str) -> str:
    """The name in a Host header or a --host value: port, IPv6 brackets and a trailing dot removed, lower case.
    >>> host_name("[::1]:8000"), host_name("LocalHost.:80"), host_name("127.0.0.1")
    ('::1', 'localhost', '127.0.0.1')"""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class SitePolicy:
    """Which Host and Origin headers the server answers (module docstring)."""
    bind_host: str = "127.0.0.1"  # the --host the server was started with
    check_host: bool = True  # False with an API key
    cors_origins: tuple[str, ...] = ()

    def host_allowed(self, host: str | None) -> bool:
        if not self.check_host or host is None:  # no Host at all: HTTP/1.0, never a browser
            return True
        name, bind = host_name(host), host_name(self.bind_host)
        ip = _ip(name)
        return name == LOOPBACK_NAME or (ip is not None and ip.is_loopback) or name == bind or \
            (bind in WILDCARDS and ip is not None)

    def origin_allowed(self, origin: str | None) -> bool:
        return origin is None or "*" in self.cors_origins or origin in self.cors_origins

    def problem(self, host: str | None, origin: str | None) -> APIError | None:
        """The 403 for a request with these headers, or None when it may go on."""
        if not self.host_allowed(host):
            return APIError(403, f"Host {host!r} does not name this server: without an API key it answers only "
                            f"requests addressed to localhost, 127.0.0.1 or [::1] (or its --host {self.bind_host}), "
                            "so that a web page cannot reach it under another name (DNS rebinding); use "
                            "http://127.0.0.1:<port>, or start the server with --api-key to accept any Host",
                            code="host_not_allowed")
        if not self.origin_allowed(origin):
            listed = ", ".join(self.cors_origins) or "none"
            return APIError(403, f"Origin {origin!r} is not allowed: browser pages may call this server only from "
                            f"the origins given with --cors-origin (now: {listed}); start it with --cors-origin "
                            f"{origin} to allow this one", code="origin_not_allowed")
        return None


class SiteGuard:
    """ASGI middleware, outside CORS: answers 403 (OpenAI's error JSON) for a request SitePolicy refuses, and
    reports it to `refused(path)` (the server's metrics)."""

    def __init__(self, app, policy: SitePolicy, refused: Callable[[str], None] = lambda path: None) -> None:
        self.app, self.policy, self.refused = app, policy, refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            error = self.policy.problem(headers.get("host"), headers.get("origin"))
            if error is not None:
                self.refused(scope["path"])
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_content_type(value: str | None) -> None:
    """requires: a POST's Content-Type. Raises 415 unless it is application/json (parameters such as charset
    allowed)."""
    if (value or "").partition(";")[0].strip().lower() == "application/json":
        return
    got = f"got {value!r}" if value else "none was sent"
    raise APIError(415, f"the body must be JSON sent with 'Content-Type: application/json' ({got}): set that header "
                   "(curl: -H 'Content-Type: application/json'); other types are refused because a web page may "
                   "post them to this server without the browser asking it first", code="unsupported_media_type")


def json_depth(data: bytes) -> int:
    """The deepest [ / { nesting of a JSON text, brackets inside strings skipped; linear, no recursion.
    >>> json_depth(b'{"a": [1, {"b": "]]]"}]}'), json_depth(b'"[[["'), json_depth(b'[[[')
    (3, 0, 3)"""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    b = np.frombuffer(brackets, np.uint8)
    return int(np.cumsum(np.where((b == ord("[")) | (b == ord("{")), 1, -1)).max())


def check_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raises 400 when the body nests arrays and objects deeper than `limit`."""
    depth = json_depth(data)
    if depth > limit:
        raise APIError(400, f"the body nests arrays and objects {depth} levels deep, more than the {limit} this "
                       "server reads: flatten it (a JSON schema can name nested parts in $defs and $ref them)",
                       code="json_too_deep")


def check_api_key(headers: Headers, key: str | None) -> None:
    """Raises 401 unless `key` is None or the request sends 'Authorization: Bearer <key>'."""
    if key is None:
        return
    auth = headers.get("authorization", "")
    if not auth:
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>' with the key given "
                       "to specedge serve (--api-key or SPECEDGE_API_KEY)", code="invalid_api_key")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise APIError(401, "invalid API key: send 'Authorization: Bearer <key>' with the key the server was "
                       "started with (--api-key or SPECEDGE_API_KEY)", code="invalid_api_key")


async def read_json(request: Request, limit: int) -> dict:
    """The request body as a JSON object: sent as application/json (415 otherwise), at most `limit` bytes long (413
    beyond), nested at most MAX_JSON_DEPTH deep (400 beyond)."""
    check_content_type(request.headers.get("content-type"))
    too_big = APIError(413, f"request body larger than {limit} bytes: shorten the prompt, or start the server "
                       "with a larger --max-request-bytes", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise too_big
    check_depth(bytes(data))
    try:
        body = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and an integer over 4300 digits
        raise invalid(f"the body is not valid JSON ({e}): send a JSON object with "
                      "Content-Type: application/json") from None
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    return body


class Admission:
    """At most `limit` calls in flight (running or waiting for the engine); thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit, self.n, self._lock = limit, 0, threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self.n >= self.limit:
                return False
            self.n += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.n -= 1
