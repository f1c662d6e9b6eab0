"""An agent stays whole across a move (issue 18): its model, its keys, its backup schedule.

A new user's path, end to end: create with a hosted model (an OpenAI-compatible
test server on loopback, reached through the agent's proxy) → move to a box →
the agent answers with that model there (the server saw the real key; the
box's sandbox never held it) → its backup schedule installed there → move back
→ the box's timer and keys are gone, and the model here is used again.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from move_helpers import AGENT, HERE, World
from servers import ModelServer

from tests.lnkrun import lnk

HOME_KEY = "sk-home-0123456789abcdef"
BOX_KEY = "sk-box-fedcba9876543210"


@pytest.fixture
def models() -> Iterator[tuple[ModelServer, ModelServer]]:
    here, there = ModelServer("home"), ModelServer("hosted")
    yield here, there
    here.stop()
    there.stop()


def _chat(world: World, text: str) -> str:
    r = world.ok("agent", "chat", "send", "--agent", AGENT, "--json", text)
    return str(r.json()["answer"])


def _harness_environ(home: Path) -> bytes:
    """The environment of every process inside the agent's sandbox at this HOME (below
    bubblewrap, which clears it for them)."""
    out = b""
    rt = next((home / ".lnk" / "agents").glob("ag-*"))
    bwrap = int(json.loads((rt / "endpoint.json").read_text())["harness_pid"])
    todo = [int(k) for k in Path(f"/proc/{bwrap}/task/{bwrap}/children").read_text().split()]
    while todo:
        pid = todo.pop()
        try:
            out += Path(f"/proc/{pid}/environ").read_bytes()
            todo += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
    return out


def _units(home: Path) -> list[Path]:
    d = home / ".config" / "systemd" / "user"
    return sorted(d.glob("lnk-backup-*")) if d.is_dir() else []


def test_a_new_user_s_agent_stays_whole_across_moves(
    world: World, models: tuple[ModelServer, ModelServer], tmp_path: Path
) -> None:
    home_model, hosted = models
    w = world
    # created with its model here (a model this computer reaches), its key a secret
    created = w.ok(
        "agent",
        "create",
        AGENT,
        "--model",
        "m-home",
        "--model-url",
        home_model.base_url,
        "--key-env",
        "HOME_KEY",
    )
    assert "thinks with m-home" in created.err, created.err
    r = lnk("agent", "secret", "set", "HOME_KEY", home=w.here, input=HOME_KEY + "\n")
    assert r.code == 0, r.err
    w.ok("agent", "allow", "--port", str(home_model.port), "--port", str(hosted.port))
    w.ok("agent", "start", "--agent", AGENT)
    assert _chat(w, "hi") == "home heard hi"
    assert home_model.keys() == [f"Bearer {HOME_KEY}"]  # the proxy added the real key
    st = w.ok("agent", "status", "--agent", AGENT, "--json").json()
    assert st["model"].startswith("m-home at ") and "its secret HOME_KEY" in st["model"]
    # a backup schedule here
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    w.ok(
        "agent", "backup", "schedule", "--agent", AGENT, "--to", f"file://{bucket}", "--every", "6h"
    )
    assert len(_units(w.here)) == 2

    # to the box, with a hosted model there: its key from this shell, never the stream
    moved = w.ok(
        "agent",
        "move",
        "--agent",
        AGENT,
        "--to",
        "b1",
        "--backup-schedule",
        "--model",
        "m-hosted",
        "--model-url",
        hosted.base_url,
        "--key-env",
        "BOX_KEY",
        "--key-from-env",
        "BOX_KEY",
        env={"BOX_KEY": BOX_KEY},
    )
    assert "keys go with it to box b1: HOME_KEY" in moved.err, moved.err
    assert "BOX_KEY for work's model is kept on box b1" in moved.err
    assert "backup schedule on this computer was removed" in moved.err
    assert "backed up from box b1 as before" in moved.err
    box = w.boxes["b1"]
    assert _chat(w, "there") == "hosted heard there"
    assert hosted.keys() == [f"Bearer {BOX_KEY}"]
    environ = _harness_environ(box)
    assert environ and BOX_KEY.encode() not in environ and HOME_KEY.encode() not in environ
    for f in (box / "Link" / "Agents" / AGENT).rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert BOX_KEY.encode() not in data and HOME_KEY.encode() not in data, f
    # the keys: there now, gone here; the schedule: there now, gone here
    assert not list((w.here / ".config" / "lnk" / "secrets").glob("ag-*.toml"))
    names = w.ok("box", "run", "b1", "--", "agent", "secret", "list", "--agent", AGENT, "--json")
    assert json.loads(names.out)["secrets"] == ["BOX_KEY", "HOME_KEY"]
    assert _units(w.here) == [] and len(_units(box)) == 2
    service = next(p for p in _units(box) if p.suffix == ".service").read_text()
    exec_start = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    ran = subprocess.run(
        shlex.split(exec_start.split("=", 1)[1]),
        env={**os.environ, "HOME": str(box)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr  # the box's timer backs it up there
    listed = w.ok("agent", "backup", "list", "--from", f"file://{bucket}", "--json").json()
    assert [s["agent"] for s in listed] == [AGENT]

    # back here: the box lets go of its timer and keys; the model here answers, so it is used
    back = w.ok("agent", "move", "--agent", AGENT, "--here")
    assert "will think with m-home" in back.err, back.err
    assert _chat(w, "home again") == "home heard home again"
    assert home_model.keys()[-1] == f"Bearer {HOME_KEY}"
    assert _units(box) == [] and not list((box / ".config" / "lnk" / "secrets").glob("ag-*"))
    assert w.exactly_one(w.ok("agent", "status", "--agent", AGENT, "--json").json()["id"]) == HERE


def test_a_move_without_the_model_s_key_is_refused_before_the_bulk(
    world: World, models: tuple[ModelServer, ModelServer]
) -> None:
    """No key for the model there, no terminal, no flag: refused before anything is sent,
    naming the flags; --offline-model takes the downgrade."""
    w = world
    _, hosted = models
    w.ok(
        "agent",
        "create",
        AGENT,
        "--model",
        "m",
        "--model-url",
        hosted.base_url,
        "--key-env",
        "NOKEY",
    )
    w.ok("agent", "start", "--agent", AGENT, "--no-sandbox")
    r = w.lnk("agent", "move", "--agent", AGENT, "--to", "b1")
    assert r.code == 6 and "needs its key NOKEY on box b1" in r.err, r.err
    assert "--key-from-env NOKEY" in r.err and "--offline-model" in r.err
    assert "nothing was sent" in r.err
    assert not (w.boxes["b1"] / "Link" / "Agents" / AGENT).exists()
    assert w.journal_empty()
    ok = w.ok("agent", "move", "--agent", AGENT, "--to", "b1", "--offline-model")
    assert "will think with offline" in ok.err, ok.err
    assert _chat(w, "x").startswith("[work] you said: x")
