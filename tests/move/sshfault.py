"""An ``ssh`` for LNK_SSH_COMMAND that kills itself at a chosen step (tests only).

``SSHFAULT="PATTERN|MODE"``: the first ssh whose remote command contains
PATTERN dies as kill -9 would (``before`` it runs, ``after`` it ran, or
``mid-out``/``mid-in``: after its first chunk of stdout/stdin).  The marker
file ``SSHFAULT_ONCE`` makes it fire once (at the ``SSHFAULT_NTH``-th match, 1 unless set).  ``SSHFAULT_DOWN`` names a file: once
the fault fired it is created, and while it exists every ssh to any box fails
as an unreachable box does (exit 255), so "a box that stops answering".
Anything else runs the real ssh.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    args = sys.argv[1:]
    argv = ["ssh", *args]
    down = os.environ.get("SSHFAULT_DOWN", "")
    if down and os.path.exists(down):
        sys.stderr.write("ssh: connect to host box port 22: Connection refused\n")
        sys.exit(255)
    spec = os.environ.get("SSHFAULT", "")
    once = os.environ.get("SSHFAULT_ONCE", "")
    command = args[-1] if args else ""
    pattern, _, mode = spec.partition("|")
    if not pattern or pattern not in command or not once or os.path.exists(once):
        os.execvp("ssh", argv)
    nth = int(os.environ.get("SSHFAULT_NTH", "1"))
    if nth > 1:  # count the matching runs; fire at the nth
        counter = once + ".n"
        seen = 1
        if os.path.exists(counter):
            with open(counter) as f:
                seen += int(f.read())
        with open(counter, "w") as f:
            f.write(str(seen))
        if seen < nth:
            os.execvp("ssh", argv)
    with open(once, "x"):
        pass
    if mode == "before":
        die()
    if mode == "after":
        code = subprocess.call(argv)
        if down:
            open(down, "w").close()
            sys.exit(code)
        die()
    if mode == "mid-out":
        p = subprocess.Popen(argv, stdout=subprocess.PIPE)
        assert p.stdout is not None
        chunk = p.stdout.read1(65536)  # type: ignore[attr-defined]
        os.write(1, chunk)
        p.kill()
        die()
    if mode == "mid-in":
        p = subprocess.Popen(argv, stdin=subprocess.PIPE)
        assert p.stdin is not None
        chunk = os.read(0, 65536)
        p.stdin.write(chunk)
        p.stdin.flush()
        p.kill()
        die()
    os.execvp("ssh", argv)


if __name__ == "__main__":
    main()
