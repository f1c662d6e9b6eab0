"""The steps a move runs at each end: the box protocol's commands, typed (docs/boxes.md).

Each step is one ``lnk`` command at a leg; its answer is a :mod:`lnk.protocol`
class, checked where it arrives.  The legs come from the mover, resolved once
per move (:class:`Ends`), never rebuilt from a place's name here.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from lnk.agents.layout import Machine
from lnk.agents.policy import grants_to_send
from lnk.errors import InvalidInput, LnkError, TransportError
from lnk.move.journal import Entry
from lnk.move.signals import guard
from lnk.payload.inventory import Inventory
from lnk.protocol import Left, Prepared, ProtocolError, ReceiveReport, Status, decode
from lnk.transport.errorline import error_line
from lnk.transport.legs import SSH_FAILED, Leg
from lnk.transport.pipes import settle
from lnk.transport.process import MAX_ANSWER, LegProcess, Stdin, Stdout, read_bounded

Say = Callable[[str], None]


@dataclass(frozen=True)
class Ends:
    """A move's two legs, resolved once: where the agent leaves, where it goes."""

    src: Leg
    dst: Leg


def status(leg: Leg, name: str) -> Status:
    return leg.ask(["agent", "status", "--agent", name, "--json"], Status)


def prepare(
    machine: Machine,
    dst: Leg,
    name: str,
    agent_id: str,
    grants_here: bool,
    model_args: list[str],
) -> Prepared:
    """A receiver at the destination; the agent's grants go with it when it leaves this
    computer (the one running the move), since its word, not the stream's, counts, and so
    does its model as the mover knows it (``model_args``, :func:`lnk.move.ready.model_args`)."""
    args = ["agent", "state-receive", "--prepare", "--agent-id", agent_id, "--name", name]
    args += model_args
    if grants_here:
        grants = grants_to_send(machine.folders(name).sandbox_toml).encode()
        r = dst.run([*args, "--grants", "-", "--json"], stdin=grants, check=False)
        # an older lnk there knows no --grants: the stream's, minus the wide ones, apply
        if not (r.returncode == 2 and b"--grants" in r.stderr):
            dst.check(r.returncode, r.stderr.decode("utf-8", "replace"))
            return decode(r.stdout, Prepared, dst.name)
    return dst.ask([*args, "--json"], Prepared)


DIGESTS = ["agent", "state-digests", "--json", "--agent"]


class EarlyDigests:
    """The sender's folder digests, asked for before the destination prepares, so the
    sender's walk runs beside the prepare (the bulk's inventory takes them)."""

    def __init__(self, src: Leg, name: str) -> None:
        self.src = src
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        try:
            self.proc: LegProcess | None = src.popen([*DIGESTS, name], stdout=self.out)
        except BaseException:
            self.out.close()
            raise

    def take(self) -> IO[bytes]:
        """The digests (the caller closes the file); the sender's error if it failed."""
        assert self.proc is not None
        with self.proc as p:
            p.wait()
        self.proc = None
        self.out.seek(0)
        out, self.out = self.out, tempfile.TemporaryFile()  # noqa: SIM115
        return out

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None
        self.out.close()


def _piped(
    ends: Ends,
    src_args: list[str],
    dst_args: list[str],
    stdin: Stdin = subprocess.DEVNULL,
    stdout: Stdout = subprocess.PIPE,
) -> tuple[LegProcess, LegProcess]:
    """The source's command piped into the destination's (fd to fd), both in the move's
    guard (a signal ends them); the source's alone ended if the destination's can't start."""
    a = ends.src.popen(src_args, stdin=stdin)
    try:
        assert a.stdout is not None
        b = ends.dst.popen(dst_args, stdin=a.stdout, stdout=stdout)
    except BaseException:
        a.close()
        raise
    a.stdout.close()
    guard.children |= {a, b}
    return a, b


def inventory(
    ends: Ends, name: str, prep: Prepared, early: EarlyDigests | None = None
) -> IO[bytes]:
    """What the receiver holds, spooled to a file (of any size) for the sender's stdin.

    When the receiver has folders with digests (a base: the agent lived there), the
    sender's folder digests go first (``early``'s, else asked now and piped straight
    in) into the receiver's inventory (``--against -``): a folder both hold alike is
    one line, not its every file's digest, so an unchanged agent's inventory is tiny."""
    args = ["agent", "state-receive", "--inventory", "--receiver", prep.receiver]
    if prep.folders <= 0:
        return ends.dst.run_to_file(args)
    f = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
    try:
        if early is not None:
            with (
                early.take() as digests,
                ends.dst.popen([*args, "--against", "-"], stdin=digests, stdout=f) as b,
            ):
                b.wait()
            f.seek(0)
            return f
        a, b = _piped(ends, [*DIGESTS, name], [*args, "--against", "-"], stdout=f)
        try:
            with a, b:
                _code_a, _code_b, err = settle(ends.src, a, ends.dst, b)
        finally:
            guard.children -= {a, b}
        if err is not None:
            raise err
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f


