"""Where each blob of a repository lives, in about 62 bytes a blob.

A dict of :class:`BlobRef` costs about 245 bytes a blob (the key, the object,
the dict's slot): 309 MiB for a million files' blobs, the whole of a backup's
or a restore's peak.  :class:`BlobIndex` keeps the same ``Mapping`` shape over
*segments* of fixed-width records sorted by blob ID, each with a fan-out table
on the ID's first two bytes (git's pack index is the model) and the IDs' first
8 bytes as an array of numbers that ``bisect`` searches in C.  What is set
after the build (a run's new blobs, a copy a restore reads instead) goes in a
dict that becomes a segment of its own every :data:`SEGMENT` entries; two
segments of like size are merged up to :data:`MERGE_MAX` records, so a lookup
probes a few and a merge never holds a million records twice.

A record is ``id (32) | damaged (1) | pack number (4) | offset (8) | length (8) |
kind number (1)``, big-endian: sorting whole records puts, for one ID, a copy
in an undamaged pack before one in a damaged pack, and the build keeps the
first.  Blob IDs are HMAC-SHA-256 outputs, evenly spread, so records are
grouped on the first byte while they are collected and each group is sorted on
its own: no list of every record is ever made.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar, overload

ID_LEN = 32
_TAIL = struct.Struct(">BIQQB")  # damaged, pack, offset, length, kind
WIDTH = ID_LEN + _TAIL.size  # 54
FANOUT = 1 << 16
# entries set after the build, held in a dict until a segment is made: the dict costs
# about 245 bytes an entry, so at 65,536 it held 16 MiB (a million-file first backup's
# peak: 198 MiB); at 16,384, 188 MiB and no slower (4,096: no lower)
SEGMENT = 1 << 14
# segments are merged up to this many records: a merge holds both and its result at once
# (14 MiB), never a million records' worth; past it a lookup probes one segment more
# for each MERGE_MAX records set in one run
MERGE_MAX = 1 << 18
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where one blob lives: its pack, offset and stored length."""

    pack: str
    offset: int
    length: int
    kind: str


class _Segment:
    """Records sorted by ID (one per ID), their fan-out and their IDs' first 8 bytes."""

    __slots__ = ("count", "fanout", "heads", "records")

    def __init__(
        self,
        records: bytearray,
        fanout: array[int] | None = None,
        heads: array[int] | None = None,
    ) -> None:
        self.records = records
        self.count = len(records) // WIDTH
        if fanout is not None and heads is not None:  # kept from an earlier build
            self.fanout, self.heads = fanout, heads
            return
        self.fanout = array("Q", bytes(8 * (FANOUT + 1)))
        for at in range(0, len(records), WIDTH):
            self.fanout[((records[at] << 8) | records[at + 1]) + 1] += 1
        for b in range(FANOUT):
            self.fanout[b + 1] += self.fanout[b]
        self.heads = array(
            "Q",
            (int.from_bytes(records[at : at + 8], "big") for at in range(0, len(records), WIDTH)),
        )

    def find(self, blob_id: bytes, bucket: int, head: int) -> int:
        """The record's byte offset, or -1."""
        lo, hi = self.fanout[bucket], self.fanout[bucket + 1]
        if lo == hi:
            return -1
        heads, recs = self.heads, self.records
        i = bisect_left(heads, head, lo, hi)
        while i < hi and heads[i] == head:
            at = i * WIDTH
            if recs[at : at + ID_LEN] == blob_id:
                return at
            i += 1
        return -1

    def group(self, first: int) -> bytearray:
        """The records whose ID starts with the byte ``first``."""
        return self.records[self.fanout[first << 8] * WIDTH : self.fanout[(first + 1) << 8] * WIDTH]


