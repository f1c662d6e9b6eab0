"""``lnk agent move``: two phases, a journal, and exactly one copy answering.

    1. the destination prepares a receiver and says what it holds already
    2. bulk: the agent's files and collections go while it keeps answering
    3. pause: the agent stops where it is (its turn ends, messages wait);
       only what changed since the bulk goes, and the destination applies it
    4. the destination starts the agent; the move is done when it answers
       there with its ID
    5. the copy left behind: settings, state and keys deleted, files kept aside

From the pause until the agent answers where it went, a signal doesn't end lnk
midway: what runs ends, and the move fails as any failure does (the agent
resumes where it was, the destination's copy is removed).  A move that can't
be ended at once stays in the journal, finished by the next move or start.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from lnk.agents.layout import Machine
from lnk.errors import Interrupted, LnkError, NotFound, TransportError, UsageError
from lnk.move import journal
from lnk.move.faults import fault
from lnk.move.held import deliver_all
from lnk.move.journal import Entry
from lnk.move.where import HERE, place_leg, where_is
from lnk.payload.receivers import purge_expired
from lnk.transport import boxes
from lnk.transport.legs import MAX_ANSWER, SSH_FAILED, Leg, LegProcess, read_bounded, settle
from lnk.transport.protocol import error_line

__all__ = ["HERE", "finish", "finish_all", "move", "place_leg", "where_is"]

Say = Callable[[str], None]


# ---- signals: from the pause on, a signal fails the move instead of ending lnk ----
class _Guard:
    def __init__(self) -> None:
        self.children: set[LegProcess] = set()
        self.signal: int | None = None

    def handler(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        for c in list(self.children):
            with contextlib.suppress(OSError):
                c.kill()

    def check(self) -> None:
        if self.signal is not None:
            raise Interrupted(
                f"stopped by {signal.Signals(self.signal).name} during the move", signum=self.signal
            )


_guard = _Guard()


@contextlib.contextmanager
def deferred_signals() -> Iterator[_Guard]:
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _guard.handler) for s in sigs}
    try:
        yield _guard
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run_json(leg: Leg, args: list[str]) -> Any:
    out = leg.run(args).stdout
    return json.loads(out) if out.strip() else None


def _stream(src: Leg, src_args: list[str], inv: IO[bytes], dst: Leg, dst_args: list[str]) -> Any:
    """src's stdout straight into dst's stdin (fd to fd); returns dst's JSON answer."""
    with inv:
        a = src.popen(src_args, stdin=inv)
        try:
            assert a.stdout is not None
            b = dst.popen(dst_args, stdin=a.stdout)
        except BaseException:
            a.close()
            raise
        a.stdout.close()
        _guard.children |= {a, b}
        try:
            with a, b:
                assert b.stdout is not None
                answer = read_bounded(b.stdout, MAX_ANSWER, dst.name)
                _code_a, _code_b, err = settle(src, a, dst, b)
                _guard.check()
                if err is not None:
                    raise err
        finally:
            _guard.children -= {a, b}
    return json.loads(answer) if answer.strip() else None


def _inventory(dst: Leg, receiver: str) -> IO[bytes]:
    return dst.run_to_file(["agent", "state-receive", "--inventory", "--receiver", receiver])


def _current(machine: Machine, place: str, say: Say) -> Leg:
    """The place's leg, its lnk upgraded first if it is older than this one (as box add does)."""
    if place == HERE:
        return place_leg(machine, place)
    box = boxes.get(place)
    report = boxes.ensure_current(box)
    if report.action != "found":
        say(report.describe())
    return report.box.leg()


