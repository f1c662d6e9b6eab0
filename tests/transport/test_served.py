"""The lnk server a move's steps go through (lnk.transport.served, .server): real processes, a
real unix socket, real fork; the step's body is a small program of the test's."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from lnk.transport import served, share
from lnk.transport.legs import LocalLeg
from tests.procs import process_runs, wait_gone

SERVER = textwrap.dedent(
    """
    import os, sys, time
    from lnk.transport import server as served

    def run(argv):
        if argv[0] == "echo":
            data = sys.stdin.buffer.read()
            out = b"|".join([data, os.environ["X"].encode(), os.getcwd().encode(),
                             b"%o" % os.umask(0)])
            sys.stdout.buffer.write(out)
            sys.stderr.write("to stderr\\n")
            sys.exit(int(argv[1]))
        if argv[0] == "kill":
            os.kill(os.getpid(), int(argv[1]))
        if argv[0] == "wait":
            with open(argv[1], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
        if argv[0] == "close":
            sys.stdout.write(str(os.getpid()))
            sys.stdout.flush()
            os.close(1)
            time.sleep(30)
        if argv[0] == "slow":
            with open(argv[1], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(1.5)
            sys.stdout.write("done")
            sys.exit(7)
        if argv[0] == "stop":
            os.kill(served.server_pid(), 15)

    path, pid = served.start(run, float(sys.argv[1]))
    print(path, pid, flush=True)
    """
)

CALLER = textwrap.dedent(
    """
    import sys
    from lnk.transport import served
    served.call(sys.argv[1], sys.argv[2:])
    print("no server: ran here")
    """
)


def started(
    tmp_path: Path, path: str, what: str, **kw: object
) -> tuple[subprocess.Popen[bytes], int]:
    """A caller running the step ``what MARKER`` in the server, and the step's pid once
    it wrote it."""
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    marker = tmp_path / "step.pid"
    caller = subprocess.Popen([sys.executable, str(script), path, what, str(marker)], **kw)  # type: ignore[call-overload]
    deadline = time.monotonic() + 20
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.05)
    return caller, int(marker.read_text())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    out = subprocess.run(
        [sys.executable, str(script), "30"], capture_output=True, text=True, check=True
    ).stdout.split()
    path, pid = out[0], int(out[1])
    try:
        yield path, pid
    finally:
        if process_runs(pid):
            os.kill(pid, signal.SIGKILL)


def call(tmp_path: Path, path: str, *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    return subprocess.run(
        [sys.executable, str(script), path, *args],
        capture_output=True,
        **kw,  # type: ignore[call-overload]
    )


def test_a_step_runs_with_the_callers_input_output_environment_folder_and_umask(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, _ = server
    work = tmp_path / "work"
    work.mkdir()
    r = call(
        tmp_path,
        path,
        "echo",
        "3",
        input=b"given",
        cwd=work,
        env={**os.environ, "X": "from the caller"},
        preexec_fn=lambda: os.umask(0o027),
    )
    assert r.returncode == 3
    assert r.stdout == b"|".join([b"given", b"from the caller", str(work).encode(), b"27"])
    assert r.stderr == b"to stderr\n"


def test_a_step_killed_by_a_signal_kills_its_caller_by_the_same(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, pid = server
    assert call(tmp_path, path, "kill", str(int(signal.SIGKILL))).returncode == -signal.SIGKILL
    assert call(tmp_path, path, "kill", str(int(signal.SIGTERM))).returncode == -signal.SIGTERM
    assert process_runs(pid)  # the server goes on
    assert (
        call(tmp_path, path, "echo", "0", input=b"", env={**os.environ, "X": "x"}).returncode == 0
    )


def test_with_no_server_the_caller_runs_the_step_itself(tmp_path: Path) -> None:
    r = call(tmp_path, str(tmp_path / "no-such-socket"), "echo", "0")
    assert r.returncode == 0 and r.stdout == b"no server: ran here\n"


def test_a_caller_killed_hangs_its_step_up(server: tuple[str, int], tmp_path: Path) -> None:
    path, server_pid = server
    caller, step = started(tmp_path, path, "wait")
    assert process_runs(step)
    caller.kill()
    caller.wait()
    assert wait_gone(step), "the step outlived its caller"
    assert process_runs(server_pid)


def test_a_signal_to_the_caller_reaches_its_step(server: tuple[str, int], tmp_path: Path) -> None:
    path, _ = server
    caller, step = started(tmp_path, path, "wait")
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=20) == -signal.SIGTERM  # the step died of it, and so did its caller
    assert wait_gone(step)


def test_a_stopped_server_removes_its_socket_and_later_steps_run_alone(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, pid = server
    assert call(tmp_path, path, "stop").returncode == 0
    assert not Path(path).exists() and not Path(path).parent.exists()
    assert wait_gone(pid)
    r = call(tmp_path, path, "echo", "0")
    assert r.stdout == b"no server: ran here\n"


def test_an_idle_server_ends_by_itself(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    out = subprocess.run(
        [sys.executable, str(script), "0.5"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert wait_gone(int(out[1]))
    assert not Path(out[0]).parent.exists()


def test_a_request_that_is_not_one_is_closed_and_the_server_goes_on(
    server: tuple[str, int], tmp_path: Path
) -> None:
    import socket

    path, pid = server
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            got = s.recv(64)
        except ConnectionResetError:
            got = b""
        assert got == b""  # closed unanswered
    assert process_runs(pid)
    r = call(tmp_path, path, "echo", "5", input=b"", env={**os.environ, "X": "x"})
    assert r.returncode == 5


PLAIN = [sys.executable, "-m", "lnk"]


def plain(argv: list[str]) -> bool:
    """A local step run as plain ``lnk``, through no server."""
    return argv[:3] == PLAIN and "--served-by" not in argv


def test_a_local_boxs_steps_go_through_its_server_inside_a_shared_block(tmp_path: Path) -> None:
    leg = LocalLeg(tmp_path / "box")
    assert plain(leg.argv(["version"]))  # outside a block: plain
    with share.shared():
        argv = leg.argv(["agent", "list", "--json"])
        # by the server's caller: this Python, isolated, the caller script, no lnk
        assert argv[:4] == [sys.executable, "-I", "-S", served.__file__]
        sock = Path(argv[4])
        assert sock.is_socket() and oct(sock.parent.stat().st_mode & 0o777) == "0o700"
        assert argv[5:] == [shlex.join(PLAIN), "--errors", "json", "agent", "list", "--json"]
        r = leg.run(["agent", "list", "--json"])
        assert b'"agents": []' in r.stdout
        assert plain(leg.argv(["version", "--json"], bare=True))
    assert not sock.exists() and not sock.parent.exists()  # stopped at the block's end
    assert plain(leg.argv(["agent", "list"]))


def test_served_steps_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_BOX_SERVE", "0")
    leg = LocalLeg(tmp_path / "box")
    with share.shared():
        assert plain(leg.argv(["agent", "list"]))


def run_caller(
    tmp_path: Path, path: str, fallback: str, *args: str, **kw: object
) -> subprocess.CompletedProcess[bytes]:
    """The server's caller as a step runs it: ``python -I -S served.py SOCKET FALLBACK``."""
    caller = served.caller()
    assert caller is not None
    return subprocess.run([*caller, path, fallback, *args], capture_output=True, **kw)  # type: ignore[call-overload]


def test_the_callers_step_runs_with_its_input_output_environment_and_status(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, _ = server
    r = run_caller(
        tmp_path,
        path,
        "false",
        "echo",
        "4",
        input=b"in",
        cwd=tmp_path,
        env={**os.environ, "X": "y"},
    )
    assert r.returncode == 4  # the step's, not the fallback's (false: 1)
    assert r.stdout.split(b"|")[:3] == [b"in", b"y", str(tmp_path).encode()]
    assert r.stderr == b"to stderr\n"
    assert run_caller(tmp_path, path, "false", "kill", "9").returncode == -signal.SIGKILL


def test_with_no_server_the_caller_runs_the_fallback_line_in_its_place(tmp_path: Path) -> None:
    # the fallback is a shell line (a box's lnk may be "env HOME=/x python3 -m lnk"); its
    # arguments reach it as given, one word each, never read by the shell
    odd = "a b $(touch pwned) 'q' \\"
    r = run_caller(
        tmp_path,
        str(tmp_path / "no-such-socket"),
        'printf "%s|" fallback',
        odd,
        "-x",
        input=b"",
        cwd=tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, f"fallback|{odd}|-x|".encode())
    assert not (tmp_path / "pwned").exists()
    gone = run_caller(tmp_path, str(tmp_path / "no-such-socket"), "exit 7", input=b"")
    assert gone.returncode == 7  # exec'd: the fallback's status is the caller's


def test_the_caller_imports_nothing_beside_it_nor_from_the_environment(tmp_path: Path) -> None:
    # -I: the folder of the script (lnk/transport, which holds pipes.py, process.py) and
    # PYTHONPATH are not on the way, so none of their modules shadows the standard library's
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "json.py").write_text("raise SystemExit('shadowed')\n")
    r = run_caller(
        tmp_path,
        str(tmp_path / "no-such-socket"),
        "echo ran",
        input=b"",
        env={**os.environ, "PYTHONPATH": str(evil)},
    )
    assert (r.returncode, r.stdout) == (0, b"ran\n"), r.stderr
    r = subprocess.run(
        [*(served.caller() or ()), "-c"], capture_output=True, input=b""
    )  # too few words: a usage line, not a traceback
    assert r.returncode == 2 and r.stderr.startswith(b"lnk: error: usage")


def test_a_step_that_closes_its_output_ends_it_for_the_reader(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, _ = server
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    caller = subprocess.Popen([sys.executable, str(script), path, "close"], stdout=subprocess.PIPE)
    assert caller.stdout is not None
    out = caller.stdout.read()  # the end of output: the step holds it alone
    step = int(out)
    assert process_runs(step) and caller.poll() is None  # still running, yet its output ended
    caller.send_signal(signal.SIGTERM)
    caller.wait(timeout=20)
    assert wait_gone(step)


def test_a_new_server_removes_the_folders_of_killed_ones(tmp_path: Path) -> None:
    import socket
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="lnkrt-", dir="/tmp"))
    try:
        dead = base / "lnk-serve-dead"
        dead.mkdir(mode=0o700)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(dead / "s"))  # bound, then closed: nothing listens there
        empty = base / "lnk-serve-empty"
        empty.mkdir(mode=0o700)
        other = base / "not-a-server"
        other.mkdir()
        script = tmp_path / "server.py"
        script.write_text(SERVER)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(base)}
        out = subprocess.run(
            [sys.executable, str(script), "30"], capture_output=True, text=True, check=True, env=env
        ).stdout.split()
        live = Path(out[0]).parent
        try:
            assert live.parent == base and live.exists()
            assert not dead.exists() and not empty.exists() and other.exists()
            # a second server leaves the first, which is alive, alone
            again = subprocess.run(
                [sys.executable, str(script), "30"],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            ).stdout.split()
            assert live.exists() and Path(again[0]).parent.exists()
            os.kill(int(again[1]), signal.SIGKILL)
        finally:
            os.kill(int(out[1]), signal.SIGKILL)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_a_step_whose_server_is_killed_meanwhile_still_tells_how_it_ended(
    server: tuple[str, int], tmp_path: Path
) -> None:
    path, server_pid = server
    caller, _ = started(tmp_path, path, "slow", stdout=subprocess.PIPE)
    os.kill(server_pid, signal.SIGKILL)
    out, _ = caller.communicate(timeout=30)
    assert (caller.returncode, out) == (7, b"done")  # not run again, not failed


