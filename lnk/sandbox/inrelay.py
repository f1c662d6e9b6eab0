"""``python -m lnk.sandbox.inrelay PORT SOCKET -- CMD...``: the proxy's relay inside the sandbox.

The first process in the agent's sandbox.  It listens on ``127.0.0.1:PORT``
in the sandbox's own network namespace and carries each connection to the
agent's proxy at ``SOCKET`` (``/run/lnk/net/proxy.sock``, bound from
``~/.lnk/agents/.net/<id>/``), then runs ``CMD`` as its child and passes
SIGTERM/SIGINT on to it, exiting with its code.  The relay is the only way
out of the namespace, and it leads only to the proxy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from lnk.sandbox.relay import TcpToUnixRelay


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[2] != "--" or not args[0].isdigit():
        print("usage: python -m lnk.sandbox.inrelay PORT SOCKET -- CMD...", file=sys.stderr)
        return 2
    relay = TcpToUnixRelay(int(args[0]), Path(args[1]), max_connections=128)
    relay.start()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(args[3], args[3:])
        finally:
            os._exit(127)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    relay.stop()
    return os.waitstatus_to_exitcode(status) if status else 0


if __name__ == "__main__":
    code = main()
    sys.exit(code if code >= 0 else 128 - code)
