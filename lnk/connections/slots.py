"""The jobs' ledger: ``Agent/connections/schedule/ledger.sqlite``, one row a (job, instant).

* ``jobs``: each job's name and when the scheduler first saw it (a new repeating job
  fires from then on, never for its slots before);
* ``slots``: (job, instant) is the primary key, so a slot is claimed once, ever.
  ``claimed`` is written (and on disk) before the job's message goes to the harness;
  ``fired`` once the harness answered; ``skipped`` when it was missed by more than the
  job's catch-up window (logged).  A slot left ``claimed`` (the bridge stopped midway)
  is handed again with the same message ID, ``job-<job>-<instant>``, which the harness
  answers once: fired once, never twice.

Same file rules as the Telegram ledger (:mod:`lnk.connections.ledger`): checked whole as
it opens, refused whole when edited into something it doesn't write.
"""

from __future__ import annotations

import time
from pathlib import Path

from lnk.connections.ledger import LedgerInvalid, check_schema, open_db, tx

FORMAT = 1
STATES = ("claimed", "fired", "skipped")
KEEP_S = 30 * 86400.0
SCHEMA = {
    "meta": ["key", "value"],
    "jobs": ["job", "first_seen"],
    "slots": ["job", "instant", "state", "note", "at"],
}
CREATE = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE jobs (job TEXT PRIMARY KEY, first_seen REAL NOT NULL)",
    "CREATE TABLE slots (job TEXT NOT NULL, instant REAL NOT NULL, state TEXT NOT NULL, "
    "note TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (job, instant))",
]


def _refuse(path: Path, why: str) -> LedgerInvalid:
    return LedgerInvalid(
        f"the jobs' ledger {path} is not one the bridge wrote: {why}",
        hint=f"rm {path} (the jobs' past slots are forgotten: each fires from now on)",
    )


def msg_id(job: str, instant: float) -> str:
    return f"job-{job}-{int(instant)}"


class Slots:
    def __init__(self, path: Path) -> None:
        self.path = path
        new = not path.exists()
        self.db = open_db(path, True)
        try:
            if new:
                with tx(self.db):
                    for statement in CREATE:
                        self.db.execute(statement)
                    self.db.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
            self.check()
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def check(self) -> None:
        try:
            check_schema(self.db, self.path, SCHEMA)
        except LedgerInvalid as e:
            raise _refuse(self.path, e.message.rpartition(": ")[2]) from None
        db, p = self.db, self.path
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if meta != {"format": FORMAT}:
            raise _refuse(p, "its meta is not format 1")
        states = ",".join(f"'{s}'" for s in STATES)
        (bad,) = db.execute(
            "SELECT count(*) FROM slots WHERE typeof(job) != 'text' OR length(job) > 64 "
            "OR typeof(instant) NOT IN ('real', 'integer') OR abs(instant) > 1e11 "
            f"OR state NOT IN ({states}) OR typeof(note) != 'text' OR length(note) > 1000 "
            "OR typeof(at) NOT IN ('real', 'integer')"
        ).fetchone()
        (bad_jobs,) = db.execute(
            "SELECT count(*) FROM jobs WHERE typeof(job) != 'text' OR length(job) > 64 "
            "OR typeof(first_seen) NOT IN ('real', 'integer') OR abs(first_seen) > 1e11"
        ).fetchone()
        if bad or bad_jobs:
            raise _refuse(p, "a row has a wrong type, state or size")

    def first_seen(self, job: str, now: float) -> float:
        """When the job was first seen (now, if this is the first time)."""
        self.db.execute("INSERT OR IGNORE INTO jobs VALUES (?, ?)", (job, now))
        row = self.db.execute("SELECT first_seen FROM jobs WHERE job=?", (job,)).fetchone()
        return float(row[0])

    def last(self, job: str) -> float | None:
        row = self.db.execute("SELECT max(instant) FROM slots WHERE job=?", (job,)).fetchone()
        return None if row[0] is None else float(row[0])

    def claim(self, job: str, instant: float) -> bool:
        """Claim the slot; False if it was claimed (or skipped) before."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO slots VALUES (?, ?, 'claimed', '', ?)",
            (job, instant, time.time()),
        )
        return cur.rowcount == 1

    def fired(self, job: str, instant: float, note: str = "") -> None:
        self.db.execute(
            "UPDATE slots SET state='fired', note=?, at=? WHERE job=? AND instant=?",
            (note[:1000], time.time(), job, instant),
        )

    def skip(self, job: str, instants: list[float], note: str) -> None:
        with tx(self.db):
            for t in instants:
                self.db.execute(
                    "INSERT OR IGNORE INTO slots VALUES (?, ?, 'skipped', ?, ?)",
                    (job, t, note[:1000], time.time()),
                )

    def claimed(self) -> list[tuple[str, float]]:
        rows = self.db.execute(
            "SELECT job, instant FROM slots WHERE state='claimed' ORDER BY instant"
        )
        return [(str(j), float(t)) for j, t in rows]

    def states(self) -> dict[tuple[str, float], str]:
        rows = self.db.execute("SELECT job, instant, state FROM slots")
        return {(str(j), float(t)): str(s) for j, t, s in rows}

    def prune(self, now: float) -> None:
        """Slots older than 30 days go, but each job's newest (where its next one starts)."""
        self.db.execute(
            "DELETE FROM slots WHERE state != 'claimed' AND instant < ? AND instant < "
            "(SELECT max(instant) FROM slots s WHERE s.job = slots.job)",
            (now - KEEP_S,),
        )
