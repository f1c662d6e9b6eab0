"""Which model an agent thinks with, on this machine.

Each machine keeps a model it can reach (decisions: "Which model does an agent
use after a move?").  A new agent gets the cheap hosted model of the first
provider whose key this machine has (its variable set, as the provider names
it), else the offline model, and says which once.  ``--model NAME`` names
another: ``offline``, a provider's model (``openai:gpt-4.1-mini``), or any
OpenAI-compatible one with ``--model-url URL`` (and ``--key-env VAR``).

A model's key is never in its settings: the agent's secret (``lnk agent
secret``), or the variable ``key_env`` names in the environment that starts
it; the proxy adds it outside the sandbox.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from lnk.agents import secrets
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings
from lnk.errors import InvalidInput


@dataclass(frozen=True)
class Provider:
    name: str
    base_url: str
    key_env: str
    cheap: str  # the default model: all three at about one price ($0.10 in, $0.40 out per M)


PROVIDERS = (
    Provider("openai", "https://api.openai.com/v1", "OPENAI_API_KEY", "gpt-4.1-nano"),
    Provider(
        "gemini",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "GEMINI_API_KEY",
        "gemini-2.0-flash-lite",
    ),
    Provider(
        "openrouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        "google/gemini-2.0-flash-lite-001",
    ),
)
BY_NAME = {p.name: p for p in PROVIDERS}
OFFLINE = ModelSettings()


def hosted(provider: Provider, model: str | None = None) -> ModelSettings:
    return ModelSettings("openai", provider.base_url, model or provider.cheap, provider.key_env)


def default_model(env: Mapping[str, str] | None = None) -> tuple[ModelSettings, str]:
    """The model a new agent gets here, and the line that says why."""
    env = os.environ if env is None else env
    for p in PROVIDERS:
        if env.get(p.key_env):
            m = hosted(p)
            return m, f"it thinks with {p.name}'s {m.name} (the key in ${p.key_env})"
    names = ", ".join(f"${p.key_env}" for p in PROVIDERS)
    return OFFLINE, (
        f"it thinks with the offline model: no provider key was found ({names}); "
        "lnk agent create NAME --model openai:gpt-4.1-nano names one"
    )


def parse_model(name: str, url: str | None = None, key_env: str | None = None) -> ModelSettings:
    """``--model NAME [--model-url URL] [--key-env VAR]`` as the settings they name."""
    if name == "offline":
        if url or key_env:
            raise InvalidInput("the offline model takes no URL or key", hint="--model offline")
        return OFFLINE
    provider, sep, model = name.partition(":")
    if url:
        if not url.startswith(("http://", "https://")):
            raise InvalidInput(
                f"--model-url {url!r} is not an http(s) URL",
                hint="e.g. --model-url https://api.example.com/v1",
            )
        return ModelSettings(
            "openai", url.rstrip("/"), name, secrets.check_name(key_env or "OPENAI_API_KEY")
        )
    if sep and provider in BY_NAME and model:
        p = BY_NAME[provider]
        return ModelSettings("openai", p.base_url, model, secrets.check_name(key_env or p.key_env))
    raise InvalidInput(
        f"--model {name!r} names no model lnk knows",
        hint="--model offline, --model PROVIDER:MODEL ("
        + ", ".join(p.name for p in PROVIDERS)
        + "), or --model NAME --model-url URL for any OpenAI-compatible one",
    )


def key_place(
    machine: Machine, agent_id: str, m: ModelSettings, env: Mapping[str, str] | None = None
) -> str:
    """Where the model's key lives here: ``secret``, ``env`` (the starting shell's
    variable), ``none`` (missing), or ``not needed`` (the offline model)."""
    if m.provider != "openai":
        return "not needed"
    if secrets.get(machine, agent_id, m.key_env):
        return "secret"
    if (os.environ if env is None else env).get(m.key_env):
        return "env"
    return "none"


def describe(m: ModelSettings, key: str | None = None) -> str:
    if m.provider != "openai":
        return "offline (built in)"
    where = {
        "secret": f"its secret {m.key_env}",
        "env": f"${m.key_env} of the starting shell",
        "none": f"none here (lnk agent secret set {m.key_env})",
    }.get(key or "", "")
    return f"{m.name or '(no name)'} at {m.base_url}" + (f", key: {where}" if where else "")


def answers(m: ModelSettings, timeout: float = 2.0) -> bool:
    """Whether the model answers here: the offline one always; an OpenAI-compatible one
    when its ``/models`` answers at all (any HTTP status: it is there), within ``timeout``."""
    if m.provider != "openai":
        return True
    try:
        with urllib.request.urlopen(m.base_url.rstrip("/") + "/models", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # it answered (401 without its key, say)
    except (OSError, ValueError):
        return False
