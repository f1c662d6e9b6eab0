"""Sending an agent's files: FILES batches, each followed by the DATA of the files in
it that carry bytes (docs/stream-format.md, "Payload: records of an agent").

A ``FileSender`` takes the walked entries one by one, cuts them into batches, and
has their files read and hashed by a small pool while the batch before goes.  A
file whose content the receiver's inventory holds, or that this stream already
carried, carries no bytes.  ``send.py`` runs the whole send around it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from lnk.errors import StreamError
from lnk.formats.stream import RECORD_MAX, StreamWriter
from lnk.payload import manifest as M
from lnk.payload.hashcache import RACY_NS, HashCache
from lnk.payload.inventory import Inventory
from lnk.payload.pinned import open_file, open_walked, same_stat
from lnk.payload.read_process import SMALL_MAX
from lnk.payload.reading import SETTLE_TRIES, Readers, Slot, read_settled
from lnk.payload.unchanged import SinceDigests
from lnk.payload.walk import WalkedFile

BATCH_DATA_BYTES = 8 << 20
DEDUP_MIN = 64 << 10  # content this size or more is sent once per stream
SMALL_FILE = SMALL_MAX  # files up to this size are read once, into memory, before their entry


@dataclass
class SendReport:
    stream_id: str
    phase: str
    entries: int = 0
    files: int = 0
    file_bytes: int = 0  # the agent's file bytes, sent or not
    data_bytes: int = 0  # file bytes carried in this stream
    held_by_receiver: int = 0  # files whose bytes the receiver already had
    held_unchanged: int = 0  # of those, known held as unchanged in a folder it holds whole
    kept_folders: int = 0  # folders the receiver holds whole: one entry each, no contents
    collections: int = 0
    collection_records: int = 0
    wire_bytes: int = 0
    hashed_bytes: int = 0
    skipped_links: int = 0
    links: int = 0  # symbolic links carried (as links)
    skipped_special: int = 0
    vanished: int = 0  # files gone between the walk and their read: not sent
    unsettled: list[str] = field(default_factory=list)  # bulk: changed while read
    watermarks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


READ_JOB = 32  # files a read job takes


class _Batch:
    """Entries waiting to go as one FILES record, and the reads that complete them."""

    def __init__(self) -> None:
        self.items: list[tuple[WalkedFile, Slot | None]] = []
        self.small_bytes = 0
        self.json_bytes = 0  # a bound on the FILES record's JSON size


class FileSender:
    """Batches of entries; their files read and hashed by a small pool while the batch
    before goes; a file's entry is written only once its bytes are read (small files)
    or hashed (big ones), so a file that changes before that is simply sent as it is
    then."""

    def __init__(
        self,
        writer: StreamWriter,
        inventory: Inventory | None,
        report: SendReport,
        progress: Callable[[int], None] | None,
        phase: str,
        cache: HashCache,
        readers: Readers,
        since: SinceDigests | None = None,
    ) -> None:
        self.chunk: list[Slot] = []
        self.w = writer
        # (not ``or``: an inventory of no digests is falsy, and may still name folders)
        self.inv = inventory if inventory is not None else Inventory()
        self.report = report
        self.progress = progress or (lambda n: None)
        self.phase = phase
        self.cache = cache
        self.readers = readers
        self.batch = _Batch()
        self.queue: deque[_Batch] = deque()
        self.sent: set[bytes] = set()
        self.groups: dict[int, tuple[int, str]] = {}  # group -> (size, sha) of its first
        # what the receiver holds as it is here, unchanged since the digests its inventory
        # named folders by (lnk/payload/unchanged.py)
        self.since = since if since is not None else SinceDigests({}, 0, "")

    def _held(self, f: WalkedFile) -> bool:
        d = bytes.fromhex(f.sha256)
        return d in self.sent or d in self.inv or self._unchanged(f)

    def _unchanged(self, f: WalkedFile) -> bool:
        return f.group is None and not f.snapshot and self.since.file(f.rel, f.st)

    def add(self, f: WalkedFile) -> None:
        # a FILES body stays within MAX_JSON_RECORD whatever the paths' length (an entry
        # is at most its path and link target twice, escaped, and 200 bytes of fields)
        size = 2 * len(f.rel.encode()) + 2 * len((f.target or "").encode()) + 200
        if self.batch.items and self.batch.json_bytes + size > M.MAX_JSON_RECORD:
            self.cut()
        self.batch.json_bytes += size
        job: Slot | None = None
        if f.kind == "d" and not f.kept and f.st is not None:
            self.since.folder(f.rel, f.st.st_ctime_ns)
        if f.kind == "f" and f.size > 0 and f.group_first:
            small = f.size <= SMALL_FILE
            if f.sha256 == "" or (small and not self._held(f)):
                # read now (small: its bytes travel from memory) or hash (big)
                assert f.source is not None
                job = Slot(f.source, small, *_walked(f))
                self.chunk.append(job)
                if len(self.chunk) >= READ_JOB:
                    self._submit()
                if small:
                    self.batch.small_bytes += f.size
        self.batch.items.append((f, job))
        if (
            len(self.batch.items) >= M.FILES_PER_RECORD
            or self.batch.small_bytes >= BATCH_DATA_BYTES
        ):
            self.cut()

    def _submit(self) -> None:
        if self.chunk:
            done = self.readers.submit(self.chunk)
            for slot in self.chunk:
                slot.done = done
            self.chunk = []

    def cut(self) -> None:
        """Close the batch being filled; write the oldest once two are in flight."""
        self._submit()
        if self.batch.items:
            self.queue.append(self.batch)
            self.batch = _Batch()
        while len(self.queue) > 1:
            self._write(self.queue.popleft())

    def flush(self) -> None:
        self.cut()
        while self.queue:
            self._write(self.queue.popleft())

    def _unsettled(self, rel: str) -> None:
        if self.phase != "bulk":
            raise StreamError(
                f"{rel} kept changing while it was being sent ({SETTLE_TRIES} reads)",
                hint="pause what writes it (lnk agent pause) and send again; a move sends "
                "such a file again once the agent is paused",
            )
        self.report.unsettled.append(rel)

    def _write(self, batch: _Batch) -> None:
        r = self.report
        entries: list[dict[str, Any]] = []
        carry: list[tuple[WalkedFile, bytes | memoryview | None, str]] = []
        for f, job in batch.items:
            if f.kind == "d":
                r.entries += 1
                r.kept_folders += bool(f.kept)
                entries.append(M.FileEntry(f.rel, "d", f.mode, kept=f.kept).to_json())
                continue
            if f.kind == "l":
                r.entries += 1
                r.links += 1
                entries.append(M.FileEntry(f.rel, "l", 0o777, target=f.target).to_json())
                continue
            size, sha, data = f.size, f.sha256, None
            if job is not None:
                got = job.result()
                if got is not None and got.snapshot is not None:
                    f.source, f.snapshot = got.snapshot, True
                if got is None:
                    r.vanished += 1  # gone (or no longer a file) since the walk: not sent
                    continue
                size, sha, data = got.st.st_size, got.sha, got.data
                f.st, f.read_at = got.st, got.t0
                if not f.sha256:  # its SHA-256 was not known from the cache
                    r.hashed_bytes += size
                if data is not None:
                    size = len(data)
                if got.settled:
                    # a file written in the last moments could change again within the
                    # same timestamp tick, unseen by its stat: not remembered (as git does)
                    if not f.snapshot and got.st.st_mtime_ns < time.time_ns() - RACY_NS:
                        self.cache.store(f.rel, got.st, sha)
                else:
                    self._unsettled(f.rel)
            first = f.group_first
            if f.group is not None:
                if f.group in self.groups:
                    size, sha = self.groups[f.group]
                    first = False
                else:
                    self.groups[f.group] = (size, sha)
                    first = True
                    if sha == "" and size > 0:  # its first member vanished: read this one
                        assert f.source is not None
                        got = read_settled(f.source, False, rel=f.rel, st=f.st)
                        if got is None:
                            del self.groups[f.group]
                            r.vanished += 1
                            continue
                        if not got.settled:
                            self._unsettled(f.rel)
                        size, sha = got.st.st_size, got.sha
                        f.st, f.read_at = got.st, got.t0
                        self.groups[f.group] = (size, sha)
            if size == 0:
                sha = M.EMPTY_SHA
            r.entries += 1
            r.files += 1
            r.file_bytes += size
            send = size > 0 and first
            if send:
                digest = bytes.fromhex(sha)
                if digest in self.sent:
                    send = False
                elif digest in self.inv:
                    send = False
                    r.held_by_receiver += 1
                elif self._unchanged(f):
                    send = False
                    r.held_by_receiver += 1
                    r.held_unchanged += 1
            if send:
                if size >= DEDUP_MIN:
                    # remembered only for files worth it, so memory stays bounded by
                    # bytes, not by files: a repeated small file is sent twice
                    self.sent.add(bytes.fromhex(sha))
                carry.append((f, data, sha))
            entries.append(
                M.FileEntry(f.rel, "f", f.mode, size, sha, f.group, send, f.mtime_ns).to_json()
            )
        if not entries:
            return
        self.w.write(M.FILES, M.dump(entries))
        self._data(carry, {e["p"]: e["s"] for e in entries if e.get("d")})

    def _data(
        self, carry: list[tuple[WalkedFile, bytes | memoryview | None, str]], sizes: dict[str, int]
    ) -> None:
        # one reused buffer, filled by readinto: no allocation and one copy fewer a MiB
        buf = bytearray(RECORD_MAX)
        view = memoryview(buf)
        fill = 0

        def put(piece: memoryview | bytes) -> None:
            nonlocal fill
            mv = memoryview(piece)
            while len(mv):
                n = min(RECORD_MAX - fill, len(mv))
                view[fill : fill + n] = mv[:n]
                fill += n
                mv = mv[n:]
                if fill == RECORD_MAX:
                    self._record(view)
                    fill = 0

        for f, data, sha in carry:
            if data is not None:
                put(data)
                continue
            # a big file: read again as it goes; it must still be what was hashed
            size = sizes[f.rel]
            h = hashlib.sha256()
            left = size
            assert f.source is not None
            try:
                if f.snapshot:
                    fd = open_file(f.source)
                    now = os.fstat(fd)
                else:  # never through a link on its way (pinned.py)
                    fd, now = open_walked(f.source, f.rel, f.st)
            except OSError:
                fd = -1
            trusted = False
            if fd >= 0:
                with os.fdopen(fd, "rb", buffering=0) as src:
                    # not hashed again when its stat says it is what was hashed: the same
                    # stat, and a mtime older than that read by more than a timestamp
                    # tick can hide (git's "racily clean" rule; a snapshot is private)
                    trusted = _vouched(f, now)
                    while left > 0:
                        n = src.readinto(view[fill : fill + min(RECORD_MAX - fill, left)])
                        if not n:
                            break
                        if not trusted:
                            h.update(view[fill : fill + n])
                        fill += n
                        left -= n
                        if fill == RECORD_MAX:
                            self._record(view)
                            fill = 0
                    trusted = trusted and same_stat(now, os.fstat(fd))
            if left or (not trusted and h.hexdigest() != sha):
                if self.phase != "bulk":
                    raise StreamError(
                        f"{f.rel} changed while it was being sent",
                        hint="pause what writes it and send again: only what the receiver "
                        "does not hold yet goes",
                    )
                # the bulk goes on: the receiver keeps nothing of it (its bytes do not
                # match), and the final phase, the agent paused, sends it again
                self.report.unsettled.append(f.rel)
                self.sent.discard(bytes.fromhex(sha))
                while left > 0:
                    n = min(RECORD_MAX - fill, left)
                    view[fill : fill + n] = bytes(n)
                    fill += n
                    left -= n
                    if fill == RECORD_MAX:
                        self._record(view)
                        fill = 0
        if fill:
            self._record(view[:fill])

    def _record(self, buf: memoryview) -> None:
        self.w.write(M.DATA, buf)  # the writer takes its own copy
        self.report.data_bytes += len(buf)
        self.progress(len(buf))


def _walked(f: WalkedFile) -> tuple[str, os.stat_result | None]:
    """What :class:`Slot` needs to read ``f`` as the walk found it (none for a snapshot)."""
    return ("", None) if f.snapshot else (f.rel, f.st)


def _vouched(f: WalkedFile, now: os.stat_result) -> bool:
    """Whether a big file's stat alone says it still holds the content it was hashed as."""
    if f.st is None or not same_stat(f.st, now):
        return False
    if f.snapshot:
        return True
    if not f.read_at:  # the hash cache vouched for that stat (it keeps no racy one)
        return True
    return f.st.st_mtime_ns < f.read_at - RACY_NS