class _AnsweringLeg(LocalLeg):
    """A local box whose ``box serve`` answers ``reply`` (what a hostile or broken
    box could say)."""

    def __init__(self, home: Path, reply: str) -> None:
        super().__init__(home)
        self.reply = reply

    def lnk_argv(self, args: Sequence[str]) -> list[str]:
        if list(args[-3:]) == ["box", "serve", "--json"]:
            return ["/bin/sh", "-c", 'printf "%s" "$1"', "sh", self.reply]
        return super().lnk_argv(args)


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "not json",
        '{"socket": 5, "pid": 1}',
        '{"pid": 1}',
        '{"socket": "' + "x" * 70_000 + '", "pid": 1}',
        '{"socket": "/s", "pid": 1, "caller": "python3 served.py"}',
        '{"socket": "/s", "pid": 1, "caller": [5]}',
        # a NUL no command line can hold: not a traceback, no server
        '{"socket": "/s\\u0000x", "pid": 1}',
        '{"socket": "/s", "pid": 1, "caller": ["/bin/python3\\u0000", "-I"]}',
    ],
)
def test_a_server_answer_that_is_not_one_leaves_the_steps_plain(tmp_path: Path, reply: str) -> None:
    leg = _AnsweringLeg(tmp_path / "box", reply)
    with share.shared():
        assert plain(leg.argv(["agent", "list", "--json"]))
        assert b'"agents": []' in leg.run(["agent", "list", "--json"]).stdout


