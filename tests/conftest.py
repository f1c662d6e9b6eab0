"""Hermetic tests: every test gets a fresh HOME and no LNK_* variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# a provider's key in the shell running the tests would make new agents think with it
PROVIDER_KEYS = ("OPENAI_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY")


@pytest.fixture(autouse=True)
def _hermetic_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    home = tmp_path_factory.mktemp("home")
    for name in list(os.environ):
        if name.startswith("LNK_") or name in PROVIDER_KEYS:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LNK_TESTING", "1")
    return home


@pytest.fixture
def home(_hermetic_home: Path) -> Path:
    return _hermetic_home
