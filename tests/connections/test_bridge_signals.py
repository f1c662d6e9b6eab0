"""SIGTERM ends the bridge even when it comes while the main thread is inside the gate's
Event (lnk.signals).

The bridge's loop waits on that Event four times a second and holds the Event's lock a
moment each time.  A Python handler that set the Event there waited for a lock its own
thread held: the bridge never ended and its runner killed it after 30 s (seen once).
The window is made wide on purpose: a real process holds the lock, sends itself SIGTERM
and sleeps, which is where a Python handler would run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lnk

CHILD = """
import os, signal, time
from lnk.signals import on_signals
from lnk.connections.fence import Gate

class Open:  # a fence that lets the bridge act: only the signal ends it
    def why_not(self): return None
    def held(self): return False

gate = Gate(Open())
ended = []
on_signals(lambda n: (gate.end(f'signal {n}'), ended.append(1)))
with gate.stop._cond:  # the main thread inside the Event
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # a Python handler runs here, in this thread, the lock held
print("ended" if gate.stop.wait(60) else "still running", gate.reason, len(ended), flush=True)
"""


def test_a_signal_inside_the_gates_event_still_ends_the_bridge() -> None:
    # the lnk under test, wherever it is (a clone anywhere, any install mode)
    env = {**os.environ, "PYTHONPATH": str(Path(lnk.__file__).resolve().parent.parent)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ended", "signal", "15", "1"], (r.stdout, r.stderr)
