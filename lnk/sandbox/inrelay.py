"""``python -m lnk.sandbox.inrelay PORT SOCKET -- CMD...``: the proxy's relay inside the sandbox.

The first process in the agent's sandbox.  It starts ``CMD`` (the harness) as
its child at once, then listens on ``127.0.0.1:PORT`` in the sandbox's own
network namespace and hands that listener to the agent's proxy at ``SOCKET``
(``/run/lnk/net/proxy.sock``, bound from ``~/.lnk/agents/.net/<id>/``), which
then accepts the harness's connections itself, outside the sandbox (no byte
passes through this process); a proxy that takes no listener gets each
connection carried to it instead.  It passes
SIGTERM/SIGINT on to the harness and exits with its code; the relay is the
only way out of the namespace, and it leads only to the proxy.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[2] != "--" or not args[0].isdigit():
        print("usage: python -m lnk.sandbox.inrelay PORT SOCKET -- CMD...", file=sys.stderr)
        return 2
    child = os.fork()  # the harness first: the relay is up long before it asks for the network
    if child == 0:
        try:
            os.execvp(args[3], args[3:])
        finally:
            os._exit(127)
    # imported only now, after the fork: the harness starts before this process pays for them
    import contextlib  # noqa: PLC0415 (after the fork)
    import signal  # noqa: PLC0415 (after the fork)
    from pathlib import Path  # noqa: PLC0415 (after the fork)

    from lnk.errors import LnkError  # noqa: PLC0415 (after the fork)
    from lnk.sandbox.relay import TcpToUnixRelay, hand_over  # noqa: PLC0415 (after the fork)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    relay = TcpToUnixRelay(int(args[0]), Path(args[1]), max_connections=128)
    try:
        relay.start(listen_only=True)
        if not hand_over(relay, Path(args[1])):
            relay.serve()  # a proxy that takes no listener: carry each connection to it
    except LnkError as e:
        print(f"lnk relay: error: {e.message}", file=sys.stderr, flush=True)
        forward(signal.SIGTERM, None)
        os.waitpid(child, 0)
        return 1
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    relay.stop()
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main()
    sys.exit(code if code >= 0 else 128 - code)
