"""The scheduler's rules on a clock of the test's own, firing into a real agent's endpoint.

The jobs and the ledger here are in folders of the test's, not the agent's, so the
agent's own bridge (which its runner starts) never sees them.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from bridge_kit import events

from lnk.agents.layout import Machine
from lnk.connections.fence import Fence, Gate
from lnk.connections.scheduler import Scheduler
from lnk.connections.slots import Slots
from lnk.harness.client import send_message
from tests.agent_runner import Running, start_agent

__all__ = ["start_agent"]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class Clocked:
    def __init__(self, running: Running, tmp: Path, log: logging.Logger) -> None:
        a = running.agent
        fence = Fence(Machine.current(), a.id, a.name, a.settings.epoch, running.key, 0)
        self.folder, self.now = tmp / "schedule", 0.0
        self.folder.mkdir()
        self.sent: list[tuple[str, str, str]] = []

        def deliver(thread: str, text: str, mid: str) -> str:
            self.sent.append((thread, text, mid))
            return send_message(running.port, running.key, thread, text, message_id=mid)

        self.sched = Scheduler(Gate(fence), self.folder, tmp / "ledger.sqlite", deliver, log,
                               clock=lambda: self.now)  # fmt: skip
        self.slots = Slots(tmp / "ledger.sqlite")

    def job(self, name: str, body: str) -> None:
        (self.folder / f"{name}.toml").write_text(body)

    def at(self, when: str) -> list[str]:
        """One pass at ``when``; the message IDs handed to the agent in it."""
        before = len(self.sent)
        self.now = ts(when)
        self.sched.tick(self.slots, self.now)
        return [mid for _, _, mid in self.sent[before:]]


@pytest.fixture
def clocked(
    start_agent: Callable[..., Running], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[Clocked]:
    caplog.set_level(logging.INFO)
    c = Clocked(start_agent("main"), tmp_path, logging.getLogger("lnk bridge test"))
    yield c
    c.slots.close()


def test_cron_in_a_time_zone_across_dst(clocked: Clocked, home: Path) -> None:
    clocked.job("morning", 'cron = "0 9 * * *"\ntz = "Europe/Paris"\nmessage = "good morning"\n')
    assert clocked.at("2026-03-28T07:30:00+00:00") == []  # first seen: its earlier slots aren't due
    assert clocked.at("2026-03-28T07:59:59+00:00") == []
    winter = int(ts("2026-03-28T08:00:00+00:00"))  # 09:00 CET
    assert clocked.at("2026-03-28T08:00:01+00:00") == [f"job-morning-{winter}"]
    assert clocked.at("2026-03-28T08:30:00+00:00") == []
    summer = int(ts("2026-03-29T07:00:00+00:00"))  # 09:00 CEST: an hour earlier in UTC
    assert clocked.at("2026-03-29T07:00:05+00:00") == [f"job-morning-{summer}"]
    evs = [e for e in events(home, "main", "schedule:morning") if e["type"] == "message"]
    assert [e["id"] for e in evs] == [f"job-morning-{winter}", f"job-morning-{summer}"]


def test_a_one_shot_fires_once(clocked: Clocked) -> None:
    clocked.job(
        "dentist",
        'at = 2026-12-03T09:00:00+01:00\nmessage = "dentist at 10"\nthread = "link:main"\n',
    )
    assert clocked.at("2026-12-03T07:59:00+00:00") == []
    due = int(ts("2026-12-03T08:00:00+00:00"))
    assert clocked.at("2026-12-03T08:00:10+00:00") == [f"job-dentist-{due}"]
    assert clocked.at("2026-12-03T09:00:00+00:00") == []
    assert clocked.sent[0][0] == "link:main"


def test_missed_slots_inside_and_outside_the_window(
    clocked: Clocked, caplog: pytest.LogCaptureFixture
) -> None:
    clocked.job("tick", 'cron = "*/10 * * * *"\nmessage = "tick"\ncatch_up = "30m"\n')
    assert clocked.at("2026-12-01T10:00:30+00:00") == []
    fired = clocked.at("2026-12-01T12:05:00+00:00")  # down for two hours
    inside = [int(ts(f"2026-12-01T{t}:00+00:00")) for t in ("11:40", "11:50", "12:00")]
    assert fired == [f"job-tick-{t}" for t in inside]
    states = clocked.slots.states()
    skipped = sorted(t for (j, t), s in states.items() if s == "skipped")
    assert len(skipped) == 9 and skipped[0] == ts("2026-12-01T10:10:00+00:00")
    assert (
        "missed 9 slot(s) from 2026-12-01T10:10:00+00:00 to 2026-12-01T11:30:00+00:00"
        in caplog.text
    )
    assert clocked.at("2026-12-01T12:05:00+00:00") == []  # never twice


def test_a_claimed_slot_is_handed_again_and_answered_once(clocked: Clocked, home: Path) -> None:
    clocked.job("t", 'cron = "* * * * *"\nmessage = "again"\n')
    clocked.at("2026-12-01T10:00:30+00:00")
    slot = ts("2026-12-01T10:01:00+00:00")
    assert clocked.at("2026-12-01T10:01:01+00:00") == [f"job-t-{int(slot)}"]
    # as if the bridge had stopped after handing it over, before recording it fired
    clocked.slots.db.execute("UPDATE slots SET state='claimed'")
    assert clocked.at("2026-12-01T10:01:02+00:00") == [f"job-t-{int(slot)}"]
    assert clocked.slots.states()[("t", slot)] == "fired"
    msgs = [e for e in events(home, "main", "schedule:t") if e["type"] == "message"]
    assert len(msgs) == 1  # the harness answered the ID once


def test_bad_job_files_are_refused_in_one_line_each(
    clocked: Clocked, caplog: pytest.LogCaptureFixture
) -> None:
    clocked.job("notoml", "cron = \n")
    clocked.job("badcron", 'cron = "every day"\nmessage = "x"\n')
    clocked.job("both", 'cron = "* * * * *"\nat = 2026-12-03T09:00:00Z\nmessage = "x"\n')
    clocked.job("evil\x1b[2J", 'cron = "* * * * *"\nmessage = "x"\n')
    clocked.job("naive", 'at = 2026-12-03T09:00:00\nmessage = "x"\n')
    clocked.job("zone", 'cron = "* * * * *"\ntz = "Mars/Olympus"\nmessage = "x"\n')
    (clocked.folder / "link.toml").symlink_to(clocked.folder / "both.toml")
    clocked.job("good", 'cron = "* * * * *"\nmessage = "fine"\n')
    clocked.at("2026-12-01T10:00:30+00:00")
    assert clocked.at("2026-12-01T10:01:01+00:00") == [
        f"job-good-{int(ts('2026-12-01T10:01:00+00:00'))}"
    ]
    refusals = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refusals) == 7, refusals  # once each, though two passes ran
    assert all("\x1b" not in line for line in refusals)


def test_a_jobs_ledger_edited_by_hand_is_refused(clocked: Clocked, tmp_path: Path) -> None:
    clocked.job("good", 'cron = "* * * * *"\nmessage = "fine"\n')
    clocked.at("2026-12-01T10:00:30+00:00")
    clocked.slots.close()
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("INSERT INTO slots VALUES ('good', 'soon', 'claimed', '', 0)")
    db.commit()
    db.close()
    clocked.sched.run()  # returns at once: refused
    assert clocked.sched.state == "refused" and "not one the bridge wrote" in clocked.sched.note
    assert clocked.sent == []
    clocked.slots = Slots.__new__(Slots)  # closed above; nothing to close at teardown
    clocked.slots.db = sqlite3.connect(":memory:")