def kept_copy(inv: IO[bytes]) -> IO[bytes]:
    """A copy of an inventory (the caller closes it), for the final when the bulk
    changed nothing at the destination (:func:`still_holds`)."""
    f = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
    shutil.copyfileobj(inv, f)
    inv.seek(0)
    f.seek(0)
    return f


def still_holds(bulk: ReceiveReport, inv: IO[bytes]) -> bool:
    """Whether the bulk's inventory ``inv`` serves the final too: the bulk staged no
    content there (what the receiver holds is what it said), and the inventory gives
    back the time of the sender's digests, so what changed since at the sender is told
    by change times, not resent whole (docs/stream-format.md 7.7)."""
    if bulk.data_bytes:
        return False
    try:
        at = Inventory.at_of(inv)  # its header alone: the digests are the sender's to read
    except InvalidInput:
        at = 0
    inv.seek(0)
    return at > 0


def phase(ends: Ends, name: str, prep: Prepared, which: str, inv: IO[bytes]) -> ReceiveReport:
    """One phase's stream: the source's state-send piped into the destination's receiver,
    fd to fd (no byte passes through this process); the receiver's report."""
    send = ["agent", "state-send", "--agent", name, "--to", prep.public_key, "--phase", which]
    recv = ["agent", "state-receive", "--receiver", prep.receiver, "--json"]
    with inv:
        a, b = _piped(ends, [*send, "--inventory", "-"], recv, stdin=inv)
        try:
            with a, b:
                assert b.stdout is not None
                answer = read_bounded(b.stdout, MAX_ANSWER, ends.dst.name)
                _code_a, _code_b, err = settle(ends.src, a, ends.dst, b)
                guard.check()
                if err is not None:
                    raise err
        finally:
            guard.children -= {a, b}
    return decode(answer, ReceiveReport, ends.dst.name)


def pause(src: Leg, name: str, move_id: str) -> None:
    src.run(["agent", "pause", "--agent", name, "--move", move_id])


def start_there(dst: Leg, name: str) -> Status:
    """Start the agent at ``dst``; its status once it answers (one round trip)."""
    return dst.ask(["agent", "start", "--agent", name, "--json"], Status)


def let_go(src: Leg, e: Entry, to: str) -> Left:
    """The agent answers where it went: where it was lets go of it (its settings, keys and
    backup timer); what it did."""
    args = ["agent", "moved-away", "--agent", e.agent, "--id", e.agent_id, "--to", to]
    if e.final:  # its send noted how the agent left: nothing is walked there
        args += ["--final", e.final]
    return src.ask([*args, "--json"], Left)


def moved_in(dst: Leg, e: Entry) -> None:
    """The copy where the agent was is gone: its connections where it went go on."""
    dst.run(["agent", "moved-in", "--agent", e.agent, "--id", e.agent_id])


def holds(leg: Leg, e: Entry) -> bool:
    """Whether the agent (by ID) lives at this place, as its own lnk says; TransportError
    when the place doesn't answer."""
    r = leg.run(["agent", "status", "--agent", e.agent, "--json"], check=False)
    if r.returncode != 0:
        told = error_line(r.stderr.decode("utf-8", "replace")) or {}
        if r.returncode == SSH_FAILED or told.get("class") == "TransportError":
            raise TransportError(
                f"{leg.name} does not answer", hint="the move stays in the journal until it does"
            )
        return False
    try:
        return decode(r.stdout, Status, leg.name).id == e.agent_id
    except ProtocolError:
        return False


def abandon(dst: Leg, e: Entry) -> None:
    if e.receiver:
        with contextlib.suppress(LnkError):
            dst.run(["agent", "state-receive", "--abandon", "--receiver", e.receiver])


def remove_copy(dst: Leg, e: Entry) -> LnkError | None:
    """Remove the agent's copy at the destination; an error if the box doesn't answer."""
    try:
        if not e.at_least("committed") and not holds(dst, e):
            return None
    except TransportError as err:
        return err
    for args in (
        ["agent", "stop", "--agent", e.agent],
        ["agent", "remove", e.agent, "--yes", "--files", "delete"],
    ):
        if dst.run(args, check=False).returncode == SSH_FAILED:
            # the box doesn't answer: its copy stays an entry until it does
            return TransportError(
                f"{dst.name} does not answer, so {e.agent}'s copy there is not removed yet"
            )
    return None
