"""Legs: one way to run an ``lnk`` command at a place, with pipes.

A move runs ``lnk agent state-send`` where the agent leaves and
``lnk agent state-receive`` where it goes, piped through this computer.  Each
end is a :class:`Leg`:

* :class:`LocalLeg` — another HOME on this machine, reached without SSH
  (``sys.executable -m lnk ...`` with ``HOME`` pointing there);
* :class:`SshLeg` — any SSH destination, reached with the user's own ``ssh``
  (``~/.ssh/config``, agent, keys, known hosts all apply).  ``LNK_SSH_COMMAND``
  (a command line split as a shell would, e.g. ``ssh -F /path/config``) takes
  the place of plain ``ssh``, as ``BORG_RSH`` does for borg; ``LNK_REMOTE_LNK``
  (default ``lnk``) names the program run there, e.g. ``~/.local/bin/lnk`` or
  ``env HOME=/x python3 -m lnk``.  It is a command-line prefix for the remote
  shell and is not quoted; the arguments after it always are.

:func:`relay` connects one leg's stdout straight to another's stdin: the two
child processes share a pipe, and no byte passes through Python.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lnk.errors import InvalidInput, LnkError, TransportError
from lnk.protocol import A, decode
from lnk.transport.errorline import PROTOCOL_ARGS, error_line, last_line, remote_error

SSH_FAILED = 255
"""ssh's own exit status when it could not connect or the connection broke."""

_STDERR_TAIL = 8192
MAX_ANSWER = 8 << 20
"""The most a box's answer on stdout may hold (its JSON); more is refused, not read."""

Stdin = bytes | IO[Any] | int | None
Stdout = IO[Any] | int | None