def _prepare(machine: Machine, dst: Leg, name: str, agent_id: str, src: str) -> Any:
    """A receiver at the destination; the agent's grants go with it when it leaves this
    computer (the one running the move), since its word, not the stream's, counts."""
    args = ["agent", "state-receive", "--prepare", "--agent-id", agent_id, "--name", name]
    if src == HERE:
        from lnk.agents.policy import grants_to_send

        grants = grants_to_send(machine.folders(name).sandbox_toml).encode()
        r = dst.run([*args, "--grants", "-", "--json"], stdin=grants, check=False)
        # an older lnk there knows no --grants: the stream's, minus the wide ones, apply
        if not (r.returncode == 2 and b"--grants" in r.stderr):
            dst.check(r.returncode, r.stderr.decode("utf-8", "replace"))
            return json.loads(r.stdout) if r.stdout.strip() else None
    return _run_json(dst, [*args, "--json"])


def move(
    machine: Machine,
    name: str | None,
    to: str,
    *,
    from_box: str | None = None,
    no_start: bool = False,
    say: Say = lambda s: None,
) -> dict[str, Any]:
    """Move the agent to ``to`` (a box, or HERE), from where it is or from ``from_box``.

    Earlier unfinished moves are finished first; the messages held for the agents
    they and this move carried are handed over where each agent answers.  Expired
    receivers and kept folders are removed first: nothing secret lingers.
    """
    purge_expired(machine)
    finish_all(machine, say)
    ids: list[str] = []
    try:
        result = _move(machine, name, to, from_box=from_box, no_start=no_start, say=say, ids=ids)
    except BaseException:
        _deliver_held(machine, ids, say)  # the move was undone: where the agent answers again
        raise
    result["delivered"] = _deliver_held(machine, ids, say)
    return result


def _deliver_held(machine: Machine, ids: list[str], say: Say) -> list[dict[str, Any]]:
    """Hand over what was held for these agents, unless their move stays unfinished."""
    out: list[dict[str, Any]] = []
    for aid in ids:
        if not journal.entries(machine, aid):
            with contextlib.suppress(LnkError):
                out += deliver_all(machine, aid, say)
    return out


def _move(
    machine: Machine,
    name: str | None,
    to: str,
    *,
    from_box: str | None,
    no_start: bool,
    say: Say,
    ids: list[str],
) -> dict[str, Any]:
    name, agent_id, src_place = where_is(machine, name, from_box)
    ids.append(agent_id)
    if src_place == to:
        raise UsageError(
            f"{name} is already {'here' if to == HERE else 'on ' + to}",
            hint="name another place with --to BOX, or --here",
        )
    for e in journal.entries(machine, agent_id):
        raise TransportError(
            f"an earlier move of {name} ({e.move}) is still unfinished: {e.failed or e.phase}",
            hint="make sure both boxes answer, then run lnk agent move again",
        )
    src, dst = _current(machine, src_place, say), _current(machine, to, say)
    st = _run_json(src, ["agent", "status", "--agent", name, "--json"]) or {}
    if st.get("id") != agent_id:
        raise NotFound(
            f"{name} is not on {src.name} as this computer remembers",
            hint="lnk box run that box -- lnk agent list",
        )
    t0 = time.monotonic()
    e = journal.new_entry(
        machine,
        agent=name,
        agent_id=agent_id,
        src=src_place,
        dst=to,
        no_start=no_start,
        was_running=bool(st.get("running")),
    )
    try:
        prep = _prepare(machine, dst, name, agent_id, src_place)
        e.set(
            phase="prepared", receiver=prep["receiver"], dst_had_agent=bool(prep.get("has_agent"))
        )
        fault("move:after-prepare")
        say(f"sending {name} from {src.name} to {dst.name} while it answers")
        bulk = _phase(src, dst, name, prep, "bulk", _inventory(dst, prep["receiver"]))
        e.set(phase="bulk-sent")
        fault("move:after-bulk")
    except BaseException as err:
        _abandon(dst, e)
        e.remove()
        raise _as_lnk(err) from err
    with deferred_signals() as guard:
        try:
            return _switch(machine, e, src, dst, prep, bulk, say, guard, t0)
        except BaseException as err:
            e.set(failed=str(err) or type(err).__name__)
            say(f"the move failed ({err}); {name} resumes on {src.name}")
            _undo(machine, e, say)
            raise _as_lnk(err) from err


