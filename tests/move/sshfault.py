"""An ``ssh`` for LNK_SSH_COMMAND that kills itself at a chosen step (tests only).

``SSHFAULT="PATTERN|MODE"``: the first ssh whose remote command contains
PATTERN dies as kill -9 would (``before`` it runs, ``after`` it ran, or
``mid-out``/``mid-in``: after its first chunk of stdout/stdin).  The marker
file ``SSHFAULT_ONCE`` makes it fire once (at the ``SSHFAULT_NTH``-th match, 1 unless set).  ``SSHFAULT_DOWN`` names a file: once
the fault fired it is created, and while it exists every ssh to any box fails
as an unreachable box does (exit 255), so "a box that stops answering".
Anything else runs the real ssh.

Two modes kill the shared connection's master (``lnk.transport.share``), found
with ``ssh -O check``: ``kill-master`` before the step runs (the step opens a
new one), ``kill-master-live`` while the step's session runs on it (once the
command is running on the box, before it got any of its stdin).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_master(args: list[str]) -> None:
    """Kill -9 the master of the shared connection this command would use."""
    check = [*args[:-3], "-O", "check", args[-3]]
    r = subprocess.run(["ssh", *check], capture_output=True, text=True, timeout=30)
    m = re.search(r"pid=(\d+)", r.stderr)
    if m is None:
        sys.stderr.write(f"sshfault: no master to kill: {r.stderr}\n")
        sys.exit(254)
    pid = int(m.group(1))
    os.kill(pid, signal.SIGKILL)
    gone(pid)


def gone(pid: int) -> None:
    """Wait until ``pid`` has exited (gone or a zombie): until then its control socket
    still accepts, and a step started meanwhile would connect to a dying master, fail
    its handshake and go direct instead of opening the next master."""
    for _ in range(2000):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)


def wait_running(words: list[str]) -> None:
    """Wait until a process (the step on the box) has all ``words`` among its arguments."""
    for _ in range(600):
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if all(w in argv for w in words) and "ssh" not in os.path.basename(argv[0]):
                return
        time.sleep(0.05)


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
    if mode == "kill-master":
        kill_master(args)
        os.execvp("ssh", argv)
    if mode == "kill-master-live":
        p = subprocess.Popen(argv, stdin=subprocess.PIPE)
        wait_running(command.split()[-4:])
        kill_master(args)
        data = sys.stdin.buffer.read()
        assert p.stdin is not None
        try:
            p.stdin.write(data)
            p.stdin.close()
        except OSError:
            pass
        sys.exit(p.wait())
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
