"""Places an agent moves between (this computer, local boxes, SSH boxes) and the checks.

Every command runs the real ``lnk`` as a black box (``tests/lnkrun.py``).  A
:class:`World` knows this computer's HOME and each box's HOME, so a test can
ask every place where the agent is, and read the events of the one it is at.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnkrun import Result, lnk, ok

from lnk.agents.stores import open_agent_store
from lnk.collections.base import CollectionId

AGENT = "work"
HERE = "here"
ANSWER = re.compile(r"you said: (.*) \(message \d+ in link:main\)$")


@dataclass
class World:
    here: Path
    boxes: dict[str, Path] = field(default_factory=dict)  # box name -> its HOME
    env: dict[str, str] = field(default_factory=dict)  # for every lnk run here

    def lnk(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Result:
        return lnk(*args, home=self.here, env={**self.env, **(env or {})}, timeout=timeout)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return ok(*args, home=self.here, env={**self.env, **(env or {})}, timeout=180)

    def home_of(self, place: str) -> Path:
        return self.here if place == HERE else self.boxes[place]

    def places(self) -> list[str]:
        return [HERE, *self.boxes]

    def add_local_box(self, name: str, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.ok("box", "add", name, "--local", str(home))
        self.boxes[name] = home

    def add_ssh_box(self, name: str, home: Path) -> None:
        self.ok("box", "add", name, name, "--no-install")
        self.boxes[name] = home

    def status(self, place: str) -> dict[str, Any] | None:
        """The agent's status --json as its own lnk there says, or None if it has none."""
        args = ["agent", "status", "--agent", AGENT, "--json"]
        r = self.lnk(*args) if place == HERE else self.lnk("box", "run", place, "--", *args)
        if r.code != 0:
            assert "no agent" in r.err or "not found" in r.err.lower() or "moved to" in r.err, (
                f"status at {place} failed oddly ({r.code}): {r.err}"
            )
            return None
        return dict(r.json())

    def has_settings(self, place: str) -> bool:
        return (self.home_of(place) / ".config" / "lnk" / "agents" / f"{AGENT}.toml").exists()

    def exactly_one(self, agent_id: str) -> str:
        """Exactly one place runs the agent with its ID; no other place has its settings."""
        running = []
        for place in self.places():
            st = self.status(place)
            if (
                st is not None
                and st.get("running")
                and st.get("id") == agent_id
                and st.get("place", HERE) == HERE
            ):  # not its lnk asking another place
                running.append(place)
        assert len(running) == 1, f"the agent runs at {running}, not at exactly one place"
        where = running[0]
        for place in self.places():
            if place != where:
                assert not self.has_settings(place), f"{place} still has {AGENT}'s settings"
        return where

    def journal_empty(self) -> bool:
        d = self.here / ".lnk" / "journal"
        return not d.is_dir() or not list(d.glob("mv-*.json"))

    def held_empty(self) -> bool:
        """No message is held undelivered (answers kept for the next chat may be there)."""
        d = self.here / ".lnk" / "held"
        return not d.is_dir() or not [p for p in d.rglob("msg-*.json") if ".answer." not in p.name]

    def kept_answers(self) -> list[Path]:
        d = self.here / ".lnk" / "held"
        return sorted(d.rglob("msg-*.answer.json")) if d.is_dir() else []


def make_agent(world: World, place: str = HERE) -> str:
    """Create and start the agent at this computer, unsandboxed, on a random port block."""
    r = world.ok("agent", "create", AGENT, "--json")
    agent_id = str(r.json()["id"])
    settings = world.here / ".config" / "lnk" / "agents" / f"{AGENT}.toml"
    base = random.randrange(20000, 32000) // 4 * 4  # other sessions' agents use 20000 up
    settings.write_text(re.sub(r"(?m)^base = \d+$", f"base = {base}", settings.read_text()))
    world.ok("agent", "start", "--agent", AGENT, "--no-sandbox")
    return agent_id


def put_file(world: World, place: str, name: str, size: int) -> Path:
    """A file of random bytes in the agent's Home folder, written in chunks."""
    p = world.home_of(place) / "Link" / "Agents" / AGENT / "Home" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
    return p


def events(world: World, place: str) -> list[dict[str, Any]]:
    chats = world.home_of(place) / "Link" / "Agents" / AGENT / "Agent" / "chats"
    store = open_agent_store(chats, "files", 60)
    return [
        dict(ev.data, number=ev.number)
        for ev in store.iter_events(CollectionId("events", "link:main"))
    ]