@pytest.mark.parametrize("caller", ["", ', "caller": null', ', "caller": []'])
def test_an_older_server_without_a_caller_is_called_by_lnk(tmp_path: Path, caller: str) -> None:
    leg = _AnsweringLeg(tmp_path / "box", '{"socket": "/no/such/s", "pid": 1' + caller + "}")
    with share.shared():
        argv = leg.argv(["agent", "list", "--json"])
        assert argv[3:5] == ["--served-by", "/no/such/s"]
        assert b'"agents": []' in leg.run(["agent", "list", "--json"]).stdout  # ran in place


def test_a_boxs_socket_path_reaches_its_shell_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    from lnk.transport.legs import SshLeg

    hostile = "/tmp/x $(touch /tmp/owned); `id` 'q'/s"
    served_at = share.Served(hostile)
    monkeypatch.setattr(SshLeg, "_serve", lambda self: (served_at, lambda: None))
    with share.shared():
        argv = SshLeg("box1").argv(["agent", "list"])
    line = argv[-1]
    assert shlex.split(line)[1:3] == ["--served-by", hostile]  # one word, as given


def test_a_boxs_caller_and_its_lnk_reach_its_shell_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    from lnk.transport.legs import SshLeg

    hostile = "/tmp/x $(touch /tmp/owned); `id` 'q'"
    served_at = share.Served(f"{hostile}/s", (f"{hostile}/python3", "-I", "-S", f"{hostile}.py"))
    monkeypatch.setattr(SshLeg, "_serve", lambda self: (served_at, lambda: None))
    monkeypatch.setenv("LNK_REMOTE_LNK", "env HOME=/x python3 -m lnk")
    with share.shared():
        argv = SshLeg("box1").argv(["agent", "list", "$(id)"])
    words = shlex.split(argv[-1])
    assert words[:5] == [*(served_at.caller or ()), served_at.socket]
    # the box's lnk: one word (the fallback line its shell runs), the step's words after
    assert words[5:] == ["env HOME=/x python3 -m lnk", "--errors", "json", "agent", "list", "$(id)"]
