"""One conformance check that LocalLeg and SshLeg (against a real sshd) both pass."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

import pytest
from hosts import Hosts

from lnk import __version__
from lnk.errors import InvalidInput, LnkError, NotFound, TransportError
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.protocol import ServerReady
from lnk.transport import share
from lnk.transport.errorline import error_line
from lnk.transport.legs import Leg, SshLeg
from lnk.transport.pipes import pipe
from tests.procs import process_runs, wait_gone

SIZE = 64 << 20
CHUNK = 1 << 20


def _write_blob(path: Path, size: int, seed: int) -> str:
    rnd = random.Random(seed)
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = rnd.randbytes(min(CHUNK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _hash_stream(f: IO[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for chunk in iter(lambda: f.read(CHUNK), b""):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def test_runs_lnk_at_its_place(leg: tuple[Leg, Path]) -> None:
    place, home = leg
    r = place.run(["version", "--json"])
    assert json.loads(r.stdout) == {"version": __version__, "stream_format": STREAM_FORMAT}
    assert place.run_shell('printf %s "$HOME"').stdout.decode() == str(home)


def test_exit_codes_pass_through(leg: tuple[Leg, Path]) -> None:
    place, _ = leg
    assert place.run(["box", "remove", "nope"], check=False).returncode == NotFound.exit_code
    assert place.run_shell("exit 7", check=False).returncode == 7
    assert place.run(["box", "list"], check=False).returncode == 0


def test_failing_command_raises_its_error(leg: tuple[Leg, Path]) -> None:
    place, _ = leg
    with pytest.raises(NotFound) as e:
        place.run(["box", "remove", "nope"])
    assert "there is no box named 'nope'" in e.value.message
    assert e.value.hint == "see lnk box list"
    with pytest.raises(LnkError) as e2:
        place.run_shell("echo first >&2; echo 'it broke' >&2; exit 3")
    assert "it broke" in e2.value.message


def test_stderr_is_captured(leg: tuple[Leg, Path]) -> None:
    place, _ = leg
    r = place.run_shell("echo out; echo oops >&2; exit 1", check=False)
    assert (r.returncode, r.stdout, r.stderr) == (1, b"out\n", b"oops\n")
    with place.popen_shell("echo late >&2; exit 4") as p:
        assert p.wait(check=False) == 4
        assert p.stderr_text() == "late\n"


def test_arguments_arrive_unchanged(leg: tuple[Leg, Path]) -> None:
    place, _ = leg
    for odd in ["it's", "$HOME", "a b", "x;true", "`x`", "*", '"q"', "-h"]:
        r = place.run(["box", "remove", "--", odd], check=False)
        assert r.returncode == InvalidInput.exit_code, r.stderr
        err = error_line(r.stderr.decode())
        assert err is not None and err["message"] == f"{odd!r} is not a valid agent name"


def test_stream_64mib_both_ways(leg: tuple[Leg, Path], tmp_path: Path) -> None:
    place, _ = leg
    blob = tmp_path / "blob"
    digest = _write_blob(blob, SIZE, seed=1)
    # up: a file as stdin, the far end hashes what it stored
    with blob.open("rb") as f:
        r = place.run_shell(
            'mkdir -p "$HOME" && cat > "$HOME/blob" && sha256sum "$HOME/blob"', stdin=f
        )
    assert r.stdout.split()[0].decode() == digest
    # down: stdout read as a stream
    with place.popen_shell('cat "$HOME/blob"') as p:
        assert p.stdout is not None
        assert _hash_stream(p.stdout) == (digest, SIZE)
        assert p.wait() == 0
    # both at once: a writer thread feeds stdin while this thread reads stdout
    with place.popen_shell("cat", stdin=subprocess.PIPE) as p:
        assert p.stdin is not None and p.stdout is not None
        sink: IO[Any] = p.stdin

        def feed() -> None:
            with blob.open("rb") as f, sink:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    sink.write(chunk)

        t = threading.Thread(target=feed)
        t.start()
        got = _hash_stream(p.stdout)
        t.join(timeout=120)
        assert not t.is_alive()
        assert got == (digest, SIZE)
        assert p.wait() == 0


def test_pipe_between_legs_fd_to_fd(leg: tuple[Leg, Path]) -> None:
    place, _ = leg
    n = 8 << 20
    src_hash = place.run_shell(
        f'mkdir -p "$HOME" && head -c {n} /dev/urandom > "$HOME/src" && sha256sum < "$HOME/src"'
    ).stdout.split()[0]
    res = pipe(place, 'cat "$HOME/src"', place, 'cat > "$HOME/dst"')
    assert (res.source_code, res.sink_code) == (0, 0)
    assert place.run_shell('sha256sum < "$HOME/dst"').stdout.split()[0] == src_hash


def test_box_to_box_through_this_computer(ssh_env: Hosts) -> None:
    """hostA's random bytes stream through this computer into hostB; the hashes match."""
    a, b = SshLeg("hostA"), SshLeg("hostB")
    n = 32 << 20
    res = pipe(
        a, f'head -c {n} /dev/urandom | tee "$HOME/sent"', b, 'sha256sum > "$HOME/received.sha"'
    )
    assert (res.source_code, res.sink_code) == (0, 0)
    sent = a.run_shell('sha256sum < "$HOME/sent"').stdout.split()[0]
    received = b.run_shell('cat "$HOME/received.sha"').stdout.split()[0]
    assert sent == received
    assert ssh_env["hostA"].home != ssh_env["hostB"].home


