"""A Telegram Bot API server on loopback, for tests: a stand-in for api.telegram.org.

    from telegram_api import BotApiServer, telegram   # ``telegram``: a started server

    bot = telegram.add_bot("123:ABC", username="lnk_test_bot")
    telegram.user_says("123:ABC", user_id=42, text="hi")   # queued as a message update
    ...  # the code under test calls {telegram.base_url}/bot123:ABC/getUpdates, sendMessage, ...
    telegram.sent("123:ABC")                               # what the bot sent and edited, in order

Requests are ``GET`` or ``POST {base_url}/bot{token}/{method}``, parameters in the query string,
a JSON object or a form-encoded body, method names case-insensitive (core.telegram.org/bots/api,
"Making requests"). Answers are ``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code":
N, "description": ...}`` with HTTP status N; a 429 adds ``"parameters": {"retry_after": N}``
("ResponseParameters") and a Retry-After header. Methods: getMe, getUpdates, setWebhook,
deleteWebhook, getWebhookInfo, sendMessage, editMessageText, sendChatAction; others are 404.
Message texts follow tests/telegram_text.py (4096 code points after markup is removed).

What Telegram does, and where that was found:

* Two overlapping getUpdates: the *earlier* request gets the 409. In tdlib/telegram-bot-api (the
  open-source Bot API server, telegram-bot-api/Client.cpp) ``do_get_updates`` calls
  ``abort_long_poll`` when a request is about to wait (timeout > 0, nothing to return): the
  request already waiting is answered 409 "Conflict: terminated by other getUpdates request; make
  sure that only one bot instance is running" and the new one waits in its place. A newer short
  poll, or one that finds updates at once, ends nobody. ``fail_query_conflict`` sends a 409 at
  once, but holds one that comes within 3 s of the last for 3 s (``conflict_delay`` here). Issue
  trackers show the message whenever a second instance polls (python-telegram-bot #4237,
  pengrad/java-telegram-bot-api #261); until early 2018 it read "Conflict: terminated by other
  long poll or webhook" (rubenlagus/TelegramBots #222; mehtadone/CryptoGramBot #76 saw both).
* setWebhook with a URL ends a waiting getUpdates with 409 "Conflict: terminated by setWebhook
  request"; getUpdates while a webhook is set is 409 "Conflict: can't use getUpdates method while
  webhook is active; use deleteWebhook to delete the webhook first" (same file; "getUpdates": it
  "will not work if an outgoing webhook is set up"). Both go through the same 3 s hold.
* getUpdates ("getUpdates", "Getting updates"): updates with ids >= offset are returned, and a
  call with an offset confirms (forgets) every smaller id; a negative offset keeps only the last
  -offset updates. An offset more than 10 past the next id, or 100000 before the first kept, is
  ignored: the answer starts at the first kept update and nothing is forgotten (tdlib/td
  tddb/td/db/TQueue.cpp ``get``). limit is clamped to 1..100 and timeout to 0..50 (Client.cpp
  ``get_integer_arg``). A bot's ids start at random in 2000001..1e9 (TQueue ``push``). Updates
  are kept until 24 h after the message's date (Client.cpp ``add_new_message``).
  allowed_updates filters updates created after the call (also kept by setWebhook).
* Not modelled: the throttles on repeated identical polls (``process_get_updates_query`` raises
  timeout to 3 and lowers limit to 1), setWebhook's 1 s spacing, webhook delivery, files,
  multipart bodies, inline messages, keyboards beyond comparing reply_markup in edits.
"""

from __future__ import annotations

import json
import random
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from telegram_text import MAX_TEXT, BadRequest, entity, formatted_text, json_param, utf16

MAX_BODY = 1 << 20
KEEP = 86400
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
BY_WEBHOOK = "Conflict: terminated by setWebhook request"
WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
ACTIONS = {"typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
           "record_audio", "upload_audio", "upload_document", "choose_sticker", "find_location",
           "pick_up_location", "record_video_note", "upload_video_note", "cancel"}  # fmt: skip
Json = dict[str, Any]
Params = dict[str, str]


class ApiError(Exception):
    def __init__(self, code: int, description: str, *, delay: float = 0.0, retry: int = 0) -> None:
        super().__init__(description)
        self.code, self.description, self.delay, self.retry = code, description, delay, retry


def _int(value: str | None, default: int) -> int:
    """The leading integer of value (0 if none), as td::to_integer reads it."""
    m = re.match(r"\s*([+-]?\d+)", value or "")
    return default if not value else int(m[1]) if m else 0


