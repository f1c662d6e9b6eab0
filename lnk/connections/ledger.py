"""The Telegram connection's ledger: ``Agent/connections/telegram/ledger.sqlite``.

What the bridge keeps so each update is answered once, wherever the agent is:

* ``meta``: ``format`` (1) and ``offset``, the next getUpdates offset.  It moves past an
  update in the same transaction that records the update's answer (or why it has none),
  so an update is confirmed to Telegram only once its answer is on disk.
* ``updates``: the recent update IDs and how far each got: ``delivering`` (handed to the
  harness, no answer recorded yet: handed again, with the same message ID, which the
  harness answers once), ``done``, ``ignored`` (not the owner's private chat, or not a
  text), ``refused`` (too large).
* ``outbox``: each answer to send, keyed by its message ID (``tg-<update_id>``, or a
  job's ``job-<job>-<instant>``): ``answered`` → ``sending`` (written before each
  sendMessage) → ``sent``; ``unknown`` when a sendMessage's outcome was lost (the
  bridge stopped, or the answer didn't come whole): never sent again; ``failed`` when
  Telegram said no.

Rollback journal (no WAL), synchronous FULL: one file, which a move's walk carries as a
consistent snapshot.  A ledger edited by hand is checked as it is opened (its tables,
every row's types and states, its size): one that doesn't fit is refused, whole.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lnk.errors import InvalidInput

FORMAT = 1
UPDATE_STATES = ("delivering", "done", "ignored", "refused")
OUT_STATES = ("answered", "sending", "sent", "unknown", "failed")
MAX_ROWS = 100_000
MAX_ANSWER_CHARS = 1 << 20
KEEP_UPDATES = 2000  # recent update IDs kept past the offset (a restart of ids is caught)
MAX_ID = (1 << 62) - 1
SCHEMA = {
    "meta": ["key", "value"],
    "updates": ["update_id", "chat_id", "state", "at"],
    "outbox": ["id", "chat_id", "state", "answer", "chunks_sent", "note", "at"],
}
CREATE = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE updates (update_id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL,
    state TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE outbox (id TEXT PRIMARY KEY, chat_id INTEGER NOT NULL, state TEXT NOT NULL,
    answer TEXT NOT NULL, chunks_sent INTEGER NOT NULL, note TEXT NOT NULL, at REAL NOT NULL);
"""


class LedgerInvalid(InvalidInput):
    """A ledger that is not what the bridge writes (edited by hand, or damaged)."""


@dataclass(frozen=True)
class Out:
    id: str
    chat_id: int
    state: str
    answer: str
    chunks_sent: int


def _refuse(path: Path, why: str) -> LedgerInvalid:
    return LedgerInvalid(
        f"the ledger {path} is not one the bridge wrote: {why}",
        hint="lnk agent disconnect telegram, then lnk agent connect telegram (pairs anew)",
    )


