"""Two legs' commands piped into each other, and the end that failed first.

:func:`pipe` connects one leg's stdout straight to another's stdin: the two
child processes share a pipe, and no byte passes through Python.
:func:`settle` waits for both ends and names the cause of a failure, not its
echo at the other end.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lnk.errors import LnkError
from lnk.transport.errorline import error_line
from lnk.transport.legs import Leg
from lnk.transport.process import LegProcess, Stdin, Stdout


@dataclass
class RelayResult:
    source_code: int
    sink_code: int


def pipe(
    src: Leg,
    src_cmd: Sequence[str] | str,
    dst: Leg,
    dst_cmd: Sequence[str] | str,
    *,
    check: bool = True,
) -> RelayResult:
    """Stream ``src``'s stdout into ``dst``'s stdin, fd to fd, and wait for both.

    A command is a list (``lnk`` arguments) or a string (a shell line).  This
    computer only relays: the two children share one OS pipe, so the bytes
    never enter Python.  With ``check`` a failure raises the error of the end
    that failed *first*: a sender that fails ("Home/x changed while it was
    read") makes its receiver fail too ("the stream was cut short"), and a
    receiver that fails ("disk full") breaks its sender's pipe; the first is
    the cause, the second only its echo.
    """
    a = _start(src, src_cmd, subprocess.DEVNULL, subprocess.PIPE)
    try:
        assert a.stdout is not None
        b = _start(dst, dst_cmd, a.stdout, subprocess.DEVNULL)
    except BaseException:
        a.close()
        raise
    a.stdout.close()  # only the two children hold the pipe now
    with a, b:
        code_a, code_b, err = settle(src, a, dst, b)
    if check and err is not None:
        raise err
    return RelayResult(code_a, code_b)


def settle(src: Leg, a: LegProcess, dst: Leg, b: LegProcess) -> tuple[int, int, LnkError | None]:
    """Wait for both ends of a pipe: their exit codes and the error to raise, if any.

    A sender that fails makes its receiver fail ("cut short") and a receiver that
    fails breaks its sender's pipe: the end that failed first is the cause, and
    its own error is the one given.  An end that told its error (the protocol's
    JSON line) outranks one that died without a word.
    """
    ended: dict[str, float] = {}
    try:
        code_a, code_b = _wait_both(a, b, ended)
    except BaseException:
        a.kill()
        b.kill()
        raise
    order = [(src, code_a, a), (dst, code_b, b)]
    if ended.get("b", 0.0) < ended.get("a", 0.0):
        order.reverse()
    failed = [(leg, code, p) for leg, code, p in order if code != 0]
    told = [f for f in failed if error_line(f[2].stderr_text()) is not None]
    for leg, code, p in told or failed:
        try:
            leg.check(code, p.stderr_text())
        except LnkError as e:
            return code_a, code_b, e
    return code_a, code_b, None


def _wait_both(a: LegProcess, b: LegProcess, ended: dict[str, float]) -> tuple[int, int]:
    """Wait for both ends, noting when each ended."""

    def watch(key: str, p: LegProcess) -> None:
        p.proc.wait()
        ended[key] = time.monotonic()

    t = threading.Thread(target=watch, args=("a", a), daemon=True)
    t.start()
    code_b = b.wait(check=False)
    ended.setdefault("b", time.monotonic())
    code_a = a.wait(check=False)
    t.join()
    return code_a, code_b


def _start(leg: Leg, cmd: Sequence[str] | str, stdin: Stdin, stdout: Stdout) -> LegProcess:
    if isinstance(cmd, str):
        return leg.popen_shell(cmd, stdin=stdin, stdout=stdout)
    return leg.popen(cmd, stdin=stdin, stdout=stdout)