def _true(p: Params, name: str) -> bool:
    return p.get(name, "").lower() in ("true", "1")


def _error(code: int, description: str, retry_after: int = 0) -> Json:
    answer: Json = {"ok": False, "error_code": code, "description": description}
    return answer | ({"parameters": {"retry_after": retry_after}} if retry_after else {})


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


@dataclass
class _Poll:
    """A getUpdates request waiting; ``ended`` is the 409 that ended it."""

    ended: str = ""
    delay: float = 0.0


@dataclass(eq=False)
class Bot:
    """One bot on the server, the handle ``add_bot`` returns."""

    server: BotApiServer = field(repr=False)
    token: str
    id: int
    username: str
    first_name: str
    next_update_id: int
    updates: list[tuple[int, int, Json]] = field(default_factory=list)  # id, expiry, update
    allowed: set[str] = field(default_factory=set)  # empty: the default types
    webhook: Json = field(default_factory=dict)
    poll: _Poll | None = None
    next_conflict: float = 0.0
    chats: dict[int, Json] = field(default_factory=dict)
    messages: dict[tuple[int, int], Json] = field(default_factory=dict)
    markups: dict[tuple[int, int], str] = field(default_factory=dict)
    next_message_id: dict[int, int] = field(default_factory=dict)
    log: list[Json] = field(default_factory=list)
    calls: list[tuple[str, Params]] = field(default_factory=list)
    faults: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    @property
    def user(self) -> Json:
        return {"id": self.id, "is_bot": True, "first_name": self.first_name,
                "username": self.username}  # fmt: skip

    def user_says(self, **kw: Any) -> Json:
        return self.server.user_says(self.token, **kw)

    def sent(self, chat_id: int | None = None) -> list[Json]:
        return self.server.sent(self.token, chat_id)


