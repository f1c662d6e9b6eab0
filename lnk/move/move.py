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
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from lnk.agents.layout import Machine
from lnk.errors import Interrupted, LnkError, NotFound, TransportError, UsageError
from lnk.move import journal, ready, steps
from lnk.move.faults import fault
from lnk.move.finish import finish, finish_all, forward, undo
from lnk.move.held import deliver_all
from lnk.move.journal import Entry
from lnk.move.ready import Ask, ModelChoice
from lnk.move.signals import Guard, deferred_signals
from lnk.move.steps import Ends
from lnk.payload.receivers import purge_expired
from lnk.places import boxes
from lnk.places.where import HERE, Whereabouts, place_leg, where_is
from lnk.protocol import BackupSchedule, Prepared, ReceiveReport, Status
from lnk.transport import share
from lnk.transport.legs import Leg
from lnk.transport.pipes import pipe

__all__ = ["HERE", "finish", "finish_all", "move", "place_leg", "where_is"]

Say = Callable[[str], None]


def _ready_end(machine: Machine, place: str, say: Say, leg: Leg | None = None) -> Leg:
    """The place's leg (``leg``, when the caller resolved it already), its lnk current and
    its server started.  An SSH box, resolved once here: its server's start first, as one
    step (its answer says which lnk it is); if that lnk is not this one, or it started no
    server, the box's version is checked and upgraded as ``box add`` does, then the server
    is started."""
    if place == HERE:
        got = leg or place_leg(machine, place)
    else:
        box = boxes.get(place)
        got = box.leg()
        if box.local is None and got.warm_if(boxes.serves_this_lnk):
            return got
        report = boxes.ensure_current(box)
        if report.action != "found":
            say(report.describe())
        got = report.box.leg()
    got.warm()
    return got


def move(
    machine: Machine,
    name: str | None,
    to: str,
    *,
    from_box: str | None = None,
    no_start: bool = False,
    say: Say = lambda s: None,
    choice: ModelChoice | None = None,
    ask: Ask = lambda q: None,
    backup_schedule: bool = False,
) -> dict[str, Any]:
    """Move the agent to ``to`` (a box, or HERE), from where it is or from ``from_box``.

    Earlier unfinished moves are finished first; the messages held for the agents
    they and this move carried are handed over where each agent answers.  Expired
    receivers and kept folders are removed first: nothing secret lingers.  All the
    steps at a box share one SSH connection (``LNK_SSH_SHARE=0``: one each).
    """
    purge_expired(machine)
    # one SSH connection per box for all the steps below (lnk.transport.share)
    with share.shared(), ThreadPoolExecutor(1, "lnk-move-to") as early:
        finish_all(machine, say)
        # where the agent is, asked of a box, starts that box's server: the
        # destination's starts meanwhile, not after it (a move --from a box); not the
        # box named as both (refused), nor where nothing is asked
        starts: list[Future[Leg]] = []

        def asking() -> None:
            if from_box != to:
                starts.append(early.submit(_ready_end, machine, to, say))

        where = where_is(machine, name, from_box, asking=asking)
        dst = starts[0] if starts else None
        try:
            result = _move(
                machine,
                where,
                to,
                dst,
                no_start=no_start,
                say=say,
                choice=choice or ModelChoice(),
                ask=ask,
                backup_schedule=backup_schedule,
            )
        except BaseException:
            _deliver_held(machine, where.id, say)  # the move was undone: where it answers
            raise
        result["delivered"] = _deliver_held(machine, where.id, say)
    return result


def _deliver_held(machine: Machine, agent_id: str, say: Say) -> list[dict[str, Any]]:
    """Hand over what was held for the agent, unless its move stays unfinished."""
    if journal.entries(machine, agent_id):
        return []
    with contextlib.suppress(LnkError):
        return deliver_all(machine, agent_id, say)
    return []


