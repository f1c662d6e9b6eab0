"""The models a built-in harness answers with.

``OfflineModel`` is the default: deterministic, no network, so a test (or a
machine with no model at all) still gets an answer that shows the message
arrived and the conversation is remembered.

``OpenAIModel`` speaks the OpenAI-compatible ``/v1/chat/completions`` API: the
base URL and model name come from the agent's ``[model]`` settings, the key
from the environment variable those settings name (never from a file).  In
its sandbox the harness holds no key: its settings carry ``proxy_url``, the
agent's proxy, which it speaks plain HTTP to with :data:`PLACEHOLDER_KEY`; the
proxy, outside, sends the request over TLS to the base URL with the real key.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from lnk.errors import InvalidInput, TransportError
from lnk.text import one_line

MAX_ANSWER_BYTES = 4 << 20
HISTORY_TURNS = 40  # events sent to a remote model as context, at most
PLACEHOLDER_KEY = "lnk-placeholder-the-proxy-adds-the-key"


@dataclass(frozen=True)
class Turn:
    """What a model is asked: who it is, the conversation so far, the new text."""

    agent_name: str
    thread: str
    history: list[dict[str, Any]]  # the last events of the conversation, oldest first
    text: str
    messages_so_far: int  # the owner's messages in this thread, this one included


class Model(Protocol):
    def answer(self, turn: Turn) -> str: ...


class OfflineModel:
    """Answers ``[<name>] you said: <text> (message N in <thread>)``."""

    def answer(self, turn: Turn) -> str:
        return (
            f"[{turn.agent_name}] you said: {turn.text} "
            f"(message {turn.messages_so_far} in {turn.thread})"
        )


class OpenAIModel:
    """A client of an OpenAI-compatible chat completions endpoint."""

    def __init__(
        self,
        base_url: str,
        name: str,
        key: str | None,
        timeout: float = 120.0,
        proxy_url: str = "",
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidInput(
                f"the model's base_url {base_url!r} is not an http(s) URL",
                hint="set [model] base_url, e.g. http://127.0.0.1:8080/v1",
            )
        if not name:
            raise InvalidInput("the model's name is empty", hint="set [model] name")
        self.url = chat_completions_url(base_url)
        self.name = name
        self.key = key
        self.timeout = timeout
        self.opener = urllib.request.build_opener()
        if proxy_url:
            # the same path, asked of the agent's proxy, directly (not through HTTP_PROXY)
            real = urllib.parse.urlsplit(self.url)
            self.url = proxy_url.rstrip("/") + real.path + (f"?{real.query}" if real.query else "")
            self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def messages(self, turn: Turn) -> list[dict[str, str]]:
        out = [
            {
                "role": "system",
                "content": f"You are {turn.agent_name}, an agent answering its owner "
                f"in the conversation {turn.thread}.",
            }
        ]
        for ev in turn.history[-HISTORY_TURNS:]:
            kind = ev.get("type")
            if kind == "message":
                out.append({"role": "user", "content": str(ev.get("text", ""))})
            elif kind == "answer":
                out.append({"role": "assistant", "content": str(ev.get("text", ""))})
        out.append({"role": "user", "content": turn.text})
        return out

    def answer(self, turn: Turn) -> str:
        body = json.dumps({"model": self.name, "messages": self.messages(turn)}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self.opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            detail = one_line(e.read(2000).decode("utf-8", "replace"), 500)
            raise TransportError(
                f"the model at {self.url} answered HTTP {e.code}: {detail}",
                hint="lnk agent model shows the agent's model and where its key is; "
                "lnk agent logs shows what its proxy did",
            ) from e
        except (urllib.error.URLError, OSError) as e:
            raise TransportError(
                f"the model at {self.url} could not be reached: {e}",
                hint="is the model server running, and reachable from the agent's sandbox?",
            ) from e
        if len(raw) > MAX_ANSWER_BYTES:
            raise TransportError(f"the model at {self.url} sent more than {MAX_ANSWER_BYTES} bytes")
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise TransportError(
                f"the model at {self.url} sent an answer that is not a chat completion: {e}"
            ) from e
        if not isinstance(content, str):
            raise TransportError(f"the model at {self.url} sent a non-text answer")
        return content


def chat_completions_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


def make_model(model: dict[str, Any], environ: dict[str, str] | None = None) -> Model:
    """The model the agent's ``[model]`` settings (as a dict) name."""
    env = os.environ if environ is None else environ
    provider = str(model.get("provider") or "offline")
    if provider == "offline":
        return OfflineModel()
    if provider == "openai":
        key_env = str(model.get("key_env") or "OPENAI_API_KEY")
        proxy_url = str(model.get("proxy_url") or "")
        return OpenAIModel(
            str(model.get("base_url", "")),
            str(model.get("name", "")),
            PLACEHOLDER_KEY if proxy_url else env.get(key_env),
            proxy_url=proxy_url,
        )
    raise InvalidInput(
        f"unknown model provider {provider!r}", hint="[model] provider is 'offline' or 'openai'"
    )