@dataclass
class LegResult:
    """What :meth:`Leg.run` gives back (like ``subprocess.CompletedProcess``)."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes


class LegProcess:
    """A running command at a leg: ``stdin``/``stdout`` as given, stderr kept.

    stderr goes to a temporary file (so a chatty command can never block on a
    full pipe, and memory stays bounded); :meth:`wait` reads only its tail.
    """

    def __init__(
        self,
        leg: Leg,
        args: list[str],
        argv: list[str],
        env: dict[str, str] | None,
        stdin: IO[Any] | int | None,
        stdout: Stdout,
    ) -> None:
        self.leg = leg
        self.args = args
        self._errfile = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdin=stdin, stdout=stdout, stderr=self._errfile
            )
        except FileNotFoundError as e:
            self._errfile.close()
            raise leg.launch_failed(argv[0]) from e
        except BaseException:
            self._errfile.close()
            raise
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout
        self.pid = self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        self.proc.kill()

    def terminate(self) -> None:
        self.proc.terminate()

    def read_answer(self, limit: int = 0, timeout: float | None = None) -> bytes:
        """The command's whole stdout (at most ``limit`` bytes, default :data:`MAX_ANSWER`),
        then its exit; TransportError past either bound (the command is killed)."""
        assert self.stdout is not None
        got: list[bytes] = []
        failed: list[BaseException] = []

        def read() -> None:
            try:
                assert self.stdout is not None
                got.append(read_bounded(self.stdout, limit or MAX_ANSWER, self.leg.name))
            except BaseException as e:
                failed.append(e)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive() or failed:
            self.kill()
            t.join()
            if failed and isinstance(failed[0], LnkError):
                raise failed[0]
            raise TransportError(
                f"{self.leg.name} did not answer within {timeout or 0:.0f} s",
                hint="check that it answers: lnk box list names each box, and lnk box run NAME -- "
                "version asks one",
            )
        self.proc.wait(timeout=timeout)
        return got[0]

    def stderr_text(self) -> str:
        """The last few KiB the command wrote on stderr."""
        f = self._errfile
        if f.closed:
            return ""
        f.flush()
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _STDERR_TAIL))
        return f.read().decode("utf-8", "replace")

    def wait(self, check: bool = True, timeout: float | None = None) -> int:
        """Wait for the end; with ``check`` a failure raises (see :meth:`Leg.check`)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        if check:
            self.leg.check(code, self.stderr_text())
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f and not f.closed:
                with contextlib.suppress(BrokenPipeError):
                    f.close()
        self._errfile.close()

    def __enter__(self) -> LegProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Leg:
    """A place that runs lnk commands.  Subclasses say how to get there."""

    name: str

    # --- what subclasses provide -------------------------------------
    def argv(self, args: Sequence[str], bare: bool = False) -> list[str]:
        """The local argv that runs ``lnk ARGS`` at this place (with ``PROTOCOL_ARGS``
        unless ``bare``: asking an lnk of any age its version)."""
        raise NotImplementedError

    def shell_argv(self, script: str) -> list[str]:
        """The local argv that runs a POSIX shell line at this place."""
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    def check(self, code: int, stderr: str) -> None:
        """Raise for a failed command: the remote lnk error, or a TransportError."""
        if code != 0:
            raise remote_error(self.name, code, stderr)

    def launch_failed(self, program: str) -> LnkError:
        return TransportError(
            f"cannot reach {self.name}: {program!r} was not found",
            hint="install it or put it on PATH",
        )

    # --- the interface ------------------------------------------------
    def run(
        self,
        args: Sequence[str],
        stdin: Stdin = None,
        capture: bool = True,
        check: bool = True,
        bare: bool = False,
    ) -> LegResult:
        """Run ``lnk ARGS`` there and wait.

        ``stdin`` is bytes, a file or None (nothing).  With ``capture`` stdout
        (at most :data:`MAX_ANSWER` bytes: more is a TransportError) and the
        last KiB of stderr come back as bytes, otherwise they go to ours.  With
        ``check`` a failure raises: an lnk error there raises the same class
        here (message and hint included); a broken connection a TransportError.
        """
        return self._run(self.argv(args, bare), list(args), stdin, capture, check)

    def ask(self, args: Sequence[str], answer: type[A], stdin: Stdin = None) -> A:
        """Run ``lnk ARGS`` there and take its JSON answer as ``answer``, checked where it
        arrives (:mod:`lnk.protocol`): a box's error raises here, and so does an answer that
        is not one."""
        return decode(self.run(args, stdin=stdin).stdout, answer, self.name)

    def run_to_file(self, args: Sequence[str]) -> IO[bytes]:
        """Run ``lnk ARGS`` there, its stdout into a temporary file (read from its start),
        for an answer of any size that goes on to another command (an inventory)."""
        f = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
        try:
            with self.popen(args, stdout=f) as p:
                p.wait()
            f.seek(0)
        except BaseException:
            f.close()
            raise
        return f

    def run_shell(
        self, script: str, stdin: Stdin = None, capture: bool = True, check: bool = True
    ) -> LegResult:
        """Run a POSIX shell line there (installing lnk, tests)."""
        return self._run(self.shell_argv(script), [script], stdin, capture, check)

    def popen(
        self,
        args: Sequence[str],
        stdin: Stdin = subprocess.DEVNULL,
        stdout: Stdout = subprocess.PIPE,
    ) -> LegProcess:
        """Start ``lnk ARGS`` there for streaming; stdin/stdout are PIPE, a file or fd."""
        return self._popen(self.argv(args), list(args), stdin, stdout)

    def popen_shell(
        self, script: str, stdin: Stdin = subprocess.DEVNULL, stdout: Stdout = subprocess.PIPE
    ) -> LegProcess:
        return self._popen(self.shell_argv(script), [script], stdin, stdout)

    # --- plumbing -----------------------------------------------------
    def _popen(self, argv: list[str], args: list[str], stdin: Stdin, stdout: Stdout) -> LegProcess:
        if isinstance(stdin, bytes):
            raise TypeError("popen takes a pipe or file as stdin; use run() for bytes")
        return LegProcess(self, args, argv, self.env(), stdin, stdout)

    def _run(
        self, argv: list[str], args: list[str], stdin: Stdin, capture: bool, check: bool
    ) -> LegResult:
        data = stdin if isinstance(stdin, bytes) else None
        pipe_in: Any = (
            subprocess.PIPE
            if data is not None
            else (subprocess.DEVNULL if stdin is None else stdin)
        )
        if not capture:
            try:
                proc = subprocess.Popen(argv, env=self.env(), stdin=pipe_in)
            except FileNotFoundError as e:
                raise self.launch_failed(argv[0]) from e
            with proc:
                try:
                    proc.communicate(input=data)
                except BaseException:
                    proc.kill()
                    raise
            if check:
                self.check(proc.returncode, "")
            return LegResult(args, proc.returncode, b"", b"")
        with LegProcess(self, args, argv, self.env(), pipe_in, subprocess.PIPE) as p:
            feeder = None
            if data is not None:
                feeder = threading.Thread(target=_feed, args=(p.stdin, data), daemon=True)
                feeder.start()
            assert p.stdout is not None
            so = read_bounded(p.stdout, MAX_ANSWER, self.name)
            code = p.proc.wait()
            if feeder is not None:
                feeder.join()
            se = p.stderr_text()
        if check:
            self.check(code, se)
        return LegResult(args, code, so, se.encode())


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def read_bounded(f: IO[bytes], limit: int, where: str) -> bytes:
    """All of ``f`` if it holds at most ``limit`` bytes; else TransportError (nothing more
    is read)."""
    data = f.read(limit + 1)
    if len(data) > limit:
        raise TransportError(
            f"{where} answered more than {limit >> 20} MiB, which no answer of lnk's is",
            hint=f"check the lnk installed on {where} (lnk box add installs this one)",
        )
    return data


