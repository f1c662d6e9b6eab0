"""Make an agent with a deterministic generated state, for benches (not a test).

    python bench/gen_agent.py HOME [--size 2] [--files N] [--name bench] [--store files]

Library use (other benches import it):

    from gen_agent import generate
    stats = generate(Path(home), size=2 << 30)            # mixed state of about 2 GiB
    stats = generate(Path(home), files=1_000_000)          # a million small files

The mixed state is, by default, 75% incompressible files of mixed sizes (a few
KiB to tens of MiB, log-uniform) under ``Home/data/``, and 25% JSON-like
conversations: half as ``.jsonl`` files under ``Home/notes/``, half as events
in the agent's collections (one log per conversation, through ``append_many``).
The same seed and size always give the same bytes, names and mtimes.
Incompressible bytes are an AES-CTR keystream (fast and deterministic).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.stores import store_path
from lnk.collections import CollectionId, FileStore, Store, open_store

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10
MTIME_NS = 1_700_000_000 * 10**9  # every generated file gets this mtime (+ its index in ms)
CHUNK = 4 * MIB
MIN_FILE, MAX_FILE = 4 * KIB, 48 * MIB
EVENT_BATCH = 256


@dataclass
class GenStats:
    home: str
    agent: str
    agent_id: str
    store: str
    files: int = 0  # regular files written under Home/
    random_bytes: int = 0  # incompressible file bytes
    json_file_bytes: int = 0  # JSON-like file bytes
    conversations: int = 0
    events: int = 0
    event_bytes: int = 0  # events as JSON text
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return self.random_bytes + self.json_file_bytes + self.event_bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"total_bytes": self.total_bytes}


# ---- content ----------------------------------------------------------------
class RandomBytes:
    """A deterministic incompressible byte source (AES-256-CTR of zeros)."""

    def __init__(self, seed: int, label: str) -> None:
        key = (f"{seed}:{label}".encode() * 32)[:32]
        self._enc = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
        self._zeros = bytes(CHUNK)

    def take(self, n: int) -> bytes:
        return self._enc.update(self._zeros[:n])


class Chatter:
    """JSON-like conversation text from a fixed vocabulary."""

    ROLES = ("user", "assistant", "tool")

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        rnd = self.rnd
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = ["".join(rnd.choices(letters, k=rnd.randrange(2, 11))) for _ in range(4000)]
        self.tools = ["read_file", "write_file", "search", "shell", "fetch", "edit"]

    def text(self, nbytes: int) -> str:
        rnd = self.rnd
        out: list[str] = []
        size = 0
        while size < nbytes:
            w = rnd.choices(self.words, k=12)
            piece = " ".join(w) + rnd.choice((". ", ", ", "? ", ".\n"))
            out.append(piece)
            size += len(piece)
        return "".join(out)

    def event(self, conv: int, n: int) -> dict[str, Any]:
        rnd = self.rnd
        role = self.ROLES[n % 3]
        # message sizes: mostly short, some long (a tool's output)
        size = int(math.exp(rnd.uniform(math.log(200), math.log(40 * KIB))))
        ev: dict[str, Any] = {
            "role": role,
            "ts": 1_700_000_000_000 + conv * 10**7 + n * 1000,
            "id": f"m{conv:05d}-{n:07d}",
            "text": self.text(size),
        }
        if role == "assistant" and rnd.random() < 0.4:
            ev["tool_calls"] = [
                {
                    "name": rnd.choice(self.tools),
                    "args": {
                        "path": "/".join(rnd.choices(self.words, k=3)),
                        "limit": rnd.randrange(1, 1000),
                    },
                }
            ]
        if role == "tool":
            ev["tool"] = rnd.choice(self.tools)
            ev["ok"] = rnd.random() < 0.9
        return ev


# ---- writing -----------------------------------------------------------------
def _write(path: Path, chunks: Any, index: int) -> int:
    n = 0
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
            n += len(c)
    t = MTIME_NS + index * 10**6
    os.utime(path, ns=(t, t))
    return n


def _random_file(path: Path, size: int, src: RandomBytes, index: int) -> int:
    def chunks() -> Any:
        left = size
        while left:
            n = min(left, CHUNK)
            yield src.take(n)
            left -= n

    return _write(path, chunks(), index)


def _sizes(rnd: random.Random, budget: int) -> list[int]:
    """Log-uniform sizes between MIN_FILE and MAX_FILE that add up to ``budget``."""
    sizes: list[int] = []
    left = budget
    lo, hi = math.log(MIN_FILE), math.log(MAX_FILE)
    while left > 0:
        s = int(math.exp(rnd.uniform(lo, hi)))
        s = min(s, left)
        sizes.append(s)
        left -= s
    return sizes


def _open_fast_store(chats: Path, driver: str) -> Store:
    """The agent's store, without an fsync per event (the generator only fills it)."""
    chats.mkdir(parents=True, exist_ok=True)
    if driver == "files":
        return FileStore(store_path(chats, driver), fsync=False)
    return open_store(driver, store_path(chats, driver))


