"""The connections' fault matrix: kill -9 of the mover, the sender, the receiver, the
bridge and the runner at a move's steps, while the owner writes every 100 ms and a job is
due every 2 s (its answers to the owner's chat).  After the recovery the design names
(``lnk agent start``): every update answered exactly once or reported unknown, every
slot fired exactly once, nothing ever sent twice (the server's record of sendMessage)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from bridge_kit import (
    JOB,
    JOB_TEXT,
    TOKEN,
    People,
    answered_once,
    connect,
    sent_texts,
    wait_for,
)
from hosts import Hosts
from telegram_api import BotApiServer

from tests.move.move_helpers import AGENT, HERE, World, kill_agents, make_agent

# (victim, fault point or how, where the agent ends)
CASES = [
    ("mover", "move:after-pause", "src"),
    ("mover", "move:after-commit", "dst"),
    ("mover", "move:after-start", "dst"),
    ("sender", "send:mid-final", "src"),
    ("receiver", "receive:mid-final", "src"),
    ("bridge", "kill -9 the source's bridge as the move starts", "dst"),
    ("runner", "kill -9 the runner, start it again, then move", "dst"),
]


def _agent_dir(world: World, place: str) -> Path:
    return world.home_of(place) / "Link" / "Agents" / AGENT


def _pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


def _runtime(world: World, place: str, agent_id: str) -> Path:
    return world.home_of(place) / ".lnk" / "agents" / agent_id


def _settle(world: World, place: str, telegram: BotApiServer, people: People) -> dict[str, Any]:
    """Wait until everything is answered where the agent ended; the checks and the figures."""
    conn = _agent_dir(world, place) / "Agent" / "connections"

    def rows(db: str, query: str) -> list[tuple[Any, ...]]:
        c = sqlite3.connect(conn / db)
        try:
            return list(c.execute(query))
        finally:
            c.close()

    def unknown() -> set[str]:
        ids = [
            r[0]
            for r in rows("telegram/ledger.sqlite", "SELECT id FROM outbox WHERE state='unknown'")
        ]
        return {
            people.sent[int(i[3:])]
            for i in ids
            if i.startswith("tg-") and int(i[3:]) in people.sent
        }

    texts = list(people.sent.values())

    def done() -> bool:
        got = "\n".join(sent_texts(telegram))
        left = [t for t in texts if f"you said: {t} (" not in got]
        return not (set(left) - unknown()) and telegram.pending(TOKEN) == []

    try:  # within the test's own timeout (300 s), so a failure says what was left
        wait_for("every message answered where the agent is", done, bound=150)
    except AssertionError:
        got = "\n".join(sent_texts(telegram))
        left = sorted({t for t in texts if f"you said: {t} (" not in got} - unknown())
        raise AssertionError(
            f"never answered where the agent is ({place}): {len(left)} messages, e.g. "
            f"{left[:5]}; {len(telegram.pending(TOKEN))} updates never fetched; outbox by "
            f"state: {rows('telegram/ledger.sqlite', 'SELECT state, count(*) FROM outbox GROUP BY state')}"
        ) from None
    lost = unknown()
    figures = answered_once(telegram, texts, lost)
    slots = rows(
        "schedule/ledger.sqlite",
        "SELECT instant, state FROM slots WHERE job='tick' ORDER BY instant",
    )
    assert slots, "the job never fired"
    instants = [int(t) for t, _ in slots]
    assert instants == list(range(instants[0], instants[-1] + 1, 2)), "a slot is missing"
    assert {s for _, s in slots} <= {"fired", "claimed"}, slots
    fired = [t for t, s in slots if s == "fired"]
    ticks = [t for t in sent_texts(telegram) if f"you said: {JOB_TEXT} (" in t]
    assert len(ticks) <= len(slots)  # each fired slot's answer once (answered_once: none twice)
    figures["slots"] = len(fired)
    return figures


def _case(
    world: World, telegram: BotApiServer, victim: str, point: str, ends: str, dst: str
) -> None:
    telegram.add_bot(TOKEN, username="work_bot")
    agent_id = make_agent(world)
    (_agent_dir(world, HERE) / "Agent" / "schedule" / "tick.toml").write_text(JOB)
    assert connect(world.here, telegram, AGENT).returncode == 0
    env: dict[str, str] = {}
    with People(telegram, victim) as people:
        wait_for("a first answer", lambda: len(sent_texts(telegram)) > 3)
        killer = None
        if victim in ("mover", "sender", "receiver"):
            env = {"LNK_FAULT": point}
        elif victim == "bridge":
            pidfile = _runtime(world, HERE, agent_id) / "bridge.pid"
            pid = _pid(pidfile)
            assert pid is not None
            killer = threading.Timer(0.2, os.kill, (pid, signal.SIGKILL))
            killer.start()
        elif victim == "runner":
            rt = _runtime(world, HERE, agent_id)
            runner, ep = _pid(rt / "runner.pid"), (rt / "endpoint.json").read_text()
            assert runner is not None
            os.kill(runner, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # unsandboxed, it outlives the runner
                os.kill(int(ep.split('"harness_pid":')[1].split(",")[0]), signal.SIGKILL)
            world.ok("agent", "start", "--agent", AGENT)
        before = len(sent_texts(telegram))
        moved = world.lnk("agent", "move", "--agent", AGENT, "--to", dst, "--json", env=env)
        if killer is not None:
            killer.join()
        if env:
            assert moved.code != 0, "the fault did not fire"
            world.lnk("agent", "start", "--agent", AGENT)  # the recovery: finishes the journal
        else:
            assert moved.code == 0, moved.err
        wait_for(
            "answers after the move", lambda: len(sent_texts(telegram)) > before + 5, bound=120
        )
    assert world.journal_empty()
    where = world.exactly_one(agent_id)
    assert where == (HERE if ends == "src" else dst)
    figures = _settle(world, where, telegram, people)
    print(f"{victim} {point}: {figures}")
    return figures


@pytest.mark.parametrize(("victim", "point", "ends"), CASES, ids=[c[1] for c in CASES])
def test_fault_here_to_box(
    request: pytest.FixtureRequest,
    world: World,
    telegram: BotApiServer,
    victim: str,
    point: str,
    ends: str,
) -> None:
    figures = _case(world, telegram, victim, point, ends, "b1")
    request.node.user_properties.append(("connection_figures", figures))


def test_fault_over_ssh(request: pytest.FixtureRequest, home: Path, ssh_hosts: Hosts) -> None:
    """Here to a box over real sshd, the mover killed after the commit: the box answers."""
    world = World(here=home, env={"LNK_SSH_COMMAND": ssh_hosts.ssh_command})
    world.add_ssh_box("hostA", ssh_hosts["hostA"].home)
    server = BotApiServer(host=ssh_hosts.bridge_address)  # reached from the box's network
    server.start()
    try:
        figures = _case(world, server, "mover", "move:after-commit", "dst", "hostA")
        request.node.user_properties.append(("connection_figures", figures))
    finally:
        server.stop()
        kill_agents([world.here, ssh_hosts["hostA"].home])  # its HOME is reset after
