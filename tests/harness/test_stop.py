"""The built-in harness, and the Hermes adapter's endpoint, stop as soon as they are
told, whatever their loop's poll interval.

``serve_forever`` notices a stop only when its ``select`` returns; ``shut_down``
(lnk_hermes: ``stop_now``) knocks on the server's own socket so it returns at once.  With a poll of an
hour, a stop that did not knock would not end within the join's guard below.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from lnk_hermes.serve import stop_now

from lnk.harness.__main__ import shut_down


class _Quiet(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(1)


@pytest.mark.parametrize("stop", [shut_down, stop_now], ids=["builtin", "hermes"])
@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_stop_ends_the_loop_without_waiting_for_its_poll(
    kind: str, stop: Callable[[socketserver.BaseServer], None], tmp_path: Path
) -> None:
    server: socketserver.TCPServer
    if kind == "tcp":
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Quiet)
    else:
        server = socketserver.ThreadingUnixStreamServer(str(tmp_path / "h.sock"), _Quiet)
    server.daemon_threads = True
    loop = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 3600}, daemon=True
    )
    loop.start()
    try:
        threading.Thread(target=stop, args=(server,), daemon=True).start()
        loop.join(60)
        assert not loop.is_alive(), "the loop waited for its next poll"
    finally:
        if loop.is_alive():
            server._BaseServer__shutdown_request = True  # type: ignore[attr-defined]
        server.server_close()