def _phase(src: Leg, dst: Leg, name: str, prep: dict[str, Any], phase: str, inv: IO[bytes]) -> Any:
    """One phase's stream: the source's state-send piped into the destination's receiver."""
    send = ["agent", "state-send", "--agent", name, "--to", prep["public_key"], "--phase", phase]
    return _stream(
        src,
        [*send, "--inventory", "-"],
        inv,
        dst,
        ["agent", "state-receive", "--receiver", prep["receiver"], "--json"],
    )


def _as_lnk(err: BaseException) -> BaseException:
    if isinstance(err, LnkError):
        return err
    if isinstance(err, KeyboardInterrupt):
        return Interrupted("interrupted during the move", signum=signal.SIGINT)
    return TransportError(f"the move failed: {err}", hint="see lnk agent status on both ends")


def _switch(
    machine: Machine,
    e: Entry,
    src: Leg,
    dst: Leg,
    prep: dict[str, Any],
    bulk: Any,
    say: Say,
    guard: _Guard,
    e_started: float,
) -> dict[str, Any]:
    timings: dict[str, float] = {"bulk_s": round(time.monotonic() - e_started, 3)}
    name = e.agent
    # what the destination holds can't change before the final: ask while the agent answers
    inventory = _inventory(dst, prep["receiver"])
    t_pause = time.monotonic()
    src.run(["agent", "pause", "--agent", name, "--move", e.move])
    e.set(phase="paused")
    fault("move:after-pause")
    guard.check()
    final = _phase(src, dst, name, prep, "final", inventory)
    e.set(phase="committed")
    fault("move:after-commit")
    guard.check()
    status = _finish_forward(
        machine,
        e,
        say,
        answered=lambda: timings.update(pause_s=round(time.monotonic() - t_pause, 3)),
    )
    timings["total_s"] = round(time.monotonic() - e_started, 3)
    return {
        "agent": name,
        "id": e.agent_id,
        "from": e.src,
        "to": e.dst,
        "bulk": bulk,
        "final": final,
        "status": status,
        "started": not e.no_start,
        "timings": timings,
    }


def _finish_forward(
    machine: Machine, e: Entry, say: Say, answered: Callable[[], None] = lambda: None
) -> dict[str, Any] | None:
    src, dst = place_leg(machine, e.src), place_leg(machine, e.dst)
    status = None
    if not e.no_start:
        # start answers with the agent's status once it answers (one SSH round trip fewer)
        status = _run_json(dst, ["agent", "start", "--agent", e.agent, "--json"]) or {}
        if "running" not in status:
            status = _run_json(dst, ["agent", "status", "--agent", e.agent, "--json"]) or {}
        if not status.get("running") or status.get("id") != e.agent_id:
            raise TransportError(
                f"{e.agent} does not answer on {dst.name} after the move",
                hint=f"see lnk box run {e.dst} -- lnk agent logs",
            )
    elif not _holds(dst, e):
        raise TransportError(
            f"{e.agent} is not on {dst.name} after the move",
            hint="the copy where it was stays; move it again",
        )
    answered()
    e.set(phase="answering")
    fault("move:after-start")
    src.run(["agent", "moved-away", "--agent", e.agent, "--id", e.agent_id, "--to", dst.name])
    e.set(phase="cleaned")
    journal.set_location(machine, e.agent, e.agent_id, e.dst)
    e.remove()
    say(f"{e.agent} moved to {dst.name}" + ("" if e.no_start else " and answers there"))
    return status


