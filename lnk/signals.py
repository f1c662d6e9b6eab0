"""SIGTERM and SIGINT acted on by a thread of their own, not in a Python signal handler.

A Python handler runs in the main thread between two of its bytecodes, wherever that
thread is: inside an Event it waits on, for one, holding the Event's lock for a moment.
A handler that sets that Event then waits for a lock its own thread holds, for ever
(the bridge, whose loop waits on its gate's Event four times a second: seen once, a
stop that waited the runner's 30 s).  And a line logged from a handler may land in the
middle of one the main thread is writing.  So the handler here does nothing; the
C-level handler writes the signal's number to the wakeup fd, and a thread reading it
does the work, in ordinary code.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

ENDING = (signal.SIGTERM, signal.SIGINT)


def on_signals(then: Callable[[int], None]) -> None:
    """Call ``then(signum)`` once, from a thread of its own, at the first SIGTERM or
    SIGINT.  From the main thread, once per process."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # before the handlers: no signal is taken and lost
    for s in ENDING:
        signal.signal(s, _noted)

    def wait() -> None:
        while True:
            try:
                got = os.read(wake_r, 64)
            except InterruptedError:
                continue
            if not got:
                return
            ends = [n for n in got if n in ENDING]
            if ends:
                then(ends[0])
                return

    threading.Thread(target=wait, name="signals", daemon=True).start()


def _noted(signum: int, frame: FrameType | None) -> None:
    """A signal's Python handler: nothing (its number went to the wakeup fd)."""