class BotApiServer:
    """``start()`` serves on 127.0.0.1 in a thread; ``base_url`` replaces https://api.telegram.org.
    Dates and the 24 h expiry follow ``now`` (unix seconds, settable, or ``advance``); long polls
    and the conflict hold use real time. ``conflict_delay``: how long a 409 that comes within 3 s
    of the last is held (3 s on Telegram; 0 holds none). All state is behind one lock."""

    def __init__(
        self, *, conflict_delay: float = 3.0, seed: int | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.conflict_delay = conflict_delay
        self.host = host
        self.base_url = ""
        self._cond = threading.Condition()
        self._bots: dict[str, Bot] = {}
        self._skew = 0.0
        self._random = random.Random(seed)
        self._stopping = False
        self._httpd: _Http | None = None
        self._thread: threading.Thread | None = None

    # -- test controls ------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return int(time.time() + self._skew)

    @now.setter
    def now(self, value: float) -> None:
        self._skew = value - time.time()

    def advance(self, seconds: float) -> None:
        self._skew += seconds

    def add_bot(
        self, token: str, username: str = "lnk_test_bot", first_name: str = "lnk test",
        *, first_update_id: int | None = None,
    ) -> Bot:  # fmt: skip
        bot_id = _int(token.partition(":")[0], 0)
        if ":" not in token or bot_id <= 0 or len(token) > 80 or "/" in token:
            raise ValueError(f"not a bot token: {token!r}")
        first = first_update_id or self._random.randint(2_000_001, 1_000_000_000)
        with self._cond:
            bot = self._bots[token] = Bot(self, token, bot_id, username, first_name, first)
            return bot

    def user_says(
        self, token: str, *, user_id: int, text: str, chat_id: int | None = None,
        first_name: str = "Ann", chat_type: str = "private", username: str | None = None,
        title: str = "Group", reply_to_message_id: int | None = None,
    ) -> Json:  # fmt: skip
        """Queue a message update from a user, as Telegram would, and return it (without an
        update_id if allowed_updates leaves messages out, as it is then not queued)."""
        with self._cond:
            bot, chat_id = self._bots[token], user_id if chat_id is None else chat_id
            user = {"id": user_id, "is_bot": False, "first_name": first_name}
            user |= {"username": username} if username else {}
            private = {k: v for k, v in user.items() if k != "is_bot"} | {"type": "private"}
            group = {"id": chat_id, "type": chat_type, "title": title}
            chat = bot.chats[chat_id] = private if chat_type == "private" else group
            msg = self._message(bot, chat, user, text, [], reply_to_message_id)
            command = re.match(r"/\w+(@\w+)?", text, re.ASCII)
            if command:
                msg["entities"] = [entity("bot_command", 0, utf16(command[0]))]
            update: Json = {"message": msg}
            if not bot.allowed or "message" in bot.allowed:
                update = {"update_id": bot.next_update_id} | update
                bot.updates.append((bot.next_update_id, msg["date"] + KEEP, update))
                bot.next_update_id += 1
            self._cond.notify_all()
            return _copy(update)  # type: ignore[no-any-return]

    def sent(self, token: str, chat_id: int | None = None) -> list[Json]:
        """Successful sendMessage and editMessageText calls in order, each a dict of ``method``,
        ``chat_id``, ``message_id``, ``text``, ``message`` (as answered) and ``params``."""
        with self._cond:
            return _copy([e for e in self._bots[token].log if chat_id in (None, e["chat_id"])])  # type: ignore[no-any-return]

    def wait_sent(self, token: str, count: int, timeout: float) -> bool:
        """Wait until the bot has sent (or edited) ``count`` messages in all; whether it did."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._bots[token].log) >= count, timeout)

    def pending(self, token: str) -> list[Json]:
        """The updates kept: neither confirmed nor expired."""
        with self._cond:
            return _copy([u for _, _, u in self._kept(self._bots[token])])  # type: ignore[no-any-return]

    def calls(self, token: str, method: str | None = None) -> list[Params]:
        """The parameters of every request to a known method, in order, with ``"method"``."""
        with self._cond:
            calls = self._bots[token].calls
            return [p | {"method": m} for m, p in calls if m == (method or m).lower()]

    def fail_next(self, token: str, method: str, times: int = 1, *, retry_after: int = 1) -> None:
        """The next ``times`` calls of method answer 429 "Too Many Requests: retry after N"."""
        self._fault(token, method, "429", times, retry_after)

    def conflict_next(self, token: str, times: int = 1) -> None:
        """The next ``times`` getUpdates answer 409 as if another poller had taken over."""
        self._fault(token, "getUpdates", "409", times, 0)

    def drop_next(self, token: str, method: str, times: int = 1) -> None:
        """The next ``times`` calls of method are carried out, but the connection closes half-way
        through the answer."""
        self._fault(token, method, "drop", times, 0)

    def _fault(self, token: str, method: str, kind: str, times: int, value: int) -> None:
        with self._cond:
            self._bots[token].faults.setdefault(method.lower(), []).extend([(kind, value)] * times)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._httpd = _Http((self.host, 0), _Handler)
        self._httpd.api = self
        self.base_url = f"http://{self.host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._httpd is not None and self._thread is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)

    def __enter__(self) -> BotApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests -----------------------------------------------------------------------------

    def call(self, path: str, params: Params) -> tuple[int, Json, float, bool]:
        """One request: HTTP status, answer, seconds to hold it, whether to drop it."""
        token, _, method = path.removeprefix("/bot").partition("/")
        method = (method.removeprefix("test/") or params.get("method", "")).lower()
        if not path.startswith("/bot") or "/" in method:
            return 404, _error(404, "Not Found"), 0.0, False
        if ":" not in token or token[0] == "0" or len(token) > 80:
            return 401, _error(401, "Unauthorized: invalid token specified"), 0.0, False
        with self._cond:
            bot = self._bots.get(token)
            handler = getattr(self, "_m_" + method, None)
            if bot is None:
                return 401, _error(401, "Unauthorized"), 0.0, False
            if handler is None:
                return 404, _error(404, "Not Found"), 0.0, False
            bot.calls.append((method, dict(params)))
            kind, value = bot.faults[method].pop(0) if bot.faults.get(method) else ("", 0)
            try:
                if kind == "429":
                    raise ApiError(429, f"Too Many Requests: retry after {value}", retry=value)
                if kind == "409":
                    raise ApiError(409, CONFLICT)
                result, description = handler(bot, params)
            except BadRequest as e:
                return 400, _error(400, f"Bad Request: {e}"), 0.0, kind == "drop"
            except ApiError as e:
                return e.code, _error(e.code, e.description, e.retry), e.delay, kind == "drop"
            answer = {"ok": True, "result": result} | (
                {"description": description} if description else {}
            )
            return 200, _copy(answer), 0.0, kind == "drop"

    def _m_getme(self, bot: Bot, p: Params) -> tuple[Any, str]:
        rights = {"can_join_groups": True, "can_read_all_group_messages": False}
        rights |= {"supports_inline_queries": False, "can_connect_to_business": False}
        return bot.user | rights | {"has_main_web_app": False}, ""

    def _m_getupdates(self, bot: Bot, p: Params) -> tuple[Any, str]:
        if bot.webhook:
            raise ApiError(409, WEBHOOK_ACTIVE, delay=self._conflict_delay(bot))
        offset = _int(p.get("offset"), 0)
        limit = min(max(_int(p.get("limit"), 100), 1), 100)
        timeout = min(max(_int(p.get("timeout"), 0), 0), 50)
        if "allowed_updates" in p:
            bot.allowed = set(json_param(p, "allowed_updates", list, "allowed updates"))
        kept = self._kept(bot)
        if offset < 0:
            del kept[: max(0, len(kept) + offset)]
        head = kept[0][0] if kept else bot.next_update_id
        if offset <= 0 or offset > bot.next_update_id + 10 or offset < head - 100000:
            offset = head
        bot.updates = [u for u in kept if u[0] >= offset]  # confirmed: forgotten
        poll, deadline = _Poll(), time.monotonic() + timeout
        while True:
            found = [u for i, _, u in self._kept(bot) if i >= offset][:limit]
            if found or poll.ended or self._stopping or time.monotonic() >= deadline:
                break
            if bot.poll is not poll:  # abort_long_poll: the request already waiting loses
                if bot.poll is not None:
                    bot.poll.ended, bot.poll.delay = CONFLICT, self._conflict_delay(bot)
                bot.poll = poll
                self._cond.notify_all()
            self._cond.wait(deadline - time.monotonic())
        if bot.poll is poll:
            bot.poll = None
        if poll.ended:
            raise ApiError(409, poll.ended, delay=poll.delay)
        return found, ""

    def _m_setwebhook(self, bot: Bot, p: Params) -> tuple[Any, str]:
        url = p.get("url", "")
        if not url:
            return self._m_deletewebhook(bot, p)
        if not url.lower().startswith("https://"):
            raise BadRequest("bad webhook: An HTTPS URL must be provided for webhook")
        if _true(p, "drop_pending_updates"):
            bot.updates.clear()
        if bot.poll is not None:
            bot.poll.ended, bot.poll.delay = BY_WEBHOOK, self._conflict_delay(bot)
            self._cond.notify_all()
        if "allowed_updates" in p:
            bot.allowed = set(json_param(p, "allowed_updates", list, "allowed updates"))
        was, bot.webhook = bot.webhook.get("url"), {"url": url, "max_connections": 40}
        return True, "Webhook is already set" if was == url else "Webhook was set"

    def _m_deletewebhook(self, bot: Bot, p: Params) -> tuple[Any, str]:
        if _true(p, "drop_pending_updates"):
            bot.updates.clear()
        was, bot.webhook = bot.webhook, {}
        return True, "Webhook was deleted" if was else "Webhook is already deleted"

    def _m_getwebhookinfo(self, bot: Bot, p: Params) -> tuple[Any, str]:
        count = len(self._kept(bot))
        info = {"url": "", "has_custom_certificate": False, "pending_update_count": count}
        if bot.allowed and bot.webhook:
            info["allowed_updates"] = sorted(bot.allowed)
        return info | bot.webhook, ""

    def _m_sendmessage(self, bot: Bot, p: Params) -> tuple[Any, str]:
        text, ents = formatted_text(p)
        chat = self._chat(bot, p)
        reply = {"message_id": _int(p.get("reply_to_message_id"), 0)}
        reply["allow_sending_without_reply"] = _true(p, "allow_sending_without_reply")
        reply |= json_param(p, "reply_parameters", dict, "reply parameters")
        reply["message_id"] = _int(str(reply["message_id"]), 0)
        if reply["message_id"] and (chat["id"], reply["message_id"]) not in bot.messages:
            if not reply["allow_sending_without_reply"]:
                raise BadRequest("message to be replied not found")
            reply["message_id"] = 0
        if len(text) > MAX_TEXT:
            raise BadRequest("message is too long")
        msg = self._message(bot, chat, bot.user, text, ents, reply["message_id"])
        bot.markups[(chat["id"], msg["message_id"])] = p.get("reply_markup", "")
        return self._record(bot, "sendMessage", msg, p), ""

    def _m_editmessagetext(self, bot: Bot, p: Params) -> tuple[Any, str]:
        text, ents = formatted_text(p)
        if not p.get("chat_id") and _int(p.get("message_id"), 0) <= 0:
            raise BadRequest("message identifier is not specified")
        key = (self._chat(bot, p)["id"], _int(p.get("message_id"), 0))
        old = bot.messages.get(key)
        if old is None:
            raise BadRequest("message to edit not found")
        if old["from"]["id"] != bot.id:
            raise BadRequest("message can't be edited")
        if len(text) > MAX_TEXT:
            raise BadRequest("MESSAGE_TOO_LONG")
        markup = p.get("reply_markup", "")
        if (old["text"], old.get("entities", []), bot.markups[key]) == (text, ents, markup):
            raise ApiError(400, NOT_MODIFIED)
        msg = {k: v for k, v in old.items() if k != "entities"} | {"text": text}
        msg |= {"edit_date": self.now} | ({"entities": ents} if ents else {})
        bot.messages[key], bot.markups[key] = msg, markup
        return self._record(bot, "editMessageText", msg, p), ""

    def _m_sendchataction(self, bot: Bot, p: Params) -> tuple[Any, str]:
        if p.get("action", "") not in ACTIONS:
            raise BadRequest("wrong parameter action in request")
        self._chat(bot, p)
        return True, ""

    # -- helpers, with the lock held ----------------------------------------------------------

    def _kept(self, bot: Bot) -> list[tuple[int, int, Json]]:
        """The bot's updates without those past their 24 h (dropped)."""
        now = self.now
        bot.updates = [u for u in bot.updates if u[1] >= now]
        return list(bot.updates)

    def _conflict_delay(self, bot: Bot) -> float:
        now = time.monotonic()
        if now >= bot.next_conflict:
            bot.next_conflict = now + 3.0
            return 0.0
        return self.conflict_delay

    def _chat(self, bot: Bot, p: Params) -> Json:
        raw = p.get("chat_id", "")
        if not raw:
            raise BadRequest("chat_id is empty")
        chat = None if raw.startswith("@") else bot.chats.get(_int(raw, 0))
        if chat is None:
            raise BadRequest("chat not found")
        return chat

    def _message(
        self, bot: Bot, chat: Json, sender: Json, text: str, ents: list[Json], reply_to: int | None
    ) -> Json:
        message_id = bot.next_message_id.get(chat["id"], 1)
        bot.next_message_id[chat["id"]] = message_id + 1
        msg = {"message_id": message_id, "from": sender, "chat": chat, "date": self.now}
        msg |= {"text": text} | ({"entities": ents} if ents else {})
        replied = bot.messages.get((chat["id"], reply_to or 0))
        if replied:
            msg["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
        bot.messages[(chat["id"], message_id)] = msg
        return msg

    def _record(self, bot: Bot, method: str, msg: Json, p: Params) -> Json:
        ids = {"chat_id": msg["chat"]["id"], "message_id": msg["message_id"]}
        bot.log.append(
            {"method": method} | ids | {"text": msg["text"], "message": msg, "params": p}
        )
        self._cond.notify_all()
        return msg


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a client's idle keep-alive connection must not hold stop()
    api: BotApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away is fine
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _Http

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        length = _int(self.headers.get("Content-Length"), 0)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower() or length < 0:
            return self._answer(411, _error(411, "Length Required"), close=True)
        if length > MAX_BODY:  # read (up to 16 MiB, not kept) so the client sees the 413
            left = min(length, 16 << 20)
            while left > 0 and (chunk := self.rfile.read(min(left, 65536))):
                left -= len(chunk)
            return self._answer(413, _error(413, "Request Entity Too Large"), close=True)
        body = self.rfile.read(length)
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        kind = self.headers.get_content_type()
        try:
            if kind == "application/json" and body.strip():
                obj = json.loads(body)
                params |= {k: v if isinstance(v, str) else json.dumps(v) for k, v in obj.items()}
            elif kind == "application/x-www-form-urlencoded":
                params |= dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        except (ValueError, AttributeError):
            return self._answer(400, _error(400, "Bad Request: can't parse JSON object"))
        status, answer, delay, drop = self.server.api.call(urllib.parse.unquote(path), params)
        time.sleep(delay)
        self._answer(status, answer, drop=drop)

    def _answer(
        self, status: int, answer: Json, *, close: bool = False, drop: bool = False
    ) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if "parameters" in answer:
            self.send_header("Retry-After", str(answer["parameters"]["retry_after"]))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if drop else data)
        self.wfile.flush()
        self.close_connection = close or drop
        if drop:
            self.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def telegram() -> Iterator[BotApiServer]:
    """A started BotApiServer, stopped after the test."""
    server = BotApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
