"""What keeps a bridge standing: the deadline, places by user, the cap on calls."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import AGENT, OWNER, WAIT, Raw, Recorder, ServerFactory, hello

from lnk.bridges import wire
from lnk.bridges.client import call
from lnk.bridges.server import Call
from lnk.errors import TransportError

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # one the user nobody may run (ours lives under /root)


def test_a_slow_drip_is_cut_by_the_deadline_over_the_whole_exchange(
    make_server: ServerFactory, recorder: Recorder
) -> None:
    # Each byte comes well inside the deadline; all of them together take far longer.
    server = make_server(deadline=0.5)
    raw = Raw(server.socket_path)
    line = json.dumps(hello()).encode()[:-1] + b" " * 400 + b"}\n"
    sent = 0
    answer = b""
    raw.sock.settimeout(0.02)  # the pace of the drip, not a wait for the server
    try:
        for byte in line:
            raw.send_bytes(bytes([byte]))
            sent += 1
            try:
                answer = raw.sock.recv(4096)
            except TimeoutError:
                continue
            break
    except (BrokenPipeError, ConnectionResetError):
        pass
    raw.sock.settimeout(WAIT)
    raw.buf = answer
    assert sent < len(line), "the whole line got through: the deadline is not over the exchange"
    assert raw.error_code() == wire.TOO_SLOW
    assert raw.closed()
    assert recorder.calls == []


def test_a_caller_that_never_sends_the_proof_is_cut(make_server: ServerFactory) -> None:
    server = make_server(deadline=0.5)
    raw = Raw(server.socket_path)
    raw.send(hello())
    assert "challenge" in raw.line()
    assert raw.error_code() == wire.TOO_SLOW
    assert raw.closed()


def test_a_users_newest_unproven_connection_replaces_its_oldest(
    make_server: ServerFactory, key: bytes, recorder: Recorder
) -> None:
    server = make_server(places_per_user=3)
    conns = [Raw(server.socket_path) for _ in range(5)]
    # The two oldest are told why and closed ...
    for old in conns[:2]:
        assert old.error_code() == wire.REPLACED
        assert old.closed()
    # ... and the three newest are still open: each can finish its call.
    for n, raw in enumerate(conns[2:]):
        raw.send(hello())
        assert raw.prove(key, body={"n": n}) == {
            "ok": True,
            "result": {"echo": {"n": n}, "agent": AGENT, "uid": os.getuid()},
        }
    assert len(recorder.calls) == 3


def test_a_proved_call_frees_its_place(make_server: ServerFactory, key: bytes) -> None:
    server = make_server(places_per_user=1)
    for n in range(5):
        assert call(server.socket_path, AGENT, OWNER, key, "echo", {"n": n})["echo"] == {"n": n}


FLOOD = r"""
import json, select, socket, sys, time
path, n, keep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socks.append(s)
got = {i: b"" for i in range(n)}
closed = set()
deadline = time.monotonic() + 20
while len(closed) < n - keep and time.monotonic() < deadline:
    live = [s for i, s in enumerate(socks) if i not in closed]
    ready, _, _ = select.select(live, [], [], 0.2)
    for s in ready:
        i = socks.index(s)
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            data = b""
        if data:
            got[i] += data
        else:
            closed.add(i)
print(json.dumps({"uid": __import__("os").getuid(), "closed": sorted(closed),
                  "said": sorted({got[i].decode() for i in closed})}), flush=True)
sys.stdin.readline()   # hold the newest connections open until told
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own tmp dirs are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="lnk-bridge-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def test_a_flood_from_one_user_never_blocks_another_users_proof(
    make_server: ServerFactory, key: bytes, shared_dir: Path
) -> None:
    assert os.getuid() == 0, "this test runs a flood as another user, which takes root"
    path = shared_dir / "b.sock"
    server = make_server(socket_path=path, mode=0o666, places_per_user=4, deadline=60)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    with subprocess.Popen(
        [SYSTEM_PYTHON, "-c", FLOOD, str(path), "50", "4"],
        user=NOBODY,
        group=NOBODY,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as flood:
        try:
            assert flood.stdout is not None and flood.stdin is not None
            report = json.loads(flood.stdout.readline())
            assert report["uid"] == NOBODY
            # The flooder's 46 oldest connections were closed, each told why; its 4 newest hold.
            assert report["closed"] == list(range(46))
            said = [json.loads(line) for text in report["said"] for line in text.splitlines()]
            assert said and all(s["error"]["code"] == wire.REPLACED for s in said)
            # While those 4 places are held, another user proves at once.
            raw = Raw(server.socket_path)
            raw.send(hello())
            assert raw.prove(key, body={"me": "root"})["result"]["echo"] == {"me": "root"}
            assert call(path, AGENT, OWNER, key, "echo", {"again": 1})["uid"] == 0
            flood.stdin.write("done\n")
            flood.stdin.flush()
            assert flood.wait(WAIT) == 0
        finally:
            if flood.poll() is None:
                flood.kill()


def test_the_busy_cap(make_server: ServerFactory, key: bytes) -> None:
    entered = threading.Event()
    release = threading.Event()

    def hold(call: Call) -> dict[str, Any]:
        entered.set()
        assert release.wait(WAIT)
        return {"held": True}

    def quick(call: Call) -> dict[str, Any]:
        return {"quick": True}

    server = make_server(handlers={"hold": hold, "quick": quick}, max_calls=1)
    first: dict[str, Any] = {}

    def first_call() -> None:
        first["result"] = call(server.socket_path, AGENT, OWNER, key, "hold", {})

    t = threading.Thread(target=first_call)
    t.start()
    try:
        assert entered.wait(WAIT)
        with pytest.raises(TransportError, match=r"\(busy\)") as e:
            call(server.socket_path, AGENT, OWNER, key, "quick", {})
        assert e.value.hint
    finally:
        release.set()
        t.join(WAIT)
    assert first["result"] == {"held": True}
    # Once the held call is done, its room is free again.
    assert call(server.socket_path, AGENT, OWNER, key, "quick", {}) == {"quick": True}


def test_unproven_connections_do_not_count_against_the_cap(
    make_server: ServerFactory, key: bytes
) -> None:
    server = make_server(max_calls=1, places_per_user=8)
    idle = [Raw(server.socket_path) for _ in range(5)]
    for raw in idle:
        raw.send(hello())
        assert "challenge" in raw.line()
    assert call(server.socket_path, AGENT, OWNER, key, "echo", {"x": 1})["echo"] == {"x": 1}


def test_stop_closes_waiting_connections(make_server: ServerFactory) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello())
    assert "challenge" in raw.line()
    server.stop()
    assert raw.closed()
    assert not server.socket_path.exists()


def test_serve_forever_in_the_foreground(tmp_path: Path, key: bytes, recorder: Recorder) -> None:
    from lnk.bridges.server import BridgeServer

    path = tmp_path / "fg" / "b.sock"
    server = BridgeServer(path, lambda a, o: key, {"echo": recorder.echo})
    t = threading.Thread(target=server.serve_forever)
    t.start()
    try:
        deadline = time.monotonic() + WAIT
        while not path.exists():
            assert time.monotonic() < deadline, "the server never made its socket"
            threading.Event().wait(0.01)
        assert call(path, AGENT, OWNER, key, "echo", {"fg": 1})["echo"] == {"fg": 1}
    finally:
        server.stop()
        t.join(WAIT)
    assert not t.is_alive()
    assert not path.exists()
