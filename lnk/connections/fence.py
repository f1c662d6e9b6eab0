"""The bridge's fence: before every getUpdates, delivery, claim and sendMessage, the bridge
asks whether it may still act for its agent here (docs/connections.md, "The fence").

It may not, and stops for good, when any of these says its time is over:

* its parent is no longer the runner that started it (the runner died: kill -9);
* ``<runtime>/key`` no longer holds the key of the start it belongs to (the agent
  was stopped, paused for a move, or started again);
* the agent's settings here are gone (it moved away, or was removed), or name
  another ID, or another **epoch**: every commit of a stream here raises it, so a
  bridge of the copy before a move back acts no more;
* a moved note says the agent left this machine.

It waits, acting on nothing, while ``<runtime>/connections.hold`` exists: a move's
destination holds its connections until the copy where the agent was is gone.

Only the bridge acts through :meth:`Gate.acting`, which holds one lock: a stop
takes that lock, so a sendMessage under way ends (and is recorded) before the
bridge exits, and none starts after.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from lnk.agents.layout import Machine
from lnk.agents.settings import read_raw


class Stopped(Exception):
    """The bridge stops (asked to, or fenced out): the worker ends where it is."""


class Fence:
    def __init__(
        self, machine: Machine, agent_id: str, name: str, epoch: int, key: bytes, parent: int
    ) -> None:
        self.machine, self.agent_id, self.name = machine, agent_id, name
        self.epoch, self.key, self.parent = epoch, key, parent

    def why_not(self) -> str | None:
        """None while the bridge may act; otherwise why it must stop, for good."""
        if self.parent and os.getppid() != self.parent:
            return "its runner is gone"
        try:
            with open(self.machine.runtime_dir(self.agent_id) / "key", "rb") as f:
                key = f.read(1024)
        except OSError:
            key = b""
        if key != self.key:
            return "the agent's start it belongs to is over"
        try:
            data = read_raw(self.machine.settings_file(self.name))
        except (OSError, ValueError):
            return "the agent's settings are gone from here"
        except Exception as e:  # an unreadable settings file: act on nothing
            return f"the agent's settings can't be read ({type(e).__name__})"
        if data.get("id") != self.agent_id:
            return "the agent's settings here are another agent's"
        if data.get("epoch", 0) != self.epoch:
            return f"the agent's epoch here is {data.get('epoch')!r}, this bridge's {self.epoch}"
        if (self.machine.state_dir / "moved" / f"{self.agent_id}.json").exists():
            return "the agent moved away from here"
        return None

    def held(self) -> bool:
        return self.machine.hold_file(self.agent_id).exists()


class Gate:
    """What every worker passes through to act: the fence, the stop, the hold."""

    def __init__(
        self, fence: Fence, poll_s: float = 0.2, lock: threading.Lock | None = None
    ) -> None:
        self.fence = fence
        self.stop = threading.Event()
        self.reason = ""
        self.poll_s = poll_s
        self._lock = lock or threading.Lock()
        self._children: list[Gate] = []

    def child(self) -> Gate:
        """A gate for one worker: stopped alone (a connection taken away) or with this one;
        it shares the lock, so a stop still waits for every act under way."""
        g = Gate(self.fence, self.poll_s, self._lock)
        self._children.append(g)
        if self.stop.is_set():
            g.end(self.reason)
        return g

    def end(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
        self.stop.set()
        for g in self._children:
            g.end(reason)

    def check(self) -> None:
        """Raise Stopped if the bridge may act no more; wait while its connections are held."""
        while True:
            if self.stop.is_set():
                raise Stopped(self.reason)
            why = self.fence.why_not()
            if why is not None:
                self.end(why)
                raise Stopped(why)
            if not self.fence.held():
                return
            self.stop.wait(self.poll_s)

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """One act that must end whole once begun (a claim, a sendMessage and its record)."""
        with self._lock:
            self.check()
            yield

    def wait(self, seconds: float) -> None:
        """Sleep, ended early by a stop (then Stopped)."""
        if self.stop.wait(seconds):
            raise Stopped(self.reason)

    def drain(self, timeout: float) -> bool:
        """At the stop: wait for the act under way to end; no act starts after."""
        self.end(self.reason or "stopping")
        return self._lock.acquire(timeout=timeout)


def read_key(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1024)
    except OSError:
        return b""
