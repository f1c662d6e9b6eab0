"""Asking an adapter, ``lnk-<harness>`` on PATH: one command, one JSON answer.

Each command gets the request as one JSON object on its standard input and
answers one JSON object on its standard output, within a bounded time
(:data:`TIMEOUTS`) and size (:data:`contract.MAX_ANSWER`); more is not kept.
Its standard error is read too (its last 64 KiB kept): a non-zero exit is one error
naming the adapter, the command and that output's last line, escaped.  It runs as the
user, outside every sandbox, with lnk's environment (an install needs its proxies).
Link's own harness, ``builtin``, answers in-process (:mod:`lnk.harnesses.builtin`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lnk.agents.layout import AgentFolders
from lnk.errors import InvalidInput, LnkError, NotFound
from lnk.harnesses import contract as C
from lnk.text import one_line

TIMEOUTS = {"install": 900.0, "configure": 60.0}
TIMEOUT_S = 15.0  # every other command
MAX_STDERR = 64 * 1024


def check_name(harness: str) -> str:
    if not C.NAME_RE.fullmatch(harness):
        raise InvalidInput(
            f"the harness name {one_line(harness, 40)!r} is not lowercase letters, digits and '-'",
            hint="e.g. --harness hermes",
        )
    return harness


def find(harness: str) -> str:
    """The adapter's program: ``lnk-<harness>`` on PATH."""
    prog = shutil.which(f"lnk-{check_name(harness)}")
    if prog is None:
        raise NotFound(
            f"no adapter for the harness {harness!r}: lnk-{harness} is not on PATH",
            hint=f"install it (for Hermes: pip install -e adapters/{harness}), or use "
            "--harness builtin",
        )
    return prog


def available() -> tuple[str, ...]:
    """The harnesses this machine can run: ``builtin`` and each ``lnk-<harness>`` on PATH
    (a move asks the destination before its bulk, so an agent never lands where nothing
    can start it)."""
    found = {"builtin"}
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for n in names:
            ok = n.startswith("lnk-") and C.NAME_RE.fullmatch(n[4:]) is not None
            if ok and os.access(os.path.join(d or ".", n), os.X_OK):
                found.add(n[4:])
    return tuple(sorted(found))


def _read_bounded(stream: IO[bytes], limit: int, into: list[bytes]) -> None:
    got = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        if got <= limit:
            into.append(chunk[: limit + 1 - got])
        got += len(chunk)  # read on past the limit, keeping nothing, so the program ends


def _read_tail(stream: IO[bytes], limit: int, into: list[bytes]) -> None:
    """All of it read, its last ``limit`` bytes kept (where a failure says why)."""
    tail = b""
    while chunk := stream.read(65536):
        tail = (tail + chunk)[-limit:]
    into.append(tail)


@dataclass(frozen=True)
class Adapter:
    """One adapter program, asked with bounded time and size."""

    harness: str
    program: str

    @classmethod
    def find(cls, harness: str) -> Adapter:
        return cls(harness, find(harness))

    def ask(
        self,
        command: str,
        request: dict[str, Any],
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> bytes:
        limit = timeout or TIMEOUTS.get(command, TIMEOUT_S)
        try:
            proc = subprocess.Popen(
                [self.program, command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(os.environ) | (env or {}),
            )
        except OSError as e:
            raise LnkError(f"lnk-{self.harness} could not be run: {e}") from e
        out: list[bytes] = []
        err: list[bytes] = []
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        readers = [
            threading.Thread(target=_read_bounded, args=(proc.stdout, C.MAX_ANSWER, out)),
            threading.Thread(target=_read_tail, args=(proc.stderr, MAX_STDERR, err)),
        ]
        for t in readers:
            t.start()
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        deadline = time.monotonic() + limit
        readers[0].join(limit)  # its answer's end first: then the exit is at hand (no polling)
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.wait()
            why = f"it gave no answer within {limit:g}s"
            raise C.Reader(self.harness, command).fail(why) from e
        finally:
            for t in readers:
                t.join(5)
        if code != 0:
            last = b"".join(err).decode("utf-8", "replace").strip().splitlines()[-1:] or ["-"]
            raise LnkError(
                f"lnk-{self.harness} {command} failed (exit {code}): {one_line(last[0], 300)}",
                hint=f"run it yourself to see why: echo '{{}}' | lnk-{self.harness} {command}",
            )
        return b"".join(out)

    # each command, its answer parsed once
    def describe(self) -> C.Describe:
        return C.Describe.parse(
            self.ask("describe", {"contract": C.CONTRACT_VERSION}), self.harness
        )

    def needs(self) -> C.Needs:
        return C.Needs.parse(self.ask("needs", {"contract": C.CONTRACT_VERSION}), self.harness)

    def internet_hosts(self) -> C.Hosts:
        raw = self.ask("internet-hosts", {"contract": C.CONTRACT_VERSION})
        return C.Hosts.parse(raw, self.harness)

    def install(self, tools: Path, env: dict[str, str] | None = None) -> C.Installed:
        req = {"contract": C.CONTRACT_VERSION, "tools": str(tools)}
        raw = self.ask("install", req, env=env)
        return C.Installed.parse(raw, self.harness)

    def configure(self, request: dict[str, Any], folders: AgentFolders) -> C.Configured:
        return C.Configured.parse(self.ask("configure", request), self.harness, folders)

    def state(self, request: dict[str, Any], folders: AgentFolders) -> C.State:
        return C.State.parse(self.ask("state", request), self.harness, folders)

    def endpoint(self, request: dict[str, Any], folders: AgentFolders, home: Path) -> C.Endpoint:
        return C.Endpoint.parse(self.ask("endpoint", request), self.harness, folders, home)
