"""The plain-files driver.

    <root>/events/<enc name>/.name                 the collection's name (marks it as existing)
    <root>/events/<enc name>/000000000001.json     one file per event, published with link(2)
    <root>/events/<enc name>/turn.json             the turn lease (+ .turn.lock for flock)
    <root>/<notes|jobs|tools>/<enc name>/.name     ditto
    <root>/<notes|jobs|tools>/<enc name>/<enc key>.json   {"key": ..., "value": {...}}
    <root>/<notes|jobs|tools>/<enc name>/.version  the change counter (the watermark)
    <root>/<notes|jobs|tools>/<enc name>/.lock     writers of the map hold it (flock)
    <root>/.staging/                               imports being assembled

Names and keys are percent-encoded (everything but ``A-Za-z0-9_-``), or, when
that would be long, ``~`` and their SHA-256; the real name is kept inside.
How names are encoded and files written atomically is ``fileio.py``.

An event is written to a temporary file and then hard-linked to its numbered
name: link(2) fails if the name exists, so exactly one of any number of racing
writers (threads or processes) wins, and a reader never sees half an event.  An
event is written only if its predecessor exists, so numbers stay dense and the
last number is found by galloping and bisecting (O(log n) stat calls).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lnk.collections.base import (
    DEFAULT_LAPSE_MS,
    KINDS,
    CollectionId,
    Event,
    Lease,
    Store,
    check_name,
    decode_value,
    encode_value,
    resolve_now,
)
from lnk.collections.fileio import (
    AtomicWrites,
    decode_name,
    encode_name,
    event_file,
    locked,
    open_folder,
    read_below,
    read_in,
    shown,
)
from lnk.errors import InvalidInput


class FileStore(Store):
    """Collections as plain files under ``root``."""

    def __init__(
        self,
        root: Path,
        lapse_ms: int = DEFAULT_LAPSE_MS,
        fsync: bool = True,
        private: bool = False,
    ) -> None:
        """``private``: one writer and no reader until it is done (a stream's staging), so
        an event is created in place, not written aside and linked: a third of the calls."""
        super().__init__(lapse_ms)
        self.root = Path(root)
        self.fsync = fsync
        self.private = private
        self._disk = AtomicWrites(fsync, private)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    # ---- plumbing -----------------------------------------------------------
    def _dir(self, cid: CollectionId) -> Path:
        return self.root / cid.kind / encode_name(cid.name)

    def _ensure(self, cid: CollectionId) -> Path:
        d = self._dir(cid)
        if not (d / ".name").exists():
            d.mkdir(parents=True, exist_ok=True)
            self._disk.replace(d / ".name", cid.name.encode())
        return d

    def drop(self, cid: CollectionId) -> None:
        d = self._dir(cid)
        if d.exists():
            shutil.rmtree(d)

    def _touch(self, cid: CollectionId) -> None:
        self._ensure(cid)

    # ---- logs -------------------------------------------------------------
    def _append_encoded(self, cid: CollectionId, first: int, texts: list[str]) -> int:
        d = self._dir(cid)
        if not texts or (first > 1 and not (d / event_file(first - 1)).exists()):
            return 0  # nothing, or a gap
        if (d / event_file(first)).exists():
            return 0  # taken
        self._ensure(cid)
        for i, text in enumerate(texts):
            if not self._disk.publish(d / event_file(first + i), text.encode()):
                return i
        return len(texts)

    def iter_events(
        self, cid: CollectionId, start: int = 1, stop: int | None = None
    ) -> Iterator[Event]:
        self._log(cid)
        start, stop = self._range(start, stop)
        # read through its folders, never a link (the agent writes them: lnk's reads
        # outside its sandbox, a move's or a backup's, must not carry what a link names)
        dfd = open_folder(self.root, cid.kind, encode_name(cid.name))
        if dfd is None:
            return
        try:
            folder = f"{cid.kind}/{encode_name(cid.name)}"  # (named in a refusal)
            n = start
            while stop is None or n < stop:
                name = event_file(n)
                data = read_in(dfd, name, folder)
                if data is None:
                    return
                yield Event(n, _value(data, folder, name))
                n += 1
        finally:
            os.close(dfd)

    def last_number(self, cid: CollectionId) -> int:
        self._log(cid)
        d = self._dir(cid)

        def has(n: int) -> bool:
            return (d / event_file(n)).exists()

        lo, step = 0, 1  # invariant: every number <= lo exists (numbers are dense)
        while has(lo + step):
            lo += step
            step *= 2
        hi = lo + step  # does not exist
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if has(mid):
                lo = mid
            else:
                hi = mid
        return lo

    # ---- maps -------------------------------------------------------------
    def _entry(self, d: Path, key: str) -> Path:
        return d / (encode_name(key) + ".json")

    def _bump(self, d: Path) -> None:
        """Count a change (under the map's lock); the caller syncs the directory."""
        tmp = d / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(str(self._version(d) + 1).encode())
        os.replace(tmp, d / ".version")

    def _version(self, d: Path) -> int:
        parts = (*d.relative_to(self.root).parts, ".version")
        data = read_below(self.root, *parts)
        if data is None:
            return 0
        if not data.isdigit() or len(data) > 18:  # (int() takes 4,300 digits at most)
            raise _not_ours("/".join(parts), "not a version number")
        return int(data)

    def put(self, cid: CollectionId, key: str, value: dict[str, Any]) -> None:
        self._map(cid)
        check_name("map key", key)
        text = encode_value(f"the value of {key!r}", value)
        d = self._ensure(cid)
        data = json.dumps(
            {"key": key, "value": json.loads(text)}, ensure_ascii=True, separators=(",", ":")
        ).encode()
        with locked(d / ".lock"):
            self._disk.replace(self._entry(d, key), data, sync_dir=False)
            self._bump(d)
            self._disk.sync_dir(d)

    def _read_entry(self, path: Path) -> tuple[str, dict[str, Any]] | None:
        parts = path.relative_to(self.root).parts
        return _entry_of(read_below(self.root, *parts), "/".join(parts[:-1]), parts[-1])

    def get(self, cid: CollectionId, key: str) -> dict[str, Any] | None:
        self._map(cid)
        check_name("map key", key)
        got = self._read_entry(self._entry(self._dir(cid), key))
        return None if got is None else got[1]

    def delete(self, cid: CollectionId, key: str) -> bool:
        self._map(cid)
        check_name("map key", key)
        d = self._dir(cid)
        if not d.is_dir():
            return False
        with locked(d / ".lock"):
            try:
                os.unlink(self._entry(d, key))
            except FileNotFoundError:
                return False
            self._bump(d)
            self._disk.sync_dir(d)
        return True

    def items(self, cid: CollectionId) -> Iterator[tuple[str, dict[str, Any]]]:
        self._map(cid)
        folder = f"{cid.kind}/{encode_name(cid.name)}"  # (named in a refusal)
        dfd = open_folder(self.root, cid.kind, encode_name(cid.name))
        if dfd is None:
            return
        try:
            names = [
                e.name
                for e in os.scandir(dfd)
                if e.name.endswith(".json") and not e.name.startswith(".")
            ]
            keyed: list[tuple[str, str]] = []
            for fname in names:
                key = decode_name(fname[:-5])
                if key is None:
                    got = _entry_of(read_in(dfd, fname, folder), folder, fname)
                    if got is None:
                        continue
                    key = got[0]
                keyed.append((key, fname))
            keyed.sort()
            for _key, fname in keyed:
                got = _entry_of(read_in(dfd, fname, folder), folder, fname)
                if got is not None:
                    yield got
        finally:
            os.close(dfd)

    def _replace_map(self, cid: CollectionId, entries: Iterable[tuple[str, str]]) -> None:
        self._map(cid)
        staging = self.root / ".staging" / uuid.uuid4().hex
        staging.mkdir(parents=True)
        try:
            staged: set[str] = set()
            for key, text in entries:
                fname = encode_name(key) + ".json"
                data = '{"key":' + json.dumps(key, ensure_ascii=True) + ',"value":' + text + "}"
                os.replace(self._disk.write_aside(staging, data.encode()), staging / fname)
                staged.add(fname)
            d = self._ensure(cid)
            with locked(d / ".lock"):
                for fname in staged:
                    os.replace(staging / fname, d / fname)
                for e in os.scandir(d):
                    if (
                        e.name.endswith(".json")
                        and not e.name.startswith(".")
                        and e.name not in staged
                    ):
                        os.unlink(e.path)
                self._bump(d)
                self._disk.sync_dir(d)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # ---- both -------------------------------------------------------------
    def collections(self) -> list[CollectionId]:
        found: list[CollectionId] = []
        for kind in KINDS:
            dfd = open_folder(self.root, kind)
            if dfd is None:
                continue
            try:
                entries = list(os.scandir(dfd))
                for e in entries:
                    if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
                        continue
                    data = read_below(self.root, kind, e.name, ".name")
                    if data is None:
                        continue  # only a lease so far (or a link: never followed)
                    try:
                        name = data.decode()
                    except UnicodeDecodeError:
                        raise _not_ours(f"{kind}/{e.name}/.name", "not UTF-8") from None
                    found.append(CollectionId(kind, name))
            finally:
                os.close(dfd)
        return sorted(found)

    def watermark(self, cid: CollectionId) -> int:
        if cid.shape == "log":
            return self.last_number(cid)
        return self._version(self._dir(cid))

    # ---- the turn lease ---------------------------------------------------
    def _lease_path(self, cid: CollectionId) -> Path:
        return self._dir(self._log(cid)) / "turn.json"

    def read_lease(self, cid: CollectionId) -> Lease | None:
        path = self._lease_path(cid)
        raw = read_below(self.root, *path.relative_to(self.root).parts)
        if raw is None:
            return None
        try:
            return Lease.from_json(json.loads(raw))
        except (ValueError, InvalidInput):
            raise InvalidInput(
                f"the turn lease {path} is malformed",
                hint="delete it; the turn will be taken again",
            ) from None

    def _lease_op(self, cid: CollectionId) -> contextlib.AbstractContextManager[None]:
        d = self._dir(self._log(cid))
        d.mkdir(parents=True, exist_ok=True)
        return locked(d / ".turn.lock")

    def _write_lease(self, cid: CollectionId, lease: Lease) -> None:
        self._disk.replace(self._lease_path(cid), json.dumps(lease.to_json()).encode())

    def take_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> Lease | None:
        check_name("lease holder", holder)
        now = resolve_now(now_ms)
        with self._lease_op(cid):
            new = self._decide_take(self.read_lease(cid), holder, now)
            if new is not None:
                self._write_lease(cid, new)
            return new

    def renew_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> bool:
        check_name("lease holder", holder)
        now = resolve_now(now_ms)
        with self._lease_op(cid):
            cur = self.read_lease(cid)
            if cur is None or cur.holder != holder:
                return False
            self._write_lease(
                cid, Lease(holder, cur.taken_ms, now, cur.took_over, cur.previous_holder)
            )
            return True

    def release_lease(self, cid: CollectionId, holder: str) -> bool:
        check_name("lease holder", holder)
        with self._lease_op(cid):
            cur = self.read_lease(cid)
            if cur is None or cur.holder != holder:
                return False
            os.unlink(self._lease_path(cid))
            self._disk.sync_dir(self._lease_path(cid).parent)
            return True


def _entry_of(data: bytes | None, folder: str, name: str) -> tuple[str, dict[str, Any]] | None:
    """A map entry's file as read (None: none there), ``name`` in the store's ``folder``:
    its key and value (parsed once: the value is the object in it)."""
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except ValueError as e:  # not JSON, or not UTF-8
        raise _not_ours(shown(folder, name), f"not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("key"), str) or "value" not in obj:
        raise _not_ours(shown(folder, name), "not an entry (its key and value)")
    if not isinstance(obj["value"], dict):
        raise InvalidInput(
            f"the store's file {shown(folder, name)}: a stored value is not a JSON object"
        )
    return obj["key"], obj["value"]


def _value(data: bytes, folder: str, name: str) -> dict[str, Any]:
    try:
        return decode_value(data)
    except InvalidInput as e:
        raise InvalidInput(f"the store's file {shown(folder, name)}: {e.message}") from None


def _not_ours(path: str, why: str) -> InvalidInput:
    """A file of the store that lnk did not write so (the agent writes the folder)."""
    return InvalidInput(f"the store's file {path} is {why}")