class LocalLeg(Leg):
    """A box that is another HOME on this machine."""

    def __init__(self, home: Path | str, name: str | None = None) -> None:
        self.home = Path(home)
        self.name = name or f"local box {self.home}"

    def __repr__(self) -> str:
        return f"LocalLeg({str(self.home)!r})"

    def argv(self, args: Sequence[str], bare: bool = False) -> list[str]:
        return [sys.executable, "-m", "lnk", *(() if bare else PROTOCOL_ARGS), *args]

    def shell_argv(self, script: str) -> list[str]:
        return ["/bin/sh", "-c", script]

    def env(self) -> dict[str, str]:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["HOME"] = str(self.home)
        return env


def ssh_command() -> list[str]:
    """The local ssh command: ``LNK_SSH_COMMAND`` split as a shell would, or ``ssh``."""
    line = os.environ.get("LNK_SSH_COMMAND", "").strip()
    if not line:
        return ["ssh"]
    try:
        cmd = shlex.split(line)
    except ValueError as e:
        raise TransportError(
            f"LNK_SSH_COMMAND cannot be parsed: {e}",
            hint="give a command line such as 'ssh -F ~/.ssh/other_config'",
        ) from e
    return cmd or ["ssh"]


def check_destination(destination: str) -> str:
    if (
        not destination
        or destination.startswith("-")
        or any(c.isspace() or ord(c) < 32 for c in destination)
    ):
        raise InvalidInput(
            f"{destination!r} is not an SSH destination",
            hint="give [user@]host or an alias from ~/.ssh/config (no spaces, not starting with '-')",
        )
    return destination


def _fault_env() -> list[str]:
    """Tests' fault points (lnk.move.faults) reach the box too (sshd: AcceptEnv LNK_*)."""
    if os.environ.get("LNK_TESTING") == "1" and os.environ.get("LNK_FAULT"):
        return ["-o", "SendEnv=LNK_FAULT", "-o", "SendEnv=LNK_TESTING"]
    return []


class SshLeg(Leg):
    """A box reached with ``ssh <destination> -- <remote lnk> ARGS``."""

    def __init__(
        self, destination: str, remote_lnk: str | None = None, name: str | None = None
    ) -> None:
        self.destination = check_destination(destination)
        self._remote_lnk = remote_lnk
        self.name = name or destination

    def __repr__(self) -> str:
        return f"SshLeg({self.destination!r})"

    @property
    def remote_lnk(self) -> str:
        """``LNK_REMOTE_LNK`` wins, then what the box registry found, then ``lnk``."""
        return os.environ.get("LNK_REMOTE_LNK", "").strip() or self._remote_lnk or "lnk"

    def remote_command(self, args: Sequence[str], bare: bool = False) -> str:
        proto = () if bare else PROTOCOL_ARGS
        return " ".join([self.remote_lnk, *proto, *(shlex.quote(a) for a in args)])

    def argv(self, args: Sequence[str], bare: bool = False) -> list[str]:
        cmd = self.remote_command(args, bare)
        return [*ssh_command(), *_fault_env(), self.destination, "--", cmd]

    def shell_argv(self, script: str) -> list[str]:
        return [*ssh_command(), self.destination, "--", script]

    def check(self, code: int, stderr: str) -> None:
        if code == SSH_FAILED:
            last = last_line(stderr) or "ssh exited with status 255"
            raise TransportError(
                f"cannot reach box {self.name} over SSH: {last}",
                hint=f"check that 'ssh {self.destination}' works from this computer",
            )
        if code == 127:  # the shell found no such program
            raise TransportError(
                f"lnk is not installed on box {self.name} ({last_line(stderr)})",
                hint="run 'lnk box add' again to install it, or set LNK_REMOTE_LNK",
            )
        super().check(code, stderr)

    def launch_failed(self, program: str) -> LnkError:
        return TransportError(
            f"cannot reach box {self.name}: the ssh program {program!r} was not found",
            hint="install OpenSSH's client, or set LNK_SSH_COMMAND",
        )


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
