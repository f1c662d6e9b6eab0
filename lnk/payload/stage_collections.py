"""Staging a stream's collections: COLLECTION bodies cut into JSON lines, each
collection spooled to a file and imported into the staged store on a thread of its
own while the stream goes on.  A log sent from where the receiver's copy ends
builds on a copy of the base's store (or the bulk's, for a final phase).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lnk.agents.stores import clone_chats, open_agent_store, store_path
from lnk.collections import CollectionId, FileStore, Store, copy_collection, open_store
from lnk.errors import InvalidInput
from lnk.payload import manifest as M
from lnk.payload.local_index import base_chats
from lnk.payload.receivers import Receiver


class CollectionStaging:
    """The collections half of a ``Stage`` (lnk/payload/staging.py)."""

    r: Receiver
    work: Path
    head: M.Head | None
    store_driver: str | None
    store: Store | None
    line: bytearray
    coll_file: Any
    importer: ThreadPoolExecutor | None
    imports: deque[Future[None]]
    collections: int
    collection_records: int
    mentioned: set[tuple[str, str]]
    coll_cid: CollectionId | None
    coll_fresh: bool
    based: bool

    # ---- collections ----------------------------------------------------
    def _collection_bytes(self, body: bytes) -> None:
        self.line += body
        while (nl := self.line.find(b"\n")) >= 0:
            line = bytes(self.line[:nl])
            del self.line[: nl + 1]
            self._collection_record(M.load_json(line, "collection"), line)
        if len(self.line) > M.MAX_COLLECTION_LINE:
            raise M.bad("a collection record is larger than any collection holds")

    def _collection_record(self, rec: Any, line: bytes) -> None:
        if not isinstance(rec, dict):
            raise M.bad("a collection record is not an object")
        self.collection_records += 1
        if rec.get("t") == "collection":
            if self.coll_file is not None:
                raise M.bad("a collection starts before the previous one ended")
            self.collections += 1
            if self.collections > M.MAX_COLLECTIONS:
                raise M.bad(f"the stream holds more than {M.MAX_COLLECTIONS} collections")
            self.coll_file = open(  # noqa: SIM115
                self.work / f"collection-{self.collections}.jsonl", "w+b"
            )
            try:
                self.coll_cid = CollectionId(str(rec.get("kind")), str(rec.get("name")))
            except InvalidInput as e:
                raise M.bad(f"a collection is invalid: {e.message}") from e
            # a map, or a log sent whole, replaces what the base store holds of it
            self.coll_fresh = self.coll_cid.shape == "map" or rec.get("since", 0) == 0
            self.mentioned.add((self.coll_cid.kind, self.coll_cid.name))
        if self.coll_file is None:
            raise M.bad("a collection record outside a collection")
        self.coll_file.write(line + b"\n")  # as it came: it parsed, it parses again
        if rec.get("t") == "end":
            self._import_collection()

    def _import_collection(self) -> None:
        f = self.coll_file
        self.coll_file = None
        f.seek(0)
        try:
            store = self._open_store()
        except BaseException:
            f.close()
            raise
        if self.importer is None:
            self.importer = ThreadPoolExecutor(1, "lnk-import")
        self.imports.append(
            self.importer.submit(_import, store, f, self.coll_cid if self.coll_fresh else None)
        )
        while len(self.imports) > 2:
            self._wait_import()

    def _wait_import(self) -> None:
        try:
            self.imports.popleft().result()
        except InvalidInput as e:
            raise M.bad(f"a collection is invalid: {e.message}") from e

    def _end_collections(self) -> None:
        if self.line or self.coll_file is not None:
            raise M.bad("the collections ended in the middle of a record")
        while self.imports:
            self._wait_import()
        if self.based and self.store is not None:
            # the agent's state is replaced wholly: what the stream no longer has goes
            for cid in self.store.collections():
                if (cid.kind, cid.name) not in self.mentioned:
                    self.store.drop(cid)

    def _copy_across(self, src: Path, src_driver: str, dst: Path, driver: str) -> None:
        s = open_store(src_driver, store_path(src, src_driver))
        d = open_agent_store(dst, driver)
        try:
            for cid in s.collections():
                copy_collection(s, d, cid)
        finally:
            s.close()
            d.close()

    def _open_store(self) -> Store:
        if self.store is None:
            assert self.head is not None
            driver = self.store_driver or str(self.head.settings.get("store", "files"))
            if driver not in ("files", "sqlite"):
                raise M.bad(f"unknown store driver {driver!r}")
            self.store_driver = driver
            base = self.r.bulk / "agent" / "chats" if self.head.phase == "final" else None
            chats = self.work / "agent" / "chats"
            held = base_chats(self.r) if self.head.phase != "final" else None
            if held is not None:
                # logs the receiver's inventory said it holds come as only what's new:
                # start from a copy of what is held (hard links or SQLite's backup API)
                held_chats, held_driver = held
                if held_driver == driver:
                    clone_chats(held_chats, chats, driver)
                else:  # another driver: copied through the collection interface
                    self._copy_across(held_chats, held_driver, chats, driver)
                self.based = True
            if base is not None and base.exists():
                # the bulk's collections, then the final's since: moved, not copied, so the
                # pause costs what changed, not the history; a failed final spends the bulk
                chats.parent.mkdir(parents=True, exist_ok=True)
                self.r.set_info(bulk_stream=None)
                os.rename(base, chats)
                self.based = True
            if driver == "files":
                # staged, not live: no fsync per event (nothing else staged is fsynced
                # one by one either; commit.decide's journal is the point of no return)
                chats.mkdir(parents=True, exist_ok=True)
                self.store = FileStore(store_path(chats, driver), fsync=False, private=True)
            else:
                self.store = open_agent_store(chats, driver)
        return self.store


def _import(store: Store, f: Any, drop: CollectionId | None) -> None:
    try:
        if drop is not None:
            store.drop(drop)
        store.import_(_lines(f))
    finally:
        f.close()
        os.unlink(f.name)


def _lines(f: Any) -> Iterator[dict[str, Any]]:
    for line in f:
        yield json.loads(line)
