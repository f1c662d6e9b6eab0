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

A command a leg starts runs as a :class:`lnk.transport.process.LegProcess`;
:func:`lnk.transport.pipes.pipe` connects one leg's stdout straight to
another's stdin: the two child processes share a pipe, and no byte passes
through Python.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lnk.errors import InvalidInput, LnkError, TransportError
from lnk.protocol import A, ProtocolError, ServerReady, decode
from lnk.transport import share
from lnk.transport.errorline import PROTOCOL_ARGS, last_line, remote_error
from lnk.transport.process import MAX_ANSWER, LegProcess, Stdin, Stdout, feed, read_bounded

SERVE = ("box", "serve", "--json")
SERVE_STOP = ("box", "serve", "--stop")


class _NotCurrent(Exception):
    """A server started for :meth:`Leg.warm_if` whose lnk is not the one wanted."""


SSH_FAILED = 255
"""ssh's own exit status when it could not connect or the connection broke."""


@dataclass
class LegResult:
    """What :meth:`Leg.run` gives back (like ``subprocess.CompletedProcess``)."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes


class Leg:
    """A place that runs lnk commands.  Subclasses say how to get there."""

    name: str

    # --- what subclasses provide -------------------------------------
    def lnk_argv(self, args: Sequence[str]) -> list[str]:
        """The local argv that runs ``lnk ARGS`` (exactly those) at this place."""
        raise NotImplementedError

    def server_key(self) -> str:
        """Names this place's lnk server (:func:`lnk.transport.share.server`)."""
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
    def argv(self, args: Sequence[str], bare: bool = False, served: bool = True) -> list[str]:
        """The local argv that runs ``lnk ARGS`` at this place: with ``PROTOCOL_ARGS``
        unless ``bare`` (asking an lnk of any age its version), and inside a shared
        block through the place's lnk server (:mod:`lnk.transport.served`) unless
        ``bare`` or not ``served``."""
        proto = () if bare else PROTOCOL_ARGS
        server = None if bare or not served else share.server(self.server_key(), self._serve)
        if server is None:
            return self.lnk_argv([*proto, *args])
        return self.served_argv(server, [*proto, *args])

    def served_argv(self, server: share.Served, args: Sequence[str]) -> list[str]:
        """The local argv that runs ``lnk ARGS`` at this place through its ``server``: by
        the caller it offered (no lnk imported to wait), else ``lnk --served-by``."""
        if server.caller is None:
            return self.lnk_argv(["--served-by", server.socket, *args])
        return self.called_argv([*server.caller, server.socket], args)

    def called_argv(self, caller: list[str], args: Sequence[str]) -> list[str]:
        """The local argv that runs ``CALLER FALLBACK ARGS`` at this place, FALLBACK the
        shell line of its lnk (:func:`lnk.transport.served.main`)."""
        raise NotImplementedError

    def warm(self) -> None:
        """Inside a shared block, start this place's lnk server now (else at its first
        step); outside one, nothing."""
        share.server(self.server_key(), self._serve)

    def warm_if(self, current: Callable[[ServerReady], bool]) -> bool:
        """Inside a shared block, start this place's lnk server, and keep it only if the lnk
        serving is ``current`` (its answer says its version): one step where a version
        check and then a start were two.  False, and nothing kept or remembered, when it
        is not (or none started, or no block is open): the caller checks the version
        itself, and a later :meth:`warm` starts the server again."""

        def start() -> tuple[share.Served, Callable[[], None]] | None:
            got = self._serve(current)
            if got is None:
                raise _NotCurrent
            return got

        with contextlib.suppress(_NotCurrent):
            return share.server(self.server_key(), start) is not None
        return False

    def _serve(
        self, current: Callable[[ServerReady], bool] | None = None
    ) -> tuple[share.Served, Callable[[], None]] | None:
        """Start this place's lnk server: its socket and how to stop it, or None (an lnk
        without one, any failure: the steps then run as plain processes; or one started
        but not ``current``, stopped again)."""
        try:
            r = self._run(self.argv(SERVE, served=False), list(SERVE), None, True, False)
        except LnkError:
            return None
        if r.returncode == SSH_FAILED and current is not None:
            # the box does not answer: said now, as the version check would say it, not
            # found again by a second try (a dead box's connection timeout, twice)
            self.check(r.returncode, r.stderr.decode("utf-8", "replace"))
        if r.returncode != 0:
            return None
        try:
            ready = decode(r.stdout, ServerReady, self.name)
        except LnkError:
            return None

        server = share.Served(ready.socket, ready.caller or None)  # (none: --served-by)

        def stop() -> None:
            argv = self.served_argv(server, [*PROTOCOL_ARGS, *SERVE_STOP])
            with contextlib.suppress(LnkError, OSError):
                self._run(argv, list(SERVE_STOP), None, True, False)

        if current is not None and not current(ready):
            stop()
            return None
        return server, stop

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
        self._holdable(argv)
        return LegProcess(self, args, argv, self.env(), stdin, stdout)

    def _holdable(self, argv: list[str]) -> None:
        """Refuse, in one line, a command no command line can hold: a word with a NUL (a
        step's words are the mover's and, passed on, a box's answers; every command of a
        leg starts through here)."""
        if any("\0" in word for word in argv):
            raise ProtocolError(
                f"a command for {self.name} would hold a NUL, which no command line can "
                "(a box's answer passed on?)"
            )

    def _run(
        self, argv: list[str], args: list[str], stdin: Stdin, capture: bool, check: bool
    ) -> LegResult:
        self._holdable(argv)
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
                feeder = threading.Thread(target=feed, args=(p.stdin, data), daemon=True)
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


class LocalLeg(Leg):
    """A box that is another HOME on this machine."""

    def __init__(self, home: Path | str, name: str | None = None) -> None:
        self.home = Path(home)
        self.name = name or f"local box {self.home}"

    def __repr__(self) -> str:
        return f"LocalLeg({str(self.home)!r})"

    def lnk_argv(self, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "lnk", *args]

    def called_argv(self, caller: list[str], args: Sequence[str]) -> list[str]:
        return [*caller, shlex.join([sys.executable, "-m", "lnk"]), *args]

    def server_key(self) -> str:
        return f"local {self.home}"

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
        """The shell line run at the box for ``lnk ARGS`` (no server)."""
        return self._line([*(() if bare else PROTOCOL_ARGS), *args])

    def _line(self, args: Sequence[str]) -> str:
        return " ".join([self.remote_lnk, *(shlex.quote(a) for a in args)])

    def lnk_argv(self, args: Sequence[str]) -> list[str]:
        return [*self._ssh(), *_fault_env(), self.destination, "--", self._line(args)]

    def called_argv(self, caller: list[str], args: Sequence[str]) -> list[str]:
        line = " ".join([shlex.join([*caller, self.remote_lnk]), *map(shlex.quote, args)])
        return [*self._ssh(), *_fault_env(), self.destination, "--", line]

    def server_key(self) -> str:
        return f"ssh {shlex.join(ssh_command())} {self.destination} {self.remote_lnk}"

    def shell_argv(self, script: str) -> list[str]:
        return [*self._ssh(), self.destination, "--", script]

    def _ssh(self) -> list[str]:
        """The ssh command, on the shared connection inside a :func:`share.shared` block."""
        ssh = ssh_command()
        return [*ssh, *share.options(ssh, self.destination)]

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