def _holds(leg: Leg, e: Entry) -> bool:
    """Whether the agent (by ID) lives at this place, as its own lnk says."""
    r = leg.run(["agent", "status", "--agent", e.agent, "--json"], check=False)
    if r.returncode != 0:
        told = error_line(r.stderr.decode("utf-8", "replace")) or {}
        if r.returncode == SSH_FAILED or told.get("class") == "TransportError":
            raise TransportError(
                f"{leg.name} does not answer", hint="the move stays in the journal until it does"
            )
        return False
    try:
        return bool(json.loads(r.stdout).get("id") == e.agent_id)
    except ValueError:
        return False


def _abandon(dst: Leg, e: Entry) -> None:
    if e.receiver:
        with contextlib.suppress(LnkError):
            dst.run(["agent", "state-receive", "--abandon", "--receiver", e.receiver])


def _remove_copy(dst: Leg, e: Entry) -> LnkError | None:
    """Remove the agent's copy at the destination; an error if the box doesn't answer."""
    try:
        if not e.at_least("committed") and not _holds(dst, e):
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


def _undo(machine: Machine, e: Entry, say: Say) -> None:
    """Put the agent back where it was; keep the entry if a box doesn't answer."""
    src, dst = place_leg(machine, e.src), place_leg(machine, e.dst)
    stale: LnkError | None = None
    try:
        if e.at_least("committed") and not _holds(src, e):
            # the copy where it was is gone already: the only way left is forward
            say(f"{e.agent} is no longer on {src.name}; finishing the move instead")
            e.set(failed=None)
            _finish_forward(machine, e, say)
            return
        if e.at_least("paused") and not e.dst_had_agent:
            # a final stream that got through before its leg failed committed there too
            stale = _remove_copy(dst, e)
        _abandon(dst, e)
        if e.was_running:  # one stopped before the move stays stopped
            src.run(["agent", "start", "--agent", e.agent])
    except LnkError as err:
        stale = err
    if stale is not None:
        say(
            f"could not finish undoing the move yet ({stale}); it stays in the journal and "
            "the next lnk agent move or start of it finishes it"
        )
        return
    e.remove()


def finish(machine: Machine, e: Entry, say: Say) -> bool:
    """Finish one journal entry: forward if the destination holds the agent, else back."""
    try:
        if e.failed:
            _undo(machine, e, say)
        elif e.at_least("committed"):
            _finish_forward(machine, e, say)
        elif e.at_least("paused"):
            dst = place_leg(machine, e.dst)
            st = dst.run(["agent", "status", "--agent", e.agent, "--json"], check=False)
            has = st.returncode == 0 and json.loads(st.stdout or b"{}").get("id") == e.agent_id
            if has and not e.dst_had_agent:
                e.set(phase="committed")
                _finish_forward(machine, e, say)
            else:
                e.set(failed="the move was stopped midway")
                _undo(machine, e, say)
        else:
            _abandon(place_leg(machine, e.dst), e)
            e.remove()
    except LnkError as err:
        say(f"the unfinished move {e.move} of {e.agent} could not be finished yet: {err}")
        return False
    return not (e.path and e.path.exists())


def finish_all(machine: Machine, say: Say, agent_id: str | None = None) -> list[str]:
    """Finish the unfinished moves (of one agent, or all); hand over what was held for them.

    Returns the IDs of the agents whose moves are finished now.
    """
    done: list[str] = []
    for e in _unfinished(machine, agent_id):
        say(f"finishing the earlier move {e.move} of {e.agent}")
        if finish(machine, e, say) and e.agent_id not in done:
            done.append(e.agent_id)
    for aid in done:
        if not journal.entries(machine, aid):
            deliver_all(machine, aid, say)
    return done


def _unfinished(machine: Machine, agent_id: str | None) -> list[Entry]:
    """The entries no live move holds.  A chat that just looked at an entry's lock
    (:func:`lnk.move.held.mover_alive`) holds it for an instant: look again then."""
    for _ in range(5):
        found = journal.unfinished(machine, agent_id)
        if found or not journal.entries(machine, agent_id):
            return found
        time.sleep(0.05)
    return []