def _move(
    machine: Machine,
    where: Whereabouts,
    to: str,
    dst_ready: Future[Leg] | None,
    *,
    no_start: bool,
    say: Say,
    choice: ModelChoice,
    ask: Ask,
    backup_schedule: bool,
) -> dict[str, Any]:
    name = where.name
    if where.place == to:
        raise UsageError(
            f"{name} is already {'here' if to == HERE else 'on ' + to}",
            hint="name another place with --to BOX, or --here",
        )
    for e in journal.entries(machine, where.id):
        raise TransportError(
            f"an earlier move of {name} ({e.move}) is still unfinished: {e.failed or e.phase}",
            hint="make sure both boxes answer, then run lnk agent move again",
        )
    # the two ends checked (and upgraded) at once, each then starting its lnk server
    with ThreadPoolExecutor(2, "lnk-move-ends") as pool:
        src = pool.submit(_ready_end, machine, where.place, say, where.leg)
        dst = dst_ready or pool.submit(_ready_end, machine, to, say)
        ends = Ends(src.result(), dst.result())
    t0 = time.monotonic()
    # (whether it runs there: as its status answers, beside the prepare)
    e = journal.new_entry(
        machine, agent=name, agent_id=where.id, src=where.place, dst=to, no_start=no_start
    )
    word = ready.mover_model(machine, where, choice)
    early: steps.EarlyDigests | None = None
    spare: IO[bytes] | None = None  # the bulk's inventory, for the final if it serves
    questions = ThreadPoolExecutor(5, "lnk-move-ask")
    preparing: Future[Prepared] | None = None
    try:
        # the prepare at the destination first (its walk of what it holds is the longest
        # step before the bulk), then beside it the agent's status at the source, its
        # walk (the sender's digests) and the small questions there
        preparing = questions.submit(
            steps.prepare, machine, ends.dst, name, where.id, where.here, ready.model_args(word)
        )
        asked_status = questions.submit(steps.status, ends.src, name)
        early = steps.EarlyDigests(ends.src, name)
        asked = ready.ask_source(questions, ends, where)
        try:
            prep = preparing.result()
        except BaseException:
            _at_source(asked_status, where, ends)  # the source's word first, if it fails
            raise
        e.set(phase="prepared", receiver=prep.receiver, dst_had_agent=prep.has_agent)
        st = _at_source(asked_status, where, ends)  # (its receiver abandoned if not)
        e.set(was_running=st.running)
        # what the agent needs there, settled while nothing is sent
        ready.check_harness(where, ends, prep, st.harness, to)
        ready.check_grants(machine, ends, where, prep, say, asked)
        ready.check_model(where, ends, prep, choice)
        carried = ready.carry_secrets(ends, where, asked)
        if carried:
            say(f"{name}'s keys go with it to {ends.dst.name}: {', '.join(carried)}")
        gave = ready.settle_key(e, ends, where, prep, choice, carried, ask)
        if gave:
            say(f"{prep.model_key_env} for {name}'s model is kept on {ends.dst.name} ({gave})")
        say(f"{name} will think with {prep.model} on {ends.dst.name}")
        schedule = ready.check_schedule(ends, where, carried, backup_schedule, asked)
        fault("move:after-prepare")
        say(f"sending {name} from {ends.src.name} to {ends.dst.name} while it answers")
        inv = steps.inventory(ends, name, prep, early)
        spare = steps.kept_copy(inv) if prep.folders > 0 else None
        bulk = steps.phase(ends, name, prep, "bulk", inv)
        e.set(phase="bulk-sent")
        fault("move:after-bulk")
    except BaseException as err:
        questions.shutdown()  # the questions end before their connection may
        _note_receiver(e, preparing)
        if early is not None:
            early.close()
        if spare is not None:
            spare.close()
        steps.abandon(ends.dst, e)
        with contextlib.suppress(LnkError):
            ready.forget_there(ends, e)
        e.remove()
        raise _as_lnk(err) from err
    questions.shutdown()
    early.close()  # taken by the inventory, or not needed (the destination held nothing)
    with deferred_signals() as guard:
        try:
            result = _switch(machine, e, ends, prep, bulk, spare, say, guard, t0)
        except BaseException as err:
            e.set(failed=str(err) or type(err).__name__)
            say(f"the move failed ({err}); {name} resumes on {ends.src.name}")
            undo(machine, e, ends, say)
            raise _as_lnk(err) from err
    result["schedule"] = _follow(ends, e, schedule, backup_schedule, to, say)
    return result


