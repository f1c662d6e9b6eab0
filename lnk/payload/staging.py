"""Staging a received stream: every entry checked, every byte verified, nothing applied.

A ``Stage`` takes a stream's records in order and builds, inside the
receiver's folder, the complete new state: ``work/agent/`` (the new Agent/
folder, collections included), ``work/home/`` (what is added to Home/), and the
settings and grants.  The destination is not touched; ``commit.py`` applies it.

Its collections are staged by ``stage_collections.py``, and what the stream
says the receiver holds already by ``stage_held.py``; this module takes the
records, the file entries and the files' bytes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sqlite3
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lnk.collections import CollectionId, Store
from lnk.errors import Refused, TransportError
from lnk.payload import manifest as M
from lnk.payload import safefs
from lnk.payload.cachedb import insert_rows
from lnk.payload.receivers import Receiver
from lnk.payload.stage_collections import CollectionStaging
from lnk.payload.stage_held import HeldStaging

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _umask() -> int:
    mask = os.umask(0o077)  # read it (the only way), then put it back
    os.umask(mask)
    return mask


_UMASK = _umask()
SEEN_MAX = 16384
# content this size or more is also linked into the receiver's objects as it arrives
# (an interrupted receive's retry adopts it); a smaller file's only once a later
# entry asks for its content (``_link_staged``): a link a file cost a first send's
# receive 14% of its CPU, for content a retry sends again in no time
ADOPT_MIN = 64 << 10
_PART = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def disk_full(e: OSError) -> TransportError:
    return TransportError(
        f"the destination's disk is full ({e.strerror})",
        hint="free some space there and try again; nothing was applied",
    )


class Stage(HeldStaging, CollectionStaging):
    """Receives one stream's payload into ``<receiver>/work``."""

    def __init__(
        self, receiver: Receiver, store_driver: str | None, keep_objects: bool = True
    ) -> None:
        self.r = receiver
        # a file's content also linked into the receiver's objects, for a later entry of
        # the same content (a stream may send it once) and an interrupted receive's retry
        self.keep_objects = keep_objects
        self.work = receiver.dir / "work"
        safefs.rmtree(self.work)
        self.work.mkdir()
        (self.work / "incoming").mkdir()
        self.db = sqlite3.connect(self.work / "entries.sqlite", isolation_level=None)
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(
            "CREATE TABLE e (i INTEGER PRIMARY KEY, path TEXT UNIQUE, fold TEXT UNIQUE,"
            " kind TEXT, mode INT, size INT, sha TEXT, grp INT, mtime INT, placed INT)"
        )
        self.db.execute("CREATE TABLE g (grp INTEGER PRIMARY KEY, sha TEXT, size INT, ro INT)")
        self.db.execute("BEGIN")
        self.head: M.Head | None = None
        # the base's folder digests as they are during this receive (look_at_base)
        self.base_now: Future[tuple[dict[str, str], dict[str, int]]] | None = None
        self.base_pool: ThreadPoolExecutor | None = None
        self.store_driver = store_driver
        self.store: Store | None = None
        self.entries = 0
        self.files = 0
        self.data_bytes = 0
        self.pending: list[M.FileEntry] = []
        # the entries of recent file lists (path -> kind, sha column), so an entry's folder
        # is mostly found without a query; cleared past SEEN_MAX
        self.seen: dict[str, tuple[str, str | None]] = {}
        self.unresolved: list[M.FileEntry] = []
        self.unsettled: set[str] = set()  # bulk only: content whose bytes did not match
        # full and final phases write each file's bytes straight into the staged tree
        # (its folders made as their entries arrive); a bulk keeps content only
        self.direct = False
        self.cur_target: str | None = None
        self.home_s, self.agent_s = str(self.work / "home"), str(self.work / "agent")
        self.cur: int | None = None  # the file descriptor the pending entry's bytes go to
        self.cur_hash: Any = None
        self.cur_left = 0
        self.line = bytearray()
        self.coll_file: Any = None
        # a collection is imported in a thread while the stream goes on (a few at most)
        self.importer: ThreadPoolExecutor | None = None
        self.imports: deque[Future[None]] = deque()
        self.collections = 0
        self.collection_records = 0
        self.summary: dict[str, Any] | None = None
        self.mentioned: set[tuple[str, str]] = set()
        self.coll_cid: CollectionId | None = None
        self.coll_fresh = True
        self.based = False  # the staged store started from a held or bulk copy
        self.records = 0  # records taken so far
        self.prefix = 0  # bytes before a stream's path on this disk (set at the HEAD)
        self.room = M.MAX_PATH_BYTES

    # ---- records --------------------------------------------------------
    def take(self, rtype: int, body: bytes) -> None:
        index, self.records = self.records, self.records + 1
        if rtype not in M.RECORD_NAMES:  # before anything it might be taken for
            raise M.bad(f"record {index} is of an unknown record type {rtype:#x} (unassigned)")
        if self.summary is not None:
            raise M.bad("a record follows the summary")
        if self.head is None:
            if rtype != M.HEAD:
                raise M.bad(
                    f"the stream starts with a {M.RECORD_NAMES.get(rtype, hex(rtype))} "
                    "record, not the manifest"
                )
            self.head = M.Head.from_json(M.load_json(body, "manifest"))
            self.direct = self.head.phase != "bulk"
            self._path_room()
            return
        try:
            if rtype == M.DATA:
                self._data(memoryview(body))
                return
            self._no_pending_data()
            if rtype == M.FILES:
                self._files(body)
            elif rtype == M.COLLECTION:
                self._collection_bytes(body)
            elif rtype == M.SUMMARY:
                self._end_collections()
                summary = M.load_json(body, "summary")
                if not isinstance(summary, dict):
                    raise M.bad("the summary is not an object")
                for k in M.SUMMARY_KEYS:
                    v = summary.get(k)
                    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                        raise M.bad(f"the summary's {k!r} is {str(v)[:40]!r}, not a count")
                self.summary = summary
            else:
                raise M.bad("a second manifest in one stream")
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full(e) from e
            raise

    # ---- files ----------------------------------------------------------
    def _files(self, body: bytes) -> None:
        batch = M.load_file_list(body)
        if len(batch) > M.FILES_PER_RECORD:
            raise M.bad(
                f"record {self.records - 1} lists {len(batch)} entries; a FILES record "
                f"holds at most {M.FILES_PER_RECORD}"
            )
        self._resolve_unresolved()
        rows: list[tuple[Any, ...]] = []  # entries other than folders: inserted together
        for raw in batch:
            e = M.FileEntry.from_json(raw)
            self.entries += 1
            if self.entries > M.MAX_ENTRIES:
                raise M.bad(f"the stream holds more than {M.MAX_ENTRIES} entries")
            self._check_parent(e.path)
            self._check_length(e.path)
            if e.kept:
                self._check_kept(e)
            placed = self.direct and e.kind == "f" and e.data
            # a link keeps its target, a folder held whole its digest
            sha = e.target if e.kind == "l" else e.kept or e.sha256
            rec: tuple[Any, ...] = (self.entries, e.path, M.fold(e.path), e.kind, e.mode)
            rec += (e.size, sha, e.group, e.mtime_ns, placed)
            self.seen[e.path] = (e.kind, sha)
            if e.kind == "d":  # at once: its folder is made below, and only once
                self._insert([rec])
            else:
                rows.append(rec)
            if e.kind == "d" and self.direct and not e.kept:
                if e.path in M.FILE_ROOTS:
                    os.makedirs(self.staged(e.path), 0o700, exist_ok=True)
                else:  # its folder came before it (checked above)
                    os.mkdir(self.staged(e.path), 0o700)
            if e.kind != "f":
                continue
            self.files += 1
            if e.group is not None:
                ro = M.read_only(e.path)
                row = self.db.execute(
                    "SELECT sha, size, ro FROM g WHERE grp=?", (e.group,)
                ).fetchone()
                if row is None:
                    self.db.execute(
                        "INSERT INTO g VALUES (?,?,?,?)", (e.group, e.sha256, e.size, ro)
                    )
                elif tuple(row[:2]) != (e.sha256, e.size):
                    raise M.bad(f"{e.path!r} is a hard link to a file with other content")
                elif bool(row[2]) != ro:
                    raise M.bad(
                        f"{e.path!r} is a hard link across folders with different write rules "
                        "(a read-only folder of Agent/ and one the agent writes)"
                    )
                elif e.data:
                    raise M.bad(f"{e.path!r} carries bytes but is a link to an earlier file")
            if e.data:
                if e.size == 0:
                    raise M.bad(f"{e.path!r} is empty yet says bytes follow")
                self.pending.append(e)
            else:
                self.unresolved.append(e)
        self._insert(rows)
        if len(self.seen) > SEEN_MAX:
            self.seen.clear()

    def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        """Add entries to the stream's list; the first whose path (or its case- and
        Unicode-folded form) is there already is refused by name."""
        head = "INSERT INTO e (i, path, fold, kind, mode, size, sha, grp, mtime, placed)"
        try:
            insert_rows(self.db, head, 10, rows)
        except sqlite3.IntegrityError:
            # the statements before the one refused are in, none of its rows: that one's
            # rows again one at a time, and the first refused is named
            for row in rows:
                if self.db.execute("SELECT 1 FROM e WHERE i=?", (row[0],)).fetchone():
                    continue
                try:
                    self.db.execute(f"{head} VALUES (?,?,?,?,?,?,?,?,?,?)", row)
                except sqlite3.IntegrityError:
                    raise M.bad(
                        f"{row[1]!r} appears twice, or differs from another path only by "
                        "case or Unicode normalisation"
                    ) from None
            raise

    def _path_room(self) -> None:
        """How long a stream's path may be here: joined to the agent's folder (or to the
        staging folder, whichever is longer) it must stay within the system's PATH_MAX."""
        assert self.head is not None
        root = self.r.machine.folders(self.head.name).root
        try:
            path_max = os.pathconf(self.work, "PC_PATH_MAX")
        except (OSError, ValueError):
            path_max = 4096
        self.prefix = max(len(os.fsencode(root)), len(os.fsencode(self.work / "agent-old")))
        self.room = path_max - 1 - self.prefix - 1

    def _check_length(self, path: str) -> None:
        n = len(path.encode())
        if n > self.room:
            assert self.head is not None
            root = self.r.machine.folders(self.head.name).root
            raise Refused(
                f"the path {path[:60]!r}… ({n} bytes) is too long to be written here: "
                f"joined to {root} it passes this system's limit of "
                f"{self.room + self.prefix + 1} bytes",
                hint="nothing was applied; shorten the path where the agent is, "
                "or keep the agent where its folder's path is shorter",
            )

    def _check_parent(self, path: str) -> None:
        if path in M.FILE_ROOTS:
            return
        parent = path.rsplit("/", 1)[0]
        row = self.seen.get(parent)
        if row is None:
            row = self.db.execute("SELECT kind, sha FROM e WHERE path=?", (parent,)).fetchone()
        if row is None or row[0] != "d":
            raise M.bad(f"{path!r} comes before its folder {parent!r}, or its folder is a file")
        if row[1]:
            raise M.bad(f"{path!r} is inside {parent!r}, which the stream says is held here whole")

    def staged(self, path: str) -> str:
        """Where an entry of the stream is staged: work/home/… or work/agent/…."""
        if path == "Home":
            return self.home_s
        if path.startswith("Home/"):
            return f"{self.home_s}/{path[5:]}"
        return f"{self.agent_s}/{path[len('Agent/') :]}"

    def _data(self, view: memoryview) -> None:
        while len(view):
            if self.cur is None:
                if not self.pending:
                    raise M.bad("file bytes arrived that no entry declared")
                e = self.pending[0]
                if self.direct:  # its folder was made when its entry came
                    self.cur_target = self.staged(e.path)
                    # made with its mode where the umask leaves it whole (no chmod after)
                    fd = os.open(self.cur_target, _NEW, e.mode if not e.mode & _UMASK else 0o600)
                else:
                    self.cur_target = None
                    fd = os.open(self.work / "incoming" / "part", _PART, 0o600)
                self.cur = fd
                self.cur_hash = hashlib.sha256()
                self.cur_left = e.size
            n = min(self.cur_left, len(view))
            piece = view[:n]
            _write_all(self.cur, piece)
            self.cur_hash.update(piece)
            self.cur_left -= n
            self.data_bytes += n
            view = view[n:]
            if self.cur_left == 0:
                self._finish_file()

    def _finish_file(self) -> None:
        e = self.pending.pop(0)
        fd = self.cur
        assert fd is not None
        self.cur = None
        if self.cur_target is not None:
            if self.cur_hash.hexdigest() != e.sha256:
                os.close(fd)
                raise M.bad(f"the bytes of {e.path!r} do not match its SHA-256")
            try:
                if e.mode & _UMASK:
                    os.fchmod(fd, e.mode)
                os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))
            finally:
                os.close(fd)
            if self.keep_objects and e.size >= ADOPT_MIN:  # held in the objects too
                with contextlib.suppress(FileExistsError):
                    os.link(self.cur_target, f"{self.r.objects_s}/{e.sha256}")
            return
        os.close(fd)
        if self.cur_hash.hexdigest() != e.sha256:
            assert self.head is not None
            if self.head.phase != "bulk":
                raise M.bad(f"the bytes of {e.path!r} do not match its SHA-256")
            # a bulk goes while the agent runs: a file that changed while the sender read
            # it is unsettled; nothing of it is kept, and the final phase carries it
            (self.work / "incoming" / "part").unlink()
            self.unsettled.add(e.sha256)
            return
        os.replace(self.work / "incoming" / "part", self.r.objects / e.sha256)

    def _no_pending_data(self) -> None:
        if self.pending:
            e = self.pending[0]
            raise M.bad(f"the bytes of {e.path!r} ended early (declared {e.size} bytes)")

    # ---- the end ----------------------------------------------------------
    def finish(self) -> None:
        """After the final record verified: check the summary, close what is open."""
        if self.head is None:
            raise M.bad("the stream carries no manifest")
        if self.summary is None:
            raise M.bad("the stream carries no summary")
        self._resolve_unresolved()
        want = {
            "entries": self.entries,
            "files": self.files,
            "data_bytes": self.data_bytes,
            "collections": self.collections,
            "records": self.collection_records,
        }
        got = {k: self.summary.get(k) for k in want}
        if got != want:
            raise M.bad(f"the summary says {got} but the stream carried {want}")
        self._open_store()  # an agent with no collections still gets its store
        self.close()

    def close(self) -> None:
        if self.cur is not None:
            os.close(self.cur)
            self.cur = None
        if self.coll_file is not None:
            self.coll_file.close()
            self.coll_file = None
        if self.base_pool is not None:
            self.base_pool.shutdown(wait=False, cancel_futures=True)
            self.base_pool = None
        if self.importer is not None:
            self.importer.shutdown(wait=True, cancel_futures=True)
            self.importer = None
            self.imports.clear()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.db.in_transaction:
            self.db.execute("COMMIT")

    def iter_entries(self) -> Iterator[tuple[str, str, int, int, str, int | None, int, int]]:
        """Every entry in stream order: path, kind, mode, size, sha (a link's target, a
        folder held whole's digest), group, mtime, and whether its bytes are staged."""
        yield from self.db.execute(
            "SELECT path, kind, mode, size, sha, grp, mtime, placed FROM e ORDER BY i"
        )

    def iter_files(self) -> Iterator[tuple[str, int, str]]:
        """Every file entry in stream order: path, size, SHA-256."""
        yield from self.db.execute("SELECT path, size, sha FROM e WHERE kind='f' ORDER BY i")


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]
