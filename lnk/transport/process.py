"""A command running at a leg, and its answer read within bounds.

A :class:`LegProcess` is one command started by a leg (``legs.py``), with
``stdin``/``stdout`` as given and its stderr kept aside; an answer read off
its stdout is at most :data:`MAX_ANSWER` bytes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from typing import IO, Any, Protocol

from lnk.errors import LnkError, TransportError

_STDERR_TAIL = 8192
MAX_ANSWER = 8 << 20
"""The most a box's answer on stdout may hold (its JSON); more is refused, not read."""

Stdin = bytes | IO[Any] | int | None
Stdout = IO[Any] | int | None


class Place(Protocol):
    """What a running command needs of the leg that started it."""

    name: str

    def check(self, code: int, stderr: str) -> None: ...

    def launch_failed(self, program: str) -> LnkError: ...


def _at_its_position(f: IO[Any] | int | None) -> None:
    """A file handed to a command by its descriptor is read from the descriptor's offset,
    not from this file object's position: set there (a file read or sought within what
    Python buffered has its descriptor elsewhere, at the buffer's end)."""
    if f is None or isinstance(f, int) or not f.seekable():
        return
    os.lseek(f.fileno(), f.tell(), os.SEEK_SET)


class LegProcess:
    """A running command at a leg: ``stdin``/``stdout`` as given, stderr kept.

    stderr goes to a temporary file (so a chatty command can never block on a
    full pipe, and memory stays bounded); :meth:`wait` reads only its tail.
    """

    def __init__(
        self,
        leg: Place,
        args: list[str],
        argv: list[str],
        env: dict[str, str] | None,
        stdin: IO[Any] | int | None,
        stdout: Stdout,
    ) -> None:
        self.leg = leg
        self.args = args
        _at_its_position(stdin)
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
        """Wait for the end; with ``check`` a failure raises (see :meth:`lnk.transport.legs.Leg.check`)."""
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


def feed(pipe: IO[bytes] | None, data: bytes) -> None:
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