def _note_receiver(e: Entry, preparing: Future[Prepared] | None) -> None:
    """A move that failed while its prepare ran beside: the receiver it made, if it made
    one, goes in the entry, so it is abandoned with the rest."""
    if e.receiver or preparing is None or not preparing.done() or preparing.cancelled():
        return
    if preparing.exception() is not None:
        return
    e.set(receiver=preparing.result().receiver)


def _at_source(asked: Future[Status], where: Whereabouts, ends: Ends) -> Status:
    """The agent's status at the source, as asked; NotFound if another agent answers."""
    st = asked.result()
    if st.id != where.id:
        raise NotFound(
            f"{where.name} is not on {ends.src.name} as this computer remembers",
            hint=f"lnk box run {where.place} -- agent list",
        )
    return st


def _follow(
    ends: Ends, e: Entry, sched: BackupSchedule | None, install: bool, to: str, say: Say
) -> dict[str, Any] | None:
    """The agent's backup schedule follows it: removed where it was (by ``moved-away``),
    installed where it went (``--backup-schedule``) or offered as the line that does."""
    if sched is None:
        return None
    args = ready.schedule_args(e.agent, sched)
    say(f"{e.agent}'s backup schedule on {ends.src.name} was removed ({sched.url})")
    if not install:
        line = " ".join(args) if to == HERE else f"box run {to} -- {' '.join(args)}"
        say(f"to back it up on {ends.dst.name} as before: lnk {line}")
        return {"url": sched.url, "installed": False}
    # the owner's public backup key (and the repositories' writer secrets), never the
    # private one: the box backs up for the owner, who alone restores
    pipe(ends.src, ["backup", "key", "export", "--public"], ends.dst, ["backup", "key", "import"])
    ends.dst.run(args)
    say(f"{e.agent} is backed up from {ends.dst.name} as before ({sched.url})")
    return {"url": sched.url, "installed": True}


def _as_lnk(err: BaseException) -> BaseException:
    if isinstance(err, LnkError):
        return err
    if isinstance(err, KeyboardInterrupt):
        return Interrupted("interrupted during the move", signum=2)
    return TransportError(f"the move failed: {err}", hint="see lnk agent status on both ends")


def _switch(
    machine: Machine,
    e: Entry,
    ends: Ends,
    prep: Prepared,
    bulk: ReceiveReport,
    spare: IO[bytes] | None,
    say: Say,
    guard: Guard,
    e_started: float,
) -> dict[str, Any]:
    timings: dict[str, float] = {"bulk_s": round(time.monotonic() - e_started, 3)}
    # what the destination holds can't change before the final: ask while the agent
    # answers, unless the bulk staged nothing there and its inventory serves (steps.py)
    if spare is not None and steps.still_holds(bulk, spare):
        inv, inventories = spare, 1
    else:
        if spare is not None:
            spare.close()
        inv, inventories = steps.inventory(ends, e.agent, prep), 2
    t_pause = time.monotonic()
    steps.pause(ends.src, e.agent, e.move)
    e.set(phase="paused")
    fault("move:after-pause")
    guard.check()
    final = steps.phase(ends, e.agent, prep, "final", inv)
    e.set(phase="committed", final=final.stream_id or None)
    fault("move:after-commit")
    guard.check()
    status = forward(
        machine,
        e,
        ends,
        say,
        answered=lambda: timings.update(pause_s=round(time.monotonic() - t_pause, 3)),
    )
    timings["total_s"] = round(time.monotonic() - e_started, 3)
    return {
        "agent": e.agent,
        "id": e.agent_id,
        "from": e.src,
        "to": e.dst,
        "bulk": bulk.to_json(),
        "final": final.to_json(),
        "status": status.to_json() if status is not None else None,
        "started": not e.no_start,
        "timings": timings,
        "inventories": inventories,  # the final's its own (2), or the bulk's (1)
    }
