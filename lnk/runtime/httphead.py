"""A request head as the agent's proxy takes it: read within a deadline, parsed strictly.

What the sandbox sends is hostile until parsed, and a head that two readers
could split differently is how a second request gets smuggled behind a
first.  So a head is taken only in one reading:

* the whole head within ``deadline`` seconds from the connection's accept (a
  client dripping a byte at a time is cut when it runs out, not per read), at
  most ``MAX_HEAD`` bytes;
* every line ends in CR LF; a bare CR or LF, a control character or a byte
  over 0x7E in the request line or a header, a folded line, a header name
  that is not a token, or a line without a colon is refused;
* ``METHOD SP TARGET SP HTTP/1.x``, the method a token, the target printable.

:class:`BadRequest` says which; the proxy answers it 400 and closes.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass

MAX_HEAD = 64 * 1024
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TARGET = re.compile(rb"^[\x21-\x7e]+$")
_VALUE = re.compile(rb"^[\t\x20-\x7e]*$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")


class BadRequest(ValueError):
    """A request head the proxy does not take; the message says why."""


@dataclass(frozen=True)
class Head:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  # (name as sent, value stripped), in order

    def values(self, name: str) -> list[str]:
        low = name.lower()
        return [v for n, v in self.headers if n.lower() == low]


def read_head(conn: socket.socket, deadline: float, data: bytes = b"") -> tuple[bytes, bytes]:
    """The head's bytes (through the blank line) and what came after them; ``data`` is
    what was read of it already.

    ``deadline`` is a ``time.monotonic()`` instant; TimeoutError past it.
    """
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request head did not come in time")
        conn.settimeout(left)
        chunk = conn.recv(8192)
        if not chunk:
            raise ConnectionError("the client closed before a full request head")
        data += chunk
        if len(data) > MAX_HEAD + 4 and b"\r\n\r\n" not in data[: MAX_HEAD + 4]:
            raise BadRequest("the request head is too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def parse_head(raw: bytes) -> Head:
    """The head's request line and headers, or BadRequest (see module doc)."""
    if b"\n" in raw.replace(b"\r\n", b"") or b"\r" in raw.replace(b"\r\n", b""):
        raise BadRequest("a line of the head ends in a bare CR or LF")
    line, *lines = raw.split(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3:
        raise BadRequest("the request line is not METHOD TARGET HTTP/1.1")
    method, target, version = parts
    if not _TOKEN.match(method) or not _TARGET.match(target) or not _VERSION.match(version):
        raise BadRequest("the request line is not METHOD TARGET HTTP/1.1")
    headers: list[tuple[str, str]] = []
    for h in lines:
        if h[:1] in (b" ", b"\t"):
            raise BadRequest("a folded header line")
        name, colon, value = h.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise BadRequest("a header line is not NAME: VALUE")
        if not _VALUE.match(value):
            raise BadRequest(f"the header {name.decode()} holds a control character")
        headers.append((name.decode(), value.decode().strip(" \t")))
    return Head(method.decode(), target.decode(), version.decode(), tuple(headers))


def content_length(head: Head) -> int:
    """The body's length: one Content-Length of digits, or 0 with none; BadRequest for
    two, a non-number, or any Transfer-Encoding."""
    if head.values("transfer-encoding"):
        raise BadRequest("a request with Transfer-Encoding: send it with a Content-Length")
    lengths = head.values("content-length")
    if len(lengths) > 1:
        raise BadRequest("more than one Content-Length")
    if not lengths:
        return 0
    if not lengths[0].isascii() or not lengths[0].isdigit() or len(lengths[0]) > 15:
        raise BadRequest("Content-Length is not a number")
    return int(lengths[0])
