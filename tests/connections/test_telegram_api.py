"""The loopback Bot API server (tests/telegram_api.py) against Telegram's documented behaviour,
spoken to with urllib only, as a bridge would."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest
from telegram_api import CONFLICT, NOT_MODIFIED, WEBHOOK_ACTIVE, BotApiServer

TOKEN = "123:ABC"
Answer = tuple[int, dict[str, Any], Message]


@pytest.fixture
def server() -> Iterator[BotApiServer]:
    with BotApiServer(conflict_delay=0.5, seed=1) as s:
        s.add_bot(TOKEN, username="lnk_test_bot")
        yield s


def call(server: BotApiServer, method: str, how: str = "json", token: str = TOKEN,
         **params: Any) -> Answer:  # fmt: skip
    """One request, with the parameters as JSON, a form, or a GET query string."""
    url = f"{server.base_url}/bot{token}/{method}"
    data: bytes | None = None
    headers = {}
    if how == "json":
        data, headers = json.dumps(params).encode(), {"Content-Type": "application/json"}
    else:
        flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
        if how == "form":
            data = urllib.parse.urlencode(flat).encode()
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
        else:
            url += "?" + urllib.parse.urlencode(flat)
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def ok(server: BotApiServer, method: str, **params: Any) -> Any:
    status, answer, _ = call(server, method, **params)
    assert (status, answer["ok"]) == (200, True), answer
    return answer["result"]


def error(server: BotApiServer, method: str, **params: Any) -> tuple[int, str]:
    status, answer, _ = call(server, method, **params)
    assert answer["ok"] is False and answer["error_code"] == status, answer
    return status, answer["description"]


def in_thread(fn: Any, *args: Any, **kw: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append((fn(*args, **kw), time.monotonic())))
    thread.start()
    return thread, box


def wait_for_poll(server: BotApiServer, polls: int) -> None:
    """Until the server has seen ``polls`` getUpdates requests (and the last is waiting)."""
    deadline = time.monotonic() + 5
    while len(server.calls(TOKEN, "getUpdates")) < polls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)


# -- requests -------------------------------------------------------------------------------------


def test_get_me_by_json_form_and_query(server: BotApiServer) -> None:
    for how in ("json", "form", "get"):
        me = call(server, "getMe", how)[1]["result"]
        assert me["id"] == 123 and me["is_bot"] and me["username"] == "lnk_test_bot"
    assert ok(server, "GETME")["id"] == 123  # method names are case-insensitive


def test_unknown_token_method_and_path(server: BotApiServer) -> None:
    assert call(server, "getMe", token="999:XYZ")[:2] == (
        401, {"ok": False, "error_code": 401, "description": "Unauthorized"})  # fmt: skip
    assert call(server, "getMe", token="nocolon")[1]["description"] == (
        "Unauthorized: invalid token specified")  # fmt: skip
    assert error(server, "getMeNot") == (404, "Not Found")
    assert call(server, "getMe", token="999:XYZ/x")[0] == 404


def test_a_body_over_one_mib_is_refused(server: BotApiServer) -> None:
    status, answer, _ = call(server, "sendMessage", chat_id=42, text="x" * (1 << 20))
    assert (status, answer["error_code"]) == (413, 413)


# -- getUpdates -----------------------------------------------------------------------------------


def test_updates_are_kept_until_an_offset_confirms_them(server: BotApiServer) -> None:
    said = [server.user_says(TOKEN, user_id=42, text=t, first_name="Ann") for t in "abc"]
    ids = [u["update_id"] for u in said]
    assert 2_000_001 <= ids[0] <= 1_000_000_000 and ids == [ids[0], ids[0] + 1, ids[0] + 2]
    first = ok(server, "getUpdates")
    assert first == said and ok(server, "getUpdates", how="form") == said  # not yet confirmed
    message = first[0]["message"]
    assert message["from"] == {"id": 42, "is_bot": False, "first_name": "Ann"}
    assert message["chat"] == {"id": 42, "first_name": "Ann", "type": "private"}
    assert message["text"] == "a" and message["date"] == server.now
    assert [u["update_id"] for u in ok(server, "getUpdates", offset=ids[1])] == ids[1:]
    assert [u["update_id"] for u in server.pending(TOKEN)] == ids[1:]  # ids[0] confirmed
    assert ok(server, "getUpdates", how="get", offset=ids[2] + 1) == []
    assert server.pending(TOKEN) == []
    later = server.user_says(TOKEN, user_id=42, text="d")
    assert later["update_id"] == ids[2] + 1 and ok(server, "getUpdates") == [later]


def test_limit_negative_and_far_offsets(server: BotApiServer) -> None:
    ids = [server.user_says(TOKEN, user_id=42, text=str(n))["update_id"] for n in range(5)]
    assert [u["update_id"] for u in ok(server, "getUpdates", limit=2)] == ids[:2]
    assert len(ok(server, "getUpdates", limit=0)) == 1  # clamped to 1..100
    # an offset far in the future is ignored: everything kept is answered, nothing forgotten
    assert len(ok(server, "getUpdates", offset=ids[-1] + 100)) == 5
    # a negative offset answers from the end and forgets what came before
    assert [u["update_id"] for u in ok(server, "getUpdates", offset=-2)] == ids[3:]
    assert [u["update_id"] for u in server.pending(TOKEN)] == ids[3:]


def test_updates_are_dropped_after_24_hours(server: BotApiServer) -> None:
    server.user_says(TOKEN, user_id=42, text="old")
    server.advance(86400)
    assert len(ok(server, "getUpdates")) == 1
    fresh = server.user_says(TOKEN, user_id=42, text="new")
    server.advance(1)
    assert ok(server, "getUpdates") == [fresh]


def test_allowed_updates_filters_updates_made_afterwards(server: BotApiServer) -> None:
    before = server.user_says(TOKEN, user_id=42, text="before")
    assert ok(server, "getUpdates", allowed_updates=["callback_query"]) == [before]
    assert "update_id" not in server.user_says(TOKEN, user_id=42, text="filtered")
    ok(server, "getUpdates", allowed_updates=[])
    assert "update_id" in server.user_says(TOKEN, user_id=42, text="all again")


def test_a_long_poll_wakes_when_a_user_speaks(server: BotApiServer) -> None:
    start = time.monotonic()
    thread, box = in_thread(ok, server, "getUpdates", timeout=10)
    wait_for_poll(server, 1)
    said = server.user_says(TOKEN, user_id=42, text="/start@lnk_test_bot now")
    thread.join(5)
    assert box[0][0] == [said] and box[0][1] - start < 2
    assert said["message"]["entities"] == [{"type": "bot_command", "offset": 0, "length": 19}]


def test_a_long_poll_ends_empty_at_its_timeout(server: BotApiServer) -> None:
    start = time.monotonic()
    assert ok(server, "getUpdates", timeout=1) == []
    assert 0.9 < time.monotonic() - start < 3


def test_a_second_poller_ends_the_first_with_409(server: BotApiServer) -> None:
    """tdlib/telegram-bot-api: the request already waiting gets the 409; the newer one waits."""
    first, first_box = in_thread(call, server, "getUpdates", timeout=10)
    wait_for_poll(server, 1)
    second, second_box = in_thread(ok, server, "getUpdates", timeout=10)
    first.join(5)
    assert first_box[0][0][:2] == (409, {"ok": False, "error_code": 409, "description": CONFLICT})
    assert second.is_alive()  # the newer request is the one still waiting
    said = server.user_says(TOKEN, user_id=42, text="hi")
    second.join(5)
    assert second_box[0][0] == [said]


def test_a_short_poll_ends_no_waiting_poll(server: BotApiServer) -> None:
    waiting, box = in_thread(ok, server, "getUpdates", timeout=10)
    wait_for_poll(server, 1)
    assert ok(server, "getUpdates") == []
    assert waiting.is_alive()
    said = server.user_says(TOKEN, user_id=42, text="hi")
    waiting.join(5)
    assert box[0][0] == [said]


def test_conflicts_within_3_seconds_are_held(server: BotApiServer) -> None:
    """A 409 within 3 s of the last comes after conflict_delay (3 s on Telegram, 0.5 s here)."""
    waiting, box = in_thread(call, server, "getUpdates", timeout=10)
    wait_for_poll(server, 1)
    took = []
    for n in (2, 3):
        start = time.monotonic()
        newer, newer_box = in_thread(call, server, "getUpdates", timeout=10)
        waiting.join(5)
        assert box[0][0][1]["description"] == CONFLICT
        took.append(box[0][1] - start)
        wait_for_poll(server, n)
        waiting, box = newer, newer_box
    server.user_says(TOKEN, user_id=42, text="release")
    waiting.join(5)
    assert box[0][0][0] == 200
    assert took[0] < 0.45 and 0.5 <= took[1] < 1.5


def test_conflict_control(server: BotApiServer) -> None:
    server.conflict_next(TOKEN, 2)
    assert error(server, "getUpdates") == (409, CONFLICT)
    assert error(server, "getUpdates") == (409, CONFLICT)
    assert ok(server, "getUpdates") == []


# -- webhooks -------------------------------------------------------------------------------------


def test_webhook_and_polling_exclude_each_other(server: BotApiServer) -> None:
    waiting, box = in_thread(call, server, "getUpdates", timeout=10)
    wait_for_poll(server, 1)
    server.user_says(TOKEN, user_id=42, text="queued")  # wakes and answers the poll
    waiting.join(5)
    (update,) = box[0][0][1]["result"]
    assert error(server, "setWebhook", url="http://example.org/hook")[0] == 400
    waiting, box = in_thread(call, server, "getUpdates", offset=update["update_id"] + 1, timeout=9)
    wait_for_poll(server, 2)
    assert call(server, "setWebhook", url="https://example.org/hook")[1] == {
        "ok": True, "result": True, "description": "Webhook was set"}  # fmt: skip
    waiting.join(5)
    assert box[0][0][1]["description"] == "Conflict: terminated by setWebhook request"
    assert error(server, "getUpdates") == (409, WEBHOOK_ACTIVE)
    server.user_says(TOKEN, user_id=42, text="while the webhook is set")
    info = ok(server, "getWebhookInfo")
    assert info["url"] == "https://example.org/hook" and info["pending_update_count"] == 1
    assert call(server, "deleteWebhook")[1]["description"] == "Webhook was deleted"
    assert call(server, "deleteWebhook")[1]["description"] == "Webhook is already deleted"
    assert len(ok(server, "getUpdates")) == 1
    ok(server, "deleteWebhook", drop_pending_updates=True)
    assert ok(server, "getWebhookInfo")["pending_update_count"] == 0
    assert ok(server, "getWebhookInfo")["url"] == ""


# -- sending and editing --------------------------------------------------------------------------


def test_send_message_answers_the_message_and_records_it(server: BotApiServer) -> None:
    asked = server.user_says(TOKEN, user_id=42, text="hi")["message"]
    assert error(server, "sendMessage", chat_id=7, text="x") == (400, "Bad Request: chat not found")
    assert error(server, "sendMessage", text="x") == (400, "Bad Request: chat_id is empty")
    sent = ok(
        server, "sendMessage", chat_id=42, text="hello", reply_to_message_id=asked["message_id"]
    )
    assert sent["from"]["is_bot"] and sent["chat"]["id"] == 42 and sent["text"] == "hello"
    assert sent["message_id"] == asked["message_id"] + 1
    assert sent["reply_to_message"] == asked
    assert server.sent(TOKEN) == [{"method": "sendMessage", "chat_id": 42, "text": "hello",
                                   "message_id": sent["message_id"], "message": sent,
                                   "params": {"chat_id": "42", "text": "hello",
                                              "reply_to_message_id": str(asked["message_id"])}}]  # fmt: skip
    assert error(server, "sendMessage", chat_id=42, text="x", reply_parameters={"message_id": 99}) == (
        400, "Bad Request: message to be replied not found")  # fmt: skip
    ok(server, "sendMessage", chat_id=42, text="x",
       reply_parameters={"message_id": 99, "allow_sending_without_reply": True})  # fmt: skip
    assert ok(server, "sendChatAction", chat_id=42, action="typing") is True
    assert error(server, "sendChatAction", chat_id=42, action="dancing")[0] == 400
    assert error(server, "sendChatAction", chat_id=7, action="typing")[0] == 400


def test_text_length_counts_code_points_after_entities(server: BotApiServer) -> None:
    server.user_says(TOKEN, user_id=42, text="hi")
    too_long = (400, "Bad Request: message is too long")
    assert error(server, "sendMessage", chat_id=42, text="") == (
        400, "Bad Request: message text is empty")  # fmt: skip
    assert error(server, "sendMessage", chat_id=42, text=" \n ") == (
        400, "Bad Request: text must be non-empty")  # fmt: skip
    assert len(ok(server, "sendMessage", chat_id=42, text="a" * 4096)["text"]) == 4096
    assert error(server, "sendMessage", chat_id=42, text="a" * 4097) == too_long
    emoji = "\N{GRINNING FACE}"  # two UTF-16 units, one code point
    assert ok(server, "sendMessage", chat_id=42, text=emoji * 4096)["text"] == emoji * 4096
    assert error(server, "sendMessage", chat_id=42, text=emoji * 4097) == too_long
    assert ok(server, "sendMessage", chat_id=42, text="a" * 4096 + "\n  ")["text"] == "a" * 4096
    bold = ok(
        server, "sendMessage", chat_id=42, text=f"<b>{emoji}{'a' * 4095}</b>", parse_mode="HTML"
    )
    assert bold["entities"] == [{"type": "bold", "offset": 0, "length": 4097}]  # UTF-16 units
    assert (
        error(server, "sendMessage", chat_id=42, text=f"<b>{'a' * 4097}</b>", parse_mode="HTML")
        == too_long
    )
    assert (
        error(server, "sendMessage", chat_id=42, text="x" * 40000)[1]
        == "Bad Request: text is too long"
    )


def test_parse_modes(server: BotApiServer) -> None:
    server.user_says(TOKEN, user_id=42, text="hi")

    def send(text: str, mode: str) -> Any:
        return ok(server, "sendMessage", chat_id=42, text=text, parse_mode=mode)

    html = send('a &lt;<i>b</i> <a href="https://x.org">c</a>', "HTML")
    assert html["text"] == "a <b c" and html["entities"] == [
        {"type": "italic", "offset": 3, "length": 1},
        {"type": "text_link", "offset": 5, "length": 1, "url": "https://x.org"}]  # fmt: skip
    v2 = send("*bold* \\. `co.de` [l](https://x.org)", "MarkdownV2")
    assert v2["text"] == "bold . co.de l" and [e["type"] for e in v2["entities"]] == [
        "bold", "code", "text_link"]  # fmt: skip
    assert send("*b* 1.5", "Markdown")["text"] == "b 1.5"
    pre = send("```python\nprint(1)\n```", "MarkdownV2")
    assert pre["text"] == "print(1)" and pre["entities"] == [
        {"type": "pre", "offset": 0, "length": 8, "language": "python"}]  # fmt: skip
    reserved = error(server, "sendMessage", chat_id=42, text="1.5", parse_mode="MarkdownV2")
    assert reserved[1] == ("Bad Request: can't parse entities: Character '.' is reserved and "
                           "must be escaped with the preceding '\\'")  # fmt: skip
    assert error(server, "sendMessage", chat_id=42, text="a < b", parse_mode="HTML")[1] == (
        'Bad Request: can\'t parse entities: Unsupported start tag "" at byte offset 2')  # fmt: skip
    assert send("&lt;&amp;&#x41;&#66&nbsp;&", "HTML")["text"] == "<&AB&nbsp;&"
    assert "Can't find end of Bold entity" in error(
        server, "sendMessage", chat_id=42, text="*open", parse_mode="MarkdownV2")[1]  # fmt: skip


def test_edit_message_text(server: BotApiServer) -> None:
    asked = server.user_says(TOKEN, user_id=42, text="hi")["message"]
    sent = ok(server, "sendMessage", chat_id=42, text="thinking")
    key = {"chat_id": 42, "message_id": sent["message_id"]}
    edited = ok(server, "editMessageText", **key, text="done")
    assert edited["text"] == "done" and edited["edit_date"] >= sent["date"]
    assert error(server, "editMessageText", **key, text="done") == (400, NOT_MODIFIED)
    assert ok(server, "editMessageText", **key, text="<b>done</b>", parse_mode="HTML")["entities"]
    assert error(server, "editMessageText", chat_id=42, message_id=999, text="x") == (
        400, "Bad Request: message to edit not found")  # fmt: skip
    assert error(server, "editMessageText", chat_id=42, message_id=asked["message_id"], text="x") == (
        400, "Bad Request: message can't be edited")  # fmt: skip
    assert error(server, "editMessageText", **key, text="a" * 4097) == (
        400, "Bad Request: MESSAGE_TOO_LONG")  # fmt: skip
    assert [(e["method"], e["text"]) for e in server.sent(TOKEN, chat_id=42)] == [
        ("sendMessage", "thinking"), ("editMessageText", "done"),
        ("editMessageText", "done")]  # fmt: skip
    assert server.sent(TOKEN, chat_id=7) == []


# -- fault controls -------------------------------------------------------------------------------


def test_429_control(server: BotApiServer) -> None:
    server.user_says(TOKEN, user_id=42, text="hi")
    server.fail_next(TOKEN, "sendMessage", 2, retry_after=3)
    for _ in range(2):
        status, answer, headers = call(server, "sendMessage", chat_id=42, text="x")
        assert (status, answer) == (429, {"ok": False, "error_code": 429,
                                          "description": "Too Many Requests: retry after 3",
                                          "parameters": {"retry_after": 3}})  # fmt: skip
        assert headers["Retry-After"] == "3"
    assert server.sent(TOKEN) == []  # refused calls send nothing
    ok(server, "sendMessage", chat_id=42, text="x")
    assert len(server.sent(TOKEN)) == 1


def test_a_dropped_answer_after_the_message_was_sent(server: BotApiServer) -> None:
    server.user_says(TOKEN, user_id=42, text="hi")
    server.drop_next(TOKEN, "sendMessage")
    with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
        call(server, "sendMessage", chat_id=42, text="x")
    assert [e["text"] for e in server.sent(TOKEN)] == ["x"]  # sent, though never answered
    ok(server, "sendMessage", chat_id=42, text="y")


def test_the_fixture(telegram: BotApiServer) -> None:
    bot = telegram.add_bot("5:Z", username="other_bot")
    bot.user_says(user_id=1, text="hi", chat_id=-100, chat_type="group", title="G")
    answer = call(telegram, "getUpdates", token="5:Z")[1]["result"]
    assert answer[0]["message"]["chat"] == {"id": -100, "type": "group", "title": "G"}
    assert telegram.base_url.startswith("http://127.0.0.1:") and bot.sent() == []