def _sorted_group(data: bytes | bytearray, out: bytearray, at: int) -> int:
    """Write ``data``'s records into ``out`` from byte ``at``, sorted, the first of each ID
    only; where the next write goes."""
    if len(data) == WIDTH:
        out[at : at + WIDTH] = data
        return at + WIDTH
    last = b""
    for rec in sorted(bytes(data[i : i + WIDTH]) for i in range(0, len(data), WIDTH)):
        if rec[:ID_LEN] != last:
            out[at : at + WIDTH] = rec
            at += WIDTH
            last = rec[:ID_LEN]
    return at


class _Names:
    """A table of strings (pack names, kinds) each kept once, by number."""

    def __init__(self, limit: int) -> None:
        self.names: list[str] = []
        self._numbers: dict[str, int] = {}
        self._limit = limit

    def number(self, name: str) -> int:
        n = self._numbers.get(name)
        if n is None:
            if len(self.names) >= self._limit:
                raise ValueError(f"more than {self._limit} names in a blob index")
            n = self._numbers[name] = len(self.names)
            self.names.append(name)
        return n


class IndexBuilder:
    """Collects records in any order; :meth:`build` sorts them into a :class:`BlobIndex`.
    Built to be merged into ``onto`` (:meth:`BlobIndex.merged`), it numbers packs and
    kinds as that one does."""

    def __init__(self, onto: BlobIndex | None = None) -> None:
        self._groups = [bytearray() for _ in range(256)]
        self.packs = _Names(2**32 - 1) if onto is None else onto._packs
        self.kinds = _Names(256) if onto is None else onto._kinds

    def add_pack(
        self, pack: str, blobs: Iterable[tuple[bytes, str, int, int]], damaged: bool
    ) -> None:
        """Every (ID, kind, offset, length) one pack's index lists."""
        p = self.packs.number(pack)
        pack_tail, groups, kind_number = _TAIL.pack, self._groups, self.kinds.number
        bad = 1 if damaged else 0
        for blob_id, kind, offset, length in blobs:
            if len(blob_id) != ID_LEN:
                raise ValueError(f"a blob ID of {len(blob_id)} bytes in pack {pack}")
            g = groups[blob_id[0]]
            g += blob_id
            g += pack_tail(bad, p, offset, length, kind_number(kind))

    def build(self) -> BlobIndex:
        # made at its size at once: grown a record at a time it would hold an eighth more
        out = bytearray(sum(len(g) for g in self._groups))
        at = 0
        for first in range(256):
            group, self._groups[first] = self._groups[first], bytearray()
            at = _sorted_group(group, out, at)
            del group
        del out[at:]  # the copies left out
        return BlobIndex(_Segment(out), self.packs, self.kinds)


@dataclass(frozen=True, slots=True)
class IndexParts:
    """A built index as arrays: its sorted records, fan-out and heads, and the names
    its records number (packs, kinds)."""

    records: bytearray
    fanout: array[int]
    heads: array[int]
    packs: list[str]
    kinds: list[str]