def test_pipe_raises_the_sinks_error_first(ssh_env: Hosts) -> None:
    a, b = SshLeg("hostA"), SshLeg("hostB")
    with pytest.raises(NotFound) as e:
        pipe(a, ["version", "--json"], b, ["box", "remove", "nope"])
    assert e.value.message.startswith("on hostB: ")


def test_unreachable_box_is_a_transport_error(ssh_env: Hosts) -> None:
    with pytest.raises(TransportError) as e:
        SshLeg("hostDown").run(["version", "--json"])
    assert e.value.exit_code == 12
    assert "cannot reach box hostDown over SSH" in e.value.message
    assert "Connection refused" in e.value.message
    assert e.value.hint == "check that 'ssh hostDown' works from this computer"


def test_missing_remote_lnk_is_named(ssh_env: Hosts, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_REMOTE_LNK", "no-such-lnk-here")
    with pytest.raises(TransportError) as e:
        SshLeg("hostA").run(["--version"])
    assert "lnk is not installed on box hostA" in e.value.message


def test_missing_ssh_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_SSH_COMMAND", "/nonexistent/ssh -F x")
    with pytest.raises(TransportError) as e:
        SshLeg("somewhere").run(["--version"])
    assert "'/nonexistent/ssh' was not found" in e.value.message


@pytest.mark.parametrize("dest", ["-oProxyCommand=x", "a b", ""])
def test_bad_destinations_refused(dest: str) -> None:
    with pytest.raises(InvalidInput):
        SshLeg(dest)


def test_remote_command_quotes_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_SSH_COMMAND", "ssh -F '/my dir/cfg'")
    monkeypatch.setenv("LNK_REMOTE_LNK", "env HOME=/x python3 -m lnk")
    argv = SshLeg("box1").argv(["agent", "it's", "$HOME"])
    assert argv == [
        "ssh",
        "-F",
        "/my dir/cfg",
        "box1",
        "--",
        "env HOME=/x python3 -m lnk --errors json agent 'it'\"'\"'s' '$HOME'",
    ]


def test_a_boxs_steps_go_through_its_servers_caller_and_then_its_own_lnk(
    ssh_env: Hosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real SSH: the server a box starts offers its caller (``python -I -S
    served.py``); a step sent by it runs in the server (``box serve --stop`` is a
    server's step only), and once the server is gone the same line runs the box's
    lnk in its place (the same step is then refused as no server's, in one line)."""
    leg = SshLeg("hostA")
    ready = leg.ask(["box", "serve", "--json"], ServerReady)  # outside a block: plain
    assert ready.caller is not None and ready.caller[1:3] == ("-I", "-S")
    served_at = share.Served(ready.socket, ready.caller)
    monkeypatch.setattr(SshLeg, "_serve", lambda self, current=None: (served_at, lambda: None))
    try:
        with share.shared():
            line = shlex.split(leg.argv(["agent", "list", "--json"])[-1])
            assert line[:5] == [*ready.caller, ready.socket]
            assert json.loads(leg.run(["agent", "list", "--json"]).stdout)["agents"] == []
            assert leg.run(["box", "serve", "--stop"]).returncode == 0  # ran in the server
            assert wait_gone(ready.pid)
            # no server: the caller runs the box's lnk with the step's words, as given
            assert json.loads(leg.run(["agent", "list", "--json"]).stdout)["agents"] == []
            r = leg.run(["box", "serve", "--stop"], check=False)
            assert r.returncode == 2 and b"no server's step" in r.stderr
    finally:
        if process_runs(ready.pid):
            os.kill(ready.pid, signal.SIGKILL)
