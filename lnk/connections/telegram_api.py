"""Telegram's Bot API, as the bridge speaks it: a few methods, bounded, typed where they arrive.

Each call is ``POST {api}/bot{token}/{method}`` with a JSON body; the answer is
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code", "description",
"parameters": {"retry_after"}}`` (core.telegram.org/bots/api).  An answer is read
up to :data:`MAX_ANSWER` bytes and an update is checked field by field here
(:func:`parse_update`), so nothing past this module trusts Telegram's JSON.

Three ways a call fails, because the bridge acts differently on each:

* :class:`ApiError`: Telegram answered no (409 another poller, 429 too many
  requests with ``retry_after``, 400/403 a chat that is gone); the call did nothing.
* :class:`Unreachable`: no connection was made, so the request never left.
* :class:`Unsure`: the request left and the answer didn't come whole: it may have
  been carried out.  A sendMessage that ends so is never sent again ("unknown").

The token is in the URL's path: no error text here ever holds the URL.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from lnk.errors import TransportError

MAX_ANSWER = 4 << 20  # a getUpdates of 16 updates of 4,096 characters fits many times
MAX_TEXT_IN = 16_384  # code points of an incoming text the bridge hands on (Telegram: 4,096)
MAX_TEXT_OUT = 4096  # code points of one sendMessage (TDLib's utf8_length)
MAX_NAME = 128


class ApiError(TransportError):
    def __init__(self, code: int, description: str, retry_after: int = 0) -> None:
        super().__init__(f"Telegram answered {code}: {description[:300]}")
        self.code, self.description, self.retry_after = code, description, retry_after


class TooLarge(ApiError):
    """An answer over MAX_ANSWER bytes; ``head`` is its first bytes (where an update's ID is)."""

    def __init__(self, head: bytes) -> None:
        super().__init__(200, f"an answer over {MAX_ANSWER} bytes")
        self.head = head


class Unreachable(TransportError):
    """No connection: the request was not sent."""


class Unsure(TransportError):
    """The request was sent; its answer didn't come whole: it may have been carried out."""


@dataclass(frozen=True)
class Update:
    """One update, as far as the bridge looks: a text message's chat, sender and text."""

    update_id: int
    kind: str  # "message", or the update's other field ("edited_message", ...), or "?"
    chat_id: int = 0
    chat_type: str = ""
    sender_id: int = 0
    sender_name: str = ""
    text: str | None = None  # None: not a text message
    too_long: int = 0  # the text's length in code points when over MAX_TEXT_IN (text None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_update(doc: object) -> Update | None:
    """An update checked field by field, or None when it has no update_id (not one)."""
    if not isinstance(doc, dict):
        return None
    uid = _int(doc.get("update_id"))
    if uid is None or uid < 0:
        return None
    kinds = [k for k in doc if k != "update_id"]
    kind = str(kinds[0])[:40] if kinds else "?"
    msg = doc.get("message")
    if kind != "message" or not isinstance(msg, dict):
        return Update(uid, kind)
    chat = msg.get("chat") if isinstance(msg.get("chat"), dict) else {}
    sender = msg.get("from") if isinstance(msg.get("from"), dict) else {}
    assert isinstance(chat, dict) and isinstance(sender, dict)
    chat_type = chat.get("type")
    name = sender.get("first_name")
    text = msg.get("text")
    too_long = 0
    if isinstance(text, str) and len(text) > MAX_TEXT_IN:
        too_long, text = len(text), None
    return Update(
        uid,
        kind,
        chat_id=_int(chat.get("id")) or 0,
        chat_type=chat_type[:20] if isinstance(chat_type, str) else "",
        sender_id=(_int(sender.get("id")) or 0) if sender.get("is_bot") is not True else 0,
        sender_name=name[:MAX_NAME] if isinstance(name, str) else "",
        text=text if isinstance(text, str) else None,
        too_long=too_long,
    )


def split_text(text: str, limit: int = MAX_TEXT_OUT) -> list[str]:
    """``text`` in pieces of at most ``limit`` code points, cut at a line's end or a space
    when one is in the piece's last quarter; no piece empty or only whitespace."""
    out: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        cut = limit
        for sep in ("\n", " "):
            at = rest.rfind(sep, limit * 3 // 4, limit)
            if at > 0:
                cut = at
                break
        piece, rest = rest[:cut].rstrip(), rest[cut:].lstrip()
        if piece:
            out.append(piece)
    if rest.strip():
        out.append(rest)
    return out or ["(an empty answer)"]


class BotApi:
    """One bot's API: ``call`` and the methods the bridge uses; :meth:`abort` ends a call
    under way from another thread (a long poll, at the bridge's stop)."""

    def __init__(self, api: str, token: str) -> None:
        u = urllib.parse.urlsplit(api)
        self._https = u.scheme == "https"
        self._host = u.hostname or ""
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/") + "/bot" + urllib.parse.quote(token, safe=":")
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            ctx = ssl.create_default_context()
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def abort(self) -> None:
        with self._lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def call(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """The method's result, or ApiError / Unreachable / Unsure."""
        conn = self._connection(timeout)
        with self._lock:
            self._conn = conn
        body = json.dumps(params).encode()
        try:
            try:
                conn.connect()
            except OSError as e:
                raise Unreachable(f"the Bot API does not answer ({type(e).__name__})") from None
            try:
                conn.request(
                    "POST",
                    f"{self._prefix}/{method}",
                    body=body,
                    headers={"Content-Type": "application/json"},
                )
                resp = conn.getresponse()
                raw = resp.read(MAX_ANSWER + 1)
            except (OSError, http.client.HTTPException) as e:
                raise Unsure(
                    f"{method}: the answer did not come whole ({type(e).__name__})"
                ) from None
        finally:
            with self._lock:
                self._conn = None
            conn.close()
        if len(raw) > MAX_ANSWER:
            raise TooLarge(raw[:4096])
        try:
            doc = json.loads(raw)
        except ValueError:
            raise Unsure(f"{method}: the answer is not JSON (HTTP {resp.status})") from None
        if not isinstance(doc, dict):
            raise Unsure(f"{method}: the answer is not a JSON object")
        if doc.get("ok") is True and "result" in doc:
            return doc["result"]
        code = _int(doc.get("error_code")) or resp.status
        params_ = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
        assert isinstance(params_, dict)
        retry = _int(params_.get("retry_after")) or 0
        desc = doc.get("description")
        raise ApiError(code, desc if isinstance(desc, str) else "no description", max(0, retry))

    def get_me(self, timeout: float = 20.0) -> dict[str, Any]:
        me = self.call("getMe", {}, timeout)
        if not isinstance(me, dict) or _int(me.get("id")) is None or me.get("is_bot") is not True:
            raise ApiError(200, "getMe did not describe a bot")
        return me

    def get_updates(self, offset: int, timeout: int, limit: int = 16) -> list[Update | None]:
        """Updates from ``offset`` on (confirming every smaller one); an entry that is not an
        update is None (its place kept, so the caller can log it)."""
        params = {"offset": offset, "timeout": timeout, "limit": limit}
        result = self.call("getUpdates", params, timeout + 15.0)
        if not isinstance(result, list):
            raise Unsure("getUpdates: the result is not a list")
        return [parse_update(u) for u in result]

    def send_message(self, chat_id: int, text: str, timeout: float = 20.0) -> int:
        """Send one piece (at most MAX_TEXT_OUT code points); the message's ID."""
        msg = self.call("sendMessage", {"chat_id": chat_id, "text": text}, timeout)
        mid = _int(msg.get("message_id")) if isinstance(msg, dict) else None
        if mid is None:
            raise Unsure("sendMessage: the answer holds no message_id")
        return mid