class BlobIndex(Mapping[bytes, BlobRef]):
    """blob ID -> :class:`BlobRef`, compact; what is set later is kept compact too."""

    def __init__(
        self,
        segment: _Segment | None = None,
        packs: _Names | None = None,
        kinds: _Names | None = None,
    ) -> None:
        # newest last; readers (the packer's sealing threads) take the list as it is:
        # it is replaced, never changed in place
        self._segments: list[_Segment] = [segment] if segment is not None else []
        self._packs = packs or _Names(2**32 - 1)
        self._kinds = kinds or _Names(256)
        self._added: dict[bytes, BlobRef] = {}

    @classmethod
    def from_parts(cls, parts: IndexParts) -> BlobIndex:
        """The index :meth:`parts` gave (kept in a file between runs)."""
        if len(parts.records) % WIDTH or len(parts.heads) * WIDTH != len(parts.records):
            raise ValueError("a blob index's records and heads disagree")
        if len(parts.fanout) != FANOUT + 1 or parts.fanout[FANOUT] != len(parts.heads):
            raise ValueError("a blob index's fan-out disagrees with its records")
        packs, kinds = _Names(2**32 - 1), _Names(256)
        for name in parts.packs:
            packs.number(name)
        for name in parts.kinds:
            kinds.number(name)
        if len(packs.names) != len(parts.packs) or len(kinds.names) != len(parts.kinds):
            raise ValueError("a blob index names a pack or a kind twice")
        seg = _Segment(parts.records, parts.fanout, parts.heads) if parts.heads else None
        return cls(seg, packs, kinds)

    def parts(self) -> IndexParts:
        """What :meth:`from_parts` makes this index from again: one segment, nothing set
        since (an index as :meth:`IndexBuilder.build` or :meth:`merged` gave it)."""
        if len(self._segments) > 1 or self._added:
            raise ValueError("only a built index is kept whole")
        if not self._segments:
            empty = array("Q", bytes(8 * (FANOUT + 1)))
            return IndexParts(bytearray(), empty, array("Q"), self._packs.names, self._kinds.names)
        seg = self._segments[0]
        return IndexParts(seg.records, seg.fanout, seg.heads, self._packs.names, self._kinds.names)

    def merged(self, newer: BlobIndex) -> BlobIndex:
        """One index of this one and ``newer`` (built by ``IndexBuilder(onto=self)``);
        where both hold a blob, ``newer``'s record."""
        if newer._packs is not self._packs or newer._kinds is not self._kinds:
            raise ValueError("an index merged into another must be built onto it")
        if not newer._segments:
            return self
        if not self._segments:
            return newer
        if len(self._segments) > 1 or len(newer._segments) > 1 or self._added or newer._added:
            raise ValueError("only built indexes are merged")
        seg = _merge(self._segments[0], newer._segments[0])
        return BlobIndex(seg, self._packs, self._kinds)

    def whole(self, limit: int) -> BlobIndex | None:
        """This index as one segment (what :meth:`parts` takes), everything set since
        the build included; None past ``limit`` records (a merge holds them twice)."""
        if self.compact_count + len(self._added) > limit:
            return None
        self.compact()
        segments = self._segments
        if not segments:
            return BlobIndex(None, self._packs, self._kinds)
        seg = segments[0]
        for newer in segments[1:]:
            seg = _merge(seg, newer)
        return BlobIndex(seg, self._packs, self._kinds)

    @property
    def compact_count(self) -> int:
        """How many records the segments hold (an ID set again counts twice)."""
        return sum(s.count for s in self._segments)

    def _find(self, blob_id: bytes) -> tuple[_Segment, int] | None:
        if len(blob_id) != ID_LEN:
            return None
        bucket = (blob_id[0] << 8) | blob_id[1]
        head = int.from_bytes(blob_id[:8], "big")
        for seg in reversed(self._segments):  # the newest word first
            at = seg.find(blob_id, bucket, head)
            if at >= 0:
                return seg, at
        return None

    def _ref(self, seg: _Segment, at: int) -> BlobRef:
        _bad, p, offset, length, k = _TAIL.unpack_from(seg.records, at + ID_LEN)
        return BlobRef(self._packs.names[p], offset, length, self._kinds.names[k])

    def __getitem__(self, blob_id: bytes) -> BlobRef:
        ref = self.get(blob_id)
        if ref is None:
            raise KeyError(blob_id)
        return ref

    def __contains__(self, blob_id: object) -> bool:
        if not isinstance(blob_id, bytes):
            return False
        return blob_id in self._added or self._find(blob_id) is not None

    @overload
    def get(self, blob_id: bytes, /) -> BlobRef | None: ...
    @overload
    def get(self, blob_id: bytes, default: BlobRef, /) -> BlobRef: ...
    @overload
    def get(self, blob_id: bytes, default: _T, /) -> BlobRef | _T: ...
    def get(self, blob_id: bytes, default: object = None, /) -> object:
        ref = self._added.get(blob_id)
        if ref is not None:
            return ref
        found = self._find(blob_id)
        return default if found is None else self._ref(*found)

    def packs_of(self, ids: bytes | bytearray) -> tuple[set[str], list[bytes]]:
        """The packs holding the blobs ``ids`` (32-byte IDs end to end) and the IDs held
        nowhere: :meth:`get`'s answer for many blobs at once, without a :class:`BlobRef`
        each (an unchanged backup asks it for every blob of every folder it keeps)."""
        names: set[str] = set()
        numbers: set[int] = set()
        missing: list[bytes] = []
        added = self._added
        from_bytes = int.from_bytes
        for at in range(0, len(ids), ID_LEN):
            blob_id = bytes(ids[at : at + ID_LEN])
            if added:
                ref = added.get(blob_id)
                if ref is not None:
                    names.add(ref.pack)
                    continue
            found = self._find(blob_id)  # None for a short tail too
            if found is None:
                missing.append(blob_id)
                continue
            seg, rec = found
            rec += ID_LEN + 1  # the pack's number, after the damaged flag
            numbers.add(from_bytes(seg.records[rec : rec + 4], "big"))
        table = self._packs.names
        names.update(table[n] for n in numbers)
        return names, missing

    def __setitem__(self, blob_id: bytes, ref: BlobRef) -> None:
        """A blob stored by this run, or a copy found to read instead."""
        if len(blob_id) != ID_LEN:
            raise ValueError(f"a blob ID of {len(blob_id)} bytes")
        self._added[blob_id] = ref
        if len(self._added) >= SEGMENT:
            self.compact()

    def compact(self) -> None:
        """Make what was set since into a segment, merging segments of like size."""
        if not self._added:
            return
        recs = bytearray()
        for blob_id in sorted(self._added):
            r = self._added[blob_id]
            p, k = self._packs.number(r.pack), self._kinds.number(r.kind)
            recs += blob_id + _TAIL.pack(0, p, r.offset, r.length, k)
        segments = [*self._segments, _Segment(recs)]
        while (
            len(segments) >= 2
            and segments[-1].count * 2 >= segments[-2].count
            and segments[-1].count + segments[-2].count <= MERGE_MAX
        ):
            newer = segments.pop()
            segments[-1] = _merge(segments[-1], newer)
        self._segments = segments  # first, so a reader finds each entry in one or the other
        self._added = {}

    def __iter__(self) -> Iterator[bytes]:
        seen = set(self._added)
        yield from self._added
        for seg in reversed(self._segments):
            recs = seg.records
            for at in range(0, len(recs), WIDTH):
                blob_id = bytes(recs[at : at + ID_LEN])
                if blob_id not in seen and (len(self._segments) == 1 or self._last(blob_id, seg)):
                    yield blob_id

    def _last(self, blob_id: bytes, seg: _Segment) -> bool:
        """Whether ``seg`` is the newest segment holding ``blob_id``."""
        found = self._find(blob_id)
        return found is not None and found[0] is seg

    def __len__(self) -> int:
        if len(self._segments) <= 1:
            return self.compact_count + sum(1 for k in self._added if self._find(k) is None)
        return sum(1 for _ in self)


def _merge(older: _Segment, newer: _Segment) -> _Segment:
    """One segment of both; where both hold an ID, the newer's record."""
    out = bytearray(len(older.records) + len(newer.records))
    at = 0
    for first in range(256):
        a, b = older.group(first), newer.group(first)
        if not a or not b:
            part = a or b
            out[at : at + len(part)] = part
            at += len(part)
            continue
        ids = {bytes(b[i : i + ID_LEN]) for i in range(0, len(b), WIDTH)}
        keep = bytearray(b)
        for i in range(0, len(a), WIDTH):
            if bytes(a[i : i + ID_LEN]) not in ids:
                keep += a[i : i + WIDTH]
        at = _sorted_group(keep, out, at)
    del out[at:]
    return _Segment(out)
