"""``python -m lnk.harness``: the built-in harness's own command line.

    serve --config FILE --key-file FILE (--port P | --unix PATH)
        answer as the agent on its endpoint until SIGTERM/SIGINT
    probe-connect HOST PORT
        exit 0 if a TCP connection to HOST:PORT can be made, 1 if not
        (the sandbox tests run it inside the sandbox)

The key is read from a file (bound read-only into the sandbox), never argv.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import socketserver
import sys
import threading
from pathlib import Path

from lnk import logs
from lnk.errors import LnkError
from lnk.harness.server import HarnessConfig, make_server, probe_connect, read_key_file
from lnk.signals import on_signals

log = logs.get("harness")

TURN_GRACE_S = 60.0


def serve(args: argparse.Namespace) -> int:
    config = HarnessConfig.load(Path(args.config))
    key = read_key_file(Path(args.key_file))
    server = make_server(config, key, port=args.port, unix=Path(args.unix) if args.unix else None)

    def stop(signum: int) -> None:
        log.info("signal %s, stopping", signum)
        shut_down(server)

    on_signals(stop)  # not in a Python handler (lnk.signals)
    where = args.unix or f"127.0.0.1:{args.port}"
    log.info(
        "agent %s (%s) listening on %s, sandboxed=%s",
        config.name,
        config.id,
        where,
        config.sandboxed,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        # a stop lets the running turn end and answer before the process goes
        if not server.lnk_conversations.wait_idle(TURN_GRACE_S):
            log.info("a turn was still running at the stop; the next start finishes it")
        server.server_close()
    return 0


def shut_down(server: socketserver.BaseServer) -> None:
    """Stop ``serve_forever`` now: its loop sees a stop only when its ``select`` returns,
    which is at its next poll (up to 0.2 s later: every stop, so every move's pause,
    waited for it) unless a connection wakes it; so knock until it has stopped."""
    t = threading.Thread(target=server.shutdown, daemon=True)
    t.start()
    while t.is_alive():
        knock(server)
        t.join(0.02)


def knock(server: socketserver.BaseServer) -> None:
    """Connect to the server's own listening socket and hang up (it answers nothing)."""
    if not isinstance(server, socketserver.TCPServer):
        return
    with (
        contextlib.suppress(OSError),
        socket.socket(server.address_family, socket.SOCK_STREAM) as s,
    ):
        s.settimeout(0.5)
        s.connect(server.server_address)


def main(argv: list[str] | None = None) -> int:
    logs.setup()
    parser = argparse.ArgumentParser(prog="python -m lnk.harness")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--config", required=True)
    p.add_argument("--key-file", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument("--unix")
    q = sub.add_parser("probe-connect")
    q.add_argument("host")
    q.add_argument("port", type=int)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "serve":
            return serve(args)
        return 0 if probe_connect(args.host, args.port) else 1
    except LnkError as e:
        print(f"lnk harness: error: {e.message}", file=sys.stderr, flush=True)
        if e.hint:
            print(f"lnk harness: hint: {e.hint}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
