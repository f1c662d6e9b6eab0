"""The bridge's scheduler: each job's due slots fired once, through the harness's endpoint.

Each pass (:meth:`Scheduler.tick`, at least once a second and at each job's next
instant):

1. a slot left ``claimed`` (the bridge stopped between its claim and the harness's
   answer) is handed again, with the same message ID, which the harness answers once;
2. each job's slots since its last (or, for a new repeating job, since it was first
   seen) are due: those missed by more than its catch-up window are ``skipped``, in one
   logged line; each other is claimed (on disk), handed to the harness on the job's
   thread with the message ID ``job-<job>-<instant>``, and recorded ``fired``; a job on
   the ``telegram`` thread has its answer sent to the owner's chat.

The clock is a parameter, so a test passes its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from lnk.connections.fence import Gate
from lnk.connections.jobs import Job, JobRefused, read_jobs
from lnk.connections.ledger import LedgerInvalid
from lnk.connections.slots import Slots, msg_id
from lnk.errors import AgentNotRunning, LnkError, Refused
from lnk.text import one_line

Deliver = Callable[[str, str, str], str]
TelegramOut = Callable[[str, int, str], None]  # (message ID, chat, answer): to send


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


class Scheduler:
    def __init__(
        self,
        gate: Gate,
        folder: Path,
        slots_path: Path,
        deliver: Deliver,
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.time,
        owner_chat: Callable[[], int | None] = lambda: None,
        telegram_out: TelegramOut | None = None,
    ) -> None:
        self.gate, self.folder, self.slots_path = gate, folder, slots_path
        self.deliver, self.log, self.clock = deliver, log, clock
        self.owner_chat, self.telegram_out = owner_chat, telegram_out
        self.state, self.note = "starting", ""
        self.jobs: dict[str, Job] = {}
        self._told: dict[str, tuple[int, int]] = {}  # a refused file: its version, told once

    def run(self) -> None:
        try:
            slots = Slots(self.slots_path)
        except LedgerInvalid as e:
            self.state, self.note = "refused", e.message
            self.log.error("schedule: %s (hint: %s)", e.message, e.hint)
            return
        try:
            self.state = "running"
            while True:
                self.gate.check()
                wake = self.tick(slots, self.clock())
                self.gate.wait(max(0.02, min(1.0, wake - self.clock())))
        finally:
            slots.close()

    def read(self) -> dict[str, Job]:
        jobs: dict[str, Job] = {}
        for name, job, version in read_jobs(self.folder):
            if isinstance(job, JobRefused):
                if self._told.get(name) != version:
                    self._told[name] = version
                    self.log.error(
                        "schedule: the job file %s.toml is refused: %s",
                        one_line(name, 80),
                        one_line(str(job), 300),
                    )
                continue
            self._told.pop(name, None)
            if job.enabled:
                jobs[name] = job
        self.jobs = jobs
        return jobs

    def tick(self, slots: Slots, now: float) -> float:
        """One pass; when something is next due."""
        jobs = self.read()
        for name, t in slots.claimed():
            if name in jobs:
                self.fire(slots, jobs[name], t, claimed=True)
            else:
                with self.gate.acting():
                    slots.fired(name, t, note="unknown: its job was removed before it answered")
                self.log.warning(
                    "schedule: the slot %s of %s is unknown (its job file is gone)", _when(t), name
                )
        wake = math.inf
        for job in jobs.values():
            self._due(slots, job, now)
            wake = min(wake, job.next_after(now))
        slots.prune(now)
        return wake

    def _due(self, slots: Slots, job: Job, now: float) -> None:
        first = slots.first_seen(job.name, now)
        last = slots.last(job.name)
        after = last if last is not None else (first if job.cron is not None else 0.0)
        due = job.due(after, now)
        late = [t for t in due if t <= now - job.catch_up]
        if late:
            with self.gate.acting():
                slots.skip(job.name, late, "missed by more than its catch-up window")
            self.log.warning(
                "schedule: %s missed %d slot(s) from %s to %s by more than its catch-up "
                "window (%d s): skipped",
                job.name,
                len(late),
                _when(late[0]),
                _when(late[-1]),
                int(job.catch_up),
            )
        for t in due:
            if t > now - job.catch_up:
                self.fire(slots, job, t)

    def fire(self, slots: Slots, job: Job, t: float, *, claimed: bool = False) -> None:
        chat = self.owner_chat() if job.thread == "telegram" else None
        if job.thread == "telegram" and (chat is None or self.telegram_out is None):
            if self._told.get(job.name) != (0, 0):
                self._told[job.name] = (0, 0)
                self.log.error(
                    "schedule: %s goes to telegram, which is not connected: it waits", job.name
                )
            return
        with self.gate.acting():
            if not claimed and not slots.claim(job.name, t):
                return  # claimed before: never twice
        mid = msg_id(job.name, t)
        thread = f"telegram:{chat}" if chat is not None else job.thread
        answer = self._deliver(thread, job.message, mid)
        with self.gate.acting():
            if chat is not None and self.telegram_out is not None:
                self.telegram_out(mid, chat, answer)
            slots.fired(job.name, t)
        self.log.info(
            "schedule: %s fired for %s on %s (%d characters answered)",
            job.name,
            _when(t),
            thread,
            len(answer),
        )

    def _deliver(self, thread: str, text: str, mid: str) -> str:
        tries = 0
        while True:
            self.gate.check()
            try:
                return self.deliver(thread, text, mid)
            except (AgentNotRunning, Refused) as e:
                tries += 1
                if tries in (1, 10):
                    self.log.warning("schedule: %s waits: %s", mid, e.message)
                self.gate.wait(min(30.0, 0.2 * tries))
            except LnkError as e:
                return f"(the agent could not answer this job: {e.message})"
