"""Models: the offline one, and an OpenAI-compatible API on a loopback server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lnk.agents.settings import ModelSettings
from lnk.errors import InvalidInput, TransportError
from lnk.harness import client
from lnk.harness.model import (
    OfflineModel,
    OpenAIModel,
    Turn,
    chat_completions_url,
    make_model,
)


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: list[dict[str, Any]] = []
    status = 200

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        if type(self).status != 200:
            data = b'{"error": {"message": "overloaded"}}'
            self.send_response(type(self).status)
        else:
            last = body["messages"][-1]["content"]
            data = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"model heard: {last}"},
                        }
                    ],
                }
            ).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def completions() -> Iterator[tuple[str, type[_Completions]]]:
    _Completions.requests = []
    _Completions.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", _Completions
    server.shutdown()
    server.server_close()


def _turn(text: str = "hi", history: list[dict[str, Any]] | None = None) -> Turn:
    return Turn("main", "link:main", history or [], text, 3)


def test_offline_model_is_deterministic() -> None:
    m = OfflineModel()
    assert m.answer(_turn("hi")) == m.answer(_turn("hi"))
    assert m.answer(_turn("hi")) == "[main] you said: hi (message 3 in link:main)"


def test_openai_model_sends_history_name_and_key(completions: Any) -> None:
    base, handler = completions
    model = make_model(
        {"provider": "openai", "base_url": base, "name": "tiny-1", "key_env": "MY_KEY"},
        environ={"MY_KEY": "sk-test"},
    )
    history = [
        {"type": "message", "text": "earlier"},
        {"type": "answer", "text": "noted"},
        {"type": "tool_call", "call_id": "c"},
    ]
    assert model.answer(_turn("now", history)) == "model heard: now"
    (req,) = handler.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["auth"] == "Bearer sk-test"
    assert req["body"]["model"] == "tiny-1"
    roles = [(m["role"], m["content"]) for m in req["body"]["messages"][1:]]
    assert roles == [("user", "earlier"), ("assistant", "noted"), ("user", "now")]


def test_openai_model_http_error_is_a_transport_error(completions: Any) -> None:
    base, handler = completions
    handler.status = 503
    with pytest.raises(TransportError) as ei:
        OpenAIModel(base, "tiny-1", None).answer(_turn())
    assert "503" in ei.value.message and "overloaded" in ei.value.message
    assert handler.requests[0]["auth"] is None


def test_openai_model_unreachable_is_a_transport_error() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError):
        OpenAIModel(f"http://127.0.0.1:{port}/v1", "m", None, timeout=5).answer(_turn())


def test_bad_model_settings_are_refused() -> None:
    with pytest.raises(InvalidInput):
        make_model({"provider": "telepathy"})
    with pytest.raises(InvalidInput):
        make_model({"provider": "openai", "base_url": "ftp://x", "name": "m"})
    with pytest.raises(InvalidInput):
        make_model({"provider": "openai", "base_url": "http://x", "name": ""})


def test_chat_completions_url() -> None:
    assert chat_completions_url("http://h:1/v1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert (
        chat_completions_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
    )


def test_agent_answers_through_its_openai_model(start_agent: Any, completions: Any) -> None:
    base, handler = completions
    model = ModelSettings(provider="openai", base_url=base, name="tiny-1", key_env="LNK_T_KEY")
    r = start_agent("main", model=model, env={"LNK_T_KEY": "sk-agent"})
    assert (
        client.send_message(r.port, r.key, "link:main", "ping", timeout=30) == "model heard: ping"
    )
    assert (
        client.send_message(r.port, r.key, "link:main", "pong", timeout=30) == "model heard: pong"
    )
    assert [q["auth"] for q in handler.requests] == ["Bearer sk-agent"] * 2
    second = [m["content"] for m in handler.requests[1]["body"]["messages"][1:]]
    assert second == ["ping", "model heard: ping", "pong"]
