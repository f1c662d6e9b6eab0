"""The agent's model route: ``/.lnk/model/...`` on its proxy, rebuilt, never forwarded.

The harness holds a placeholder key and sends its model requests to the
proxy in origin form; the proxy adds the real key outside the sandbox.  A
request that reaches the real key is one lnk built, from what it checked:

* the method is ``POST`` or ``GET`` (405 otherwise: a ``TRACE`` echoes the key);
* the path is normalised before the prefix check: no ``.`` or ``..``
  segment, no empty one (``//``), no backslash and no percent-encoded dot,
  slash, backslash or NUL, and it must lie under the ``[model] base_url``'s path;
* the body is one ``Content-Length`` (no ``Transfer-Encoding``), at most
  ``MAX_MODEL_BODY`` bytes, read within the connection's deadline;
* the outgoing head is the request line, ``Host`` (the model's), the key,
  ``Content-Length`` and ``Connection: close``, then only the headers of
  :data:`FORWARDED` (their names and values already parsed strictly).
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from lnk.runtime.httphead import BadRequest, Head, content_length

PREFIX = "/.lnk/model"
MAX_MODEL_BODY = 32 << 20
METHODS = ("POST", "GET")
FORWARDED = (
    "content-type",
    "accept",
    "accept-encoding",
    "user-agent",
    "openai-beta",
    "anthropic-version",
    "anthropic-beta",
)
FORWARDED_PREFIXES = ("x-stainless-",)
_ESCAPED = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)


class Refusal(ValueError):
    """A model request refused: ``code`` and ``reason`` for the answer, the message why."""

    def __init__(self, code: int, reason: str, why: str) -> None:
        super().__init__(why)
        self.code, self.reason = code, reason


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int
    tls: bool
    base_path: str  # "" or "/v1": no trailing slash

    @classmethod
    def of(cls, url: str) -> Upstream:
        u = urlsplit(url)
        tls = u.scheme == "https"
        return cls(u.hostname or "", u.port or (443 if tls else 80), tls, u.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        return self.host if self.port == (443 if self.tls else 80) else f"{self.host}:{self.port}"


def model_path(target: str, up: Upstream) -> str:
    """The path (and query) to ask the model for, or Refusal (see module doc)."""
    rest = target[len(PREFIX) :] or "/"
    path, sep, query = rest.partition("?")
    if not path.startswith("/") or "\\" in path or _ESCAPED.search(path):
        raise Refusal(400, "Bad Request", "the model path is not a plain path")
    segments = path.split("/")[1:]
    if any(s in ("", ".", "..") for s in segments[:-1]) or segments[-1] in (".", ".."):
        raise Refusal(400, "Bad Request", "the model path has an empty, . or .. segment")
    if up.base_path and path != up.base_path and not path.startswith(up.base_path + "/"):
        raise Refusal(403, "Forbidden", "only the model's own API is reached this way")
    return path + sep + query


def outgoing_head(head: Head, path: str, up: Upstream, key: str | None, length: int) -> bytes:
    """The head lnk sends the model: built from what it checked (see module doc)."""
    lines = [f"{head.method} {path} HTTP/1.1", f"Host: {up.host_header}"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    for name, value in head.headers:
        low = name.lower()
        if low in FORWARDED or low.startswith(FORWARDED_PREFIXES):
            lines.append(f"{name}: {value}")
    if length or head.method == "POST":
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def check(head: Head, up: Upstream) -> tuple[str, int]:
    """The path to ask and the body's length, or Refusal."""
    if head.method not in METHODS:
        raise Refusal(405, "Method Not Allowed", f"the model route takes {' and '.join(METHODS)}")
    path = model_path(head.target, up)
    try:
        length = content_length(head)
    except BadRequest as e:
        raise Refusal(400, "Bad Request", str(e)) from e
    if length > MAX_MODEL_BODY:
        raise Refusal(413, "Too Large", "the model request is too large")
    return path, length


def read_body(conn: socket.socket, rest: bytes, length: int, deadline: float) -> bytes | None:
    """The body's ``length`` bytes (``rest`` came with the head), or None if the client
    closed or ran out of time."""
    body = bytearray(rest[:length])
    while len(body) < length:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(min(1 << 20, length - len(body)))
        except OSError:
            return None
        if not chunk:
            return None
        body += chunk
    return bytes(body)
