"""From the pause on, a signal fails the move instead of ending lnk midway.

A move stopped between the pause and the agent answering where it went must
still be undone (the agent resumed where it was, the copy there removed), so
while :func:`deferred_signals` holds, SIGINT, SIGTERM and SIGHUP kill only the
children the move runs, and the next :meth:`Guard.check` raises.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from lnk.errors import Interrupted
from lnk.transport.process import LegProcess


class Guard:
    def __init__(self) -> None:
        self.children: set[LegProcess] = set()
        self.signal: int | None = None

    def handler(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        for c in list(self.children):
            with contextlib.suppress(OSError):
                c.kill()

    def check(self) -> None:
        if self.signal is not None:
            raise Interrupted(
                f"stopped by {signal.Signals(self.signal).name} during the move", signum=self.signal
            )


guard = Guard()


@contextlib.contextmanager
def deferred_signals() -> Iterator[Guard]:
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, guard.handler) for s in sigs}
    try:
        yield guard
    finally:
        guard.signal = None
        for s, h in old.items():
            signal.signal(s, h)