def _events(store: Store, chatter: Chatter, budget: int, stats: GenStats) -> None:
    conv = 0
    per_conv = max(budget // 64, 256 * KIB)  # about 64 conversations
    while stats.event_bytes < budget:
        cid = CollectionId("events", f"link:conv-{conv:04d}")
        n, conv_bytes = 1, 0
        batch: list[dict[str, Any]] = []
        while conv_bytes < per_conv and stats.event_bytes + conv_bytes < budget:
            ev = chatter.event(conv, n + len(batch))
            batch.append(ev)
            conv_bytes += len(json.dumps(ev, separators=(",", ":"), ensure_ascii=False))
            if len(batch) >= EVENT_BATCH:
                n += store.append_many(cid, n, batch)
                batch = []
        if batch:
            n += store.append_many(cid, n, batch)
        stats.events += n - 1
        stats.event_bytes += conv_bytes
        stats.conversations += 1
        notes = CollectionId("notes", f"link:conv-{conv:04d}")
        store.put(notes, "summary", {"text": chatter.text(300), "events": n - 1})
        conv += 1


def generate(
    home: Path,
    size: int = 2 * GIB,
    *,
    files: int | None = None,
    name: str = "bench",
    store: str = "files",
    seed: int = 1,
    json_share: float = 0.25,
) -> GenStats:
    """Create agent ``name`` on the machine at ``home`` and fill it; returns what was made.

    ``files`` switches to small-files mode: that many source-like files of 100 B -
    16 KiB (half text, half incompressible) in folders of 100, three deep, plus a
    little chat.
    """
    t0 = time.perf_counter()
    machine = Machine(home)
    agent = registry.create(machine, name, store=store)
    stats = GenStats(str(home), name, agent.id, store)
    root = agent.folders.home
    rnd = random.Random(seed)
    chatter = Chatter(seed)
    rb = RandomBytes(seed, "files")
    if files is not None:
        _small_files(root, files, rnd, chatter, rb, stats)
        json_budget = 4 * MIB
    else:
        json_budget = int(size * json_share)
        data = root / "data"
        for i, s in enumerate(_sizes(rnd, size - json_budget)):
            d = data / f"d{i // 50:03d}"
            d.mkdir(parents=True, exist_ok=True)
            stats.random_bytes += _random_file(d / f"blob-{i:05d}.bin", s, rb, i)
            stats.files += 1
        notes = root / "notes"
        notes.mkdir(parents=True, exist_ok=True)
        file_budget = json_budget // 2
        i = 0
        while stats.json_file_bytes < file_budget:
            want = min(
                file_budget - stats.json_file_bytes,
                int(math.exp(rnd.uniform(math.log(8 * KIB), math.log(16 * MIB)))),
            )
            stats.json_file_bytes += _write(
                notes / f"conv-{i:05d}.jsonl", _jsonl(chatter, i, want), 10**6 + i
            )
            stats.files += 1
            i += 1
        json_budget -= stats.json_file_bytes
    st = _open_fast_store(agent.folders.chats, store)
    try:
        _events(st, chatter, json_budget, stats)
    finally:
        st.close()
    (agent.folders.agent / "instructions" / "AGENTS.md").write_text(chatter.text(2000))
    stats.seconds = time.perf_counter() - t0
    return stats


def _jsonl(chatter: Chatter, conv: int, want: int) -> Any:
    size, n, buf = 0, 1, bytearray()
    while size < want:
        line = json.dumps(chatter.event(conv, n), separators=(",", ":")).encode() + b"\n"
        line = line[: want - size] if size + len(line) > want else line
        buf += line
        size += len(line)
        n += 1
        if len(buf) >= MIB:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _small_files(
    root: Path, count: int, rnd: random.Random, chatter: Chatter, rb: RandomBytes, stats: GenStats
) -> None:
    words = chatter.text(64 * KIB).encode()
    for i in range(count):
        # source-like: 100 B - 16 KiB, 100 files a folder, three folders deep
        d = (
            root
            / "many"
            / f"g{i // 1_000_000:02d}"
            / f"d{(i // 10_000) % 100:02d}"
            / f"s{(i // 100) % 100:02d}"
        )
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        size = rnd.randrange(100, 16 * KIB)
        if i % 2:
            off = rnd.randrange(0, len(words) - size)
            body = f"{i}\n".encode() + words[off : off + size]
            stats.json_file_bytes += _write(d / f"f{i:07d}.txt", [body], i)
        else:
            stats.random_bytes += _write(d / f"f{i:07d}.bin", [rb.take(size)], i)
        stats.files += 1


def tree_bytes(root: Path) -> tuple[int, int]:
    """(files, bytes) of the regular files under ``root``, links not followed."""
    n = total = 0
    for dirpath, _dirs, names in os.walk(root):
        for nm in names:
            st = os.lstat(os.path.join(dirpath, nm))
            n += 1
            total += st.st_size
    return n, total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("home", type=Path, help="the machine's HOME (made if missing)")
    p.add_argument("--size", type=float, default=2.0, help="GiB of state (default 2)")
    p.add_argument("--files", type=int, help="small-files mode: this many files")
    p.add_argument("--name", default="bench")
    p.add_argument("--store", choices=["files", "sqlite"], default="files")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    a.home.mkdir(parents=True, exist_ok=True)
    stats = generate(
        a.home, int(a.size * GIB), files=a.files, name=a.name, store=a.store, seed=a.seed
    )
    json.dump(stats.to_json(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