def answered_once(world: World, place: str, texts: list[str]) -> None:
    """Each text is one message event with exactly one answer, and that answer is its own."""
    evs = events(world, place)
    msgs: dict[str, list[int]] = {}
    answers: dict[int, list[str]] = {}
    for ev in evs:
        if ev.get("type") == "message":
            msgs.setdefault(str(ev.get("text")), []).append(ev["number"])
        elif ev.get("type") == "answer":
            answers.setdefault(int(ev["reply_to"]), []).append(str(ev.get("text")))
    for t in texts:
        assert len(msgs.get(t, [])) == 1, f"{t!r} is {len(msgs.get(t, []))} message events"
        got = answers.get(msgs[t][0], [])
        assert len(got) == 1, f"{t!r} has {len(got)} answers"
        m = ANSWER.search(got[0])
        assert m and m.group(1) == t, f"{t!r} was answered {got[0]!r}"


class Chatter:
    """Sends messages in a loop from this computer while a move runs."""

    def __init__(self, world: World, tag: str) -> None:
        self.world, self.tag = world, tag
        self.sent: list[str] = []
        self.failed: list[tuple[str, str]] = []
        self.answers: dict[str, str] = {}
        self.held: list[str] = []
        self.earlier: dict[str, list[str]] = {}  # answers handed over by a later chat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() or i < 2:
            text = f"{self.tag}-{i}"
            i += 1
            r = self.world.lnk(
                "agent", "chat", "send", "--agent", AGENT, "--json", text, timeout=300
            )
            for e in r.json().get("earlier", []) if r.code == 0 else []:
                self.earlier.setdefault(e["text"], []).append(e["answer"])
            if r.code == 0 and r.json().get("held"):
                self.sent.append(text)  # held: the start or move that finishes hands it over
                self.held.append(text)
            elif r.code == 0:
                self.sent.append(text)
                self.answers[text] = str(r.json()["answer"])
            else:
                self.failed.append((text, r.err))

    def __enter__(self) -> Chatter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), "a chat send never came back"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def check(self, world: World, place: str) -> None:
        assert not self.failed, f"messages not answered: {self.failed}"
        for text in self.answers:
            m = ANSWER.search(self.answers[text])
            assert m and m.group(1) == text, f"{text!r} got the answer {self.answers[text]!r}"
        answered_once(world, place, self.sent)
        assert world.held_empty(), "messages are still held in ~/.lnk/held/"
        # an answer nobody waited for is kept for the next chat on its thread, which hands
        # each over once: a later chat of the loop, or the one here
        if world.kept_answers():
            r = world.lnk("agent", "chat", "send", "--agent", AGENT, "--json", "after", timeout=300)
            assert r.code == 0, r.err
            for e in r.json()["earlier"]:
                self.earlier.setdefault(e["text"], []).append(e["answer"])
        assert world.kept_answers() == []
        assert sorted(self.earlier) == sorted(self.held), (self.earlier, self.held)
        for text, got in self.earlier.items():
            assert len(got) == 1, f"{text!r} was handed over {len(got)} times"
            m = ANSWER.search(got[0])
            assert m and m.group(1) == text, (text, got)


def check_left(world: World, place: str, agent_id: str, went: str) -> None:
    """The copy left at ``place``: settings gone, files in Link/Moved, a note, start refused."""
    home = world.home_of(place)
    assert not world.has_settings(place)
    assert list((home / "Link" / "Moved").glob(f"{AGENT}-*")), "no files kept in ~/Link/Moved"
    note = json.loads((home / ".lnk" / "moved" / f"{agent_id}.json").read_text())
    assert note["id"] == agent_id and went in note["to"]
    args = ["agent", "start", "--agent", AGENT, "--no-sandbox"]
    r = world.lnk(*args) if place == HERE else world.lnk("box", "run", place, "--", *args)
    assert r.code != 0 and "moved to" in r.err and agent_id in r.err, r.err


def kill_agents(homes: list[Path]) -> None:
    """Stop every agent runner these tests started under these HOMEs (by their pidfiles)."""
    for home in homes:
        for pidfile in (home / ".lnk" / "agents").glob("*/runner.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pidfile.read_text().strip())
                if b"lnk.runtime.runner" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue  # not ours (a stale pidfile)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


PYTHON = sys.executable