def open_db(path: Path, create: bool) -> sqlite3.Connection:
    """A connection to a ledger file (made when ``create``), in autocommit mode: each
    change is its own transaction or a ``with tx(db)`` block."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not create and not path.exists():
        raise _refuse(path, "it does not exist")
    db = sqlite3.connect(path, isolation_level=None, timeout=10.0)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("PRAGMA synchronous=FULL")
    return db


@contextlib.contextmanager
def tx(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def check_schema(db: sqlite3.Connection, path: Path, schema: dict[str, list[str]]) -> None:
    try:
        ok = db.execute("PRAGMA quick_check").fetchone()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if ok is None or ok[0] != "ok":
            raise _refuse(path, "SQLite finds it damaged")
        if tables != set(schema):
            raise _refuse(path, f"its tables are {sorted(tables)[:8]}")
        for table, cols in schema.items():
            have = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            if have != cols:
                raise _refuse(path, f"the table {table} has the columns {have[:10]}")
            (n,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
            if n > MAX_ROWS:
                raise _refuse(path, f"the table {table} has {n} rows")
    except sqlite3.DatabaseError as e:
        raise _refuse(path, f"SQLite can't read it ({e})") from None


def _bad_rows(db: sqlite3.Connection, query: str, args: tuple[object, ...] = ()) -> int:
    return int(db.execute(query, args).fetchone()[0])


class Ledger:
    """One connection to the Telegram ledger (one per thread)."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        new = not path.exists()
        if new and not create:
            raise _refuse(path, "it does not exist")
        self.db = open_db(path, create)
        try:
            if new:
                with tx(self.db):
                    for statement in CREATE.split(";"):
                        if statement.strip():
                            self.db.execute(statement)
                    self.db.execute(
                        "INSERT INTO meta VALUES ('format', ?), ('offset', 0)", (FORMAT,)
                    )
            self.check()
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def check(self) -> None:
        """Refuse a ledger that is not what this module writes (LedgerInvalid)."""
        check_schema(self.db, self.path, SCHEMA)
        db, p = self.db, self.path
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if set(meta) != {"format", "offset"} or meta["format"] != FORMAT:
            raise _refuse(p, f"its meta is {sorted(meta)[:4]} (format {meta.get('format')!r})")
        off = meta["offset"]
        if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off <= MAX_ID:
            raise _refuse(p, "its offset is not a whole number")
        states = ",".join(f"'{s}'" for s in UPDATE_STATES)
        if _bad_rows(
            db,
            "SELECT count(*) FROM updates WHERE typeof(update_id) != 'integer' OR update_id < 0 "
            f"OR typeof(chat_id) != 'integer' OR state NOT IN ({states}) "
            "OR typeof(at) NOT IN ('real', 'integer')",
        ):
            raise _refuse(p, "an update's row has a wrong type or state")
        states = ",".join(f"'{s}'" for s in OUT_STATES)
        if _bad_rows(
            db,
            "SELECT count(*) FROM outbox WHERE typeof(id) != 'text' OR length(id) > 120 "
            f"OR typeof(chat_id) != 'integer' OR state NOT IN ({states}) "
            "OR typeof(answer) != 'text' OR length(answer) > ? "
            "OR typeof(chunks_sent) != 'integer' OR chunks_sent < 0 "
            "OR typeof(note) != 'text' OR length(note) > 1000 "
            "OR typeof(at) NOT IN ('real', 'integer')",
            (MAX_ANSWER_CHARS,),
        ):
            raise _refuse(p, "an answer's row has a wrong type, state or size")

    # -- reading ---------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        return int(self.db.execute("SELECT value FROM meta WHERE key='offset'").fetchone()[0])

    def update_state(self, update_id: int) -> str | None:
        row = self.db.execute("SELECT state FROM updates WHERE update_id=?", (update_id,))
        found = row.fetchone()
        return str(found[0]) if found else None

    def to_send(self) -> list[Out]:
        rows = self.db.execute(
            "SELECT id, chat_id, state, answer, chunks_sent FROM outbox "
            "WHERE state='answered' ORDER BY at, id"
        )
        return [Out(*r) for r in rows]

    def counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT state, count(*) FROM outbox GROUP BY state")
        return {str(s): int(n) for s, n in rows}

    def out_state(self, out_id: str) -> str | None:
        found = self.db.execute("SELECT state FROM outbox WHERE id=?", (out_id,)).fetchone()
        return str(found[0]) if found else None

    # -- writing ---------------------------------------------------------------------------

    def set_offset(self, offset: int) -> None:
        self.db.execute("UPDATE meta SET value=? WHERE key='offset'", (offset,))

    def delivering(self, update_id: int, chat_id: int) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO updates VALUES (?, ?, 'delivering', ?)",
            (update_id, chat_id, time.time()),
        )

    def settle(self, update_id: int, chat_id: int, state: str, answer: str | None) -> None:
        """One transaction: the update's state, its answer to send (if any), the offset past it."""
        with tx(self.db):
            self.db.execute(
                "INSERT OR REPLACE INTO updates VALUES (?, ?, ?, ?)",
                (update_id, chat_id, state, time.time()),
            )
            if answer is not None:
                self._add(f"tg-{update_id}", chat_id, answer)
            self.set_offset(update_id + 1)
        self._prune()

    def add_out(self, out_id: str, chat_id: int, answer: str) -> None:
        with tx(self.db):
            self._add(out_id, chat_id, answer)

    def _add(self, out_id: str, chat_id: int, answer: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO outbox VALUES (?, ?, 'answered', ?, 0, '', ?)",
            (out_id, chat_id, answer[:MAX_ANSWER_CHARS], time.time()),
        )

    def mark(self, out_id: str, state: str, chunks_sent: int | None = None, note: str = "") -> None:
        """Written and on disk before the call returns (synchronous FULL)."""
        if chunks_sent is None:
            self.db.execute(
                "UPDATE outbox SET state=?, note=? WHERE id=?", (state, note[:1000], out_id)
            )
        else:
            self.db.execute(
                "UPDATE outbox SET state=?, chunks_sent=?, note=? WHERE id=?",
                (state, chunks_sent, note[:1000], out_id),
            )

    def recover(self) -> list[Out]:
        """At a start: every answer left ``sending`` (the bridge stopped mid-send) becomes
        ``unknown``, never sent again; returns them."""
        rows = [
            Out(*r)
            for r in self.db.execute(
                "SELECT id, chat_id, state, answer, chunks_sent FROM outbox WHERE state='sending'"
            )
        ]
        with tx(self.db):
            for r in rows:
                self.mark(r.id, "unknown", note="the bridge stopped while sending it")
        return rows

    def _prune(self) -> None:
        (n,) = self.db.execute("SELECT count(*) FROM updates").fetchone()
        if n > KEEP_UPDATES * 2:
            self.db.execute(
                "DELETE FROM updates WHERE state != 'delivering' AND update_id NOT IN "
                "(SELECT update_id FROM updates ORDER BY at DESC LIMIT ?)",
                (KEEP_UPDATES,),
            )
            self.db.execute(
                "DELETE FROM outbox WHERE state IN ('sent', 'failed') AND id NOT IN "
                "(SELECT id FROM outbox ORDER BY at DESC LIMIT ?)",
                (KEEP_UPDATES,),
            )
