"""A repository that heals: a damaged pack is found, recorded, stored again by the
next backup (or salvaged by repair), and the snapshots whose data is whole again
restore; a lock left by a dead backup does not block prune."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
from pathlib import Path

from bk_helpers import agent_files, collections_of, give_keys, sample_agent
from lnkrun import lnk, ok

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup.agent import backup_agent
from lnk.backup.agent_repos import open_for_listing, open_for_reading
from lnk.backup.agent_restore import restore_agent
from lnk.backup.locks import lock_doc
from lnk.backup.pack import pack_key
from lnk.backup.repository import Repository
from lnk.errors import BackupError
from lnk.transport.buckets import open_bucket

MiB = 1 << 20


def _blob_of(repo: Repository, data: bytes) -> tuple[str, int]:
    """(pack, offset) of the data blob holding exactly ``data``."""
    bid = hmac.new(repo.dedup_key, b"data\0" + data, hashlib.sha256).digest()
    ref = repo.load_index()[bid]
    return ref.pack, ref.offset


def _flip(url: str, pack: str, at: int) -> None:
    b = open_bucket(url)
    body = bytearray(b.get(pack_key(pack)))
    body[at] ^= 0x40
    b.put(pack_key(pack), bytes(body))


def test_a_flipped_byte_is_found_recorded_and_healed_by_the_next_backup(
    src: Machine, dst: Machine, url: str
) -> None:
    a = sample_agent(src, big=3 * MiB)
    first = backup_agent(src, a, url)
    repo = open_for_reading(src, open_bucket(url), url)
    big = (a.folders.home / "big.bin").read_bytes()
    pack, offset = _blob_of(repo, big[MiB : 2 * MiB])
    _flip(url, pack, offset + 100)

    # plain verify lists (sizes match: no download), --read-data finds and records it
    plain = ok("agent", "backup", "verify", "--from", url, "--json").json()
    assert plain["ok"] and plain["packs_read"] == 0
    r = lnk("agent", "backup", "verify", "--from", url, "--read-data", "--json")
    assert r.code == 13 and "lnk: error:" in r.err and "Traceback" not in r.err
    found = json.loads(r.out)
    assert found["damaged"] == [pack] and any("corrupted" in p for p in found["problems"])
    assert pack in repo.damaged_packs()

    # before healing the snapshot cannot restore, and the failed restore leaves nothing
    give_keys(src, dst)
    try:
        restore_agent(dst, "work", url)
        raise AssertionError("a damaged snapshot restored")
    except BackupError as e:
        assert "damaged" in e.message
    assert registry.names(dst) == [] and not dst.folders("work").root.exists()

    # the next backup stores the damaged pack's blobs again
    healed = backup_agent(src, a, url)
    assert healed.new_blobs >= 3
    after = ok("agent", "backup", "verify", "--from", url, "--read-data", "--json").json()
    assert after["ok"] and after["healed"] == [pack], after

    # the newest and the first snapshot (whose data is whole again) both restore
    give_keys(src, dst)
    restore_agent(dst, "work", url)
    b = registry.find(dst, "work")
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert collections_of(b) == collections_of(a)
    other = Machine(dst.home.parent / "third")
    give_keys(src, other)
    out = restore_agent(other, "work", url, snapshot=first.snapshot)
    assert out.snapshot == first.snapshot
    assert agent_files(registry.find(other, "work").folders.root) == agent_files(a.folders.root)


def test_repair_stores_again_what_still_opens(src: Machine, dst: Machine, local_url: str) -> None:
    """A file deleted since (no backup can store it again) survives a flipped byte in
    its pack: repair re-stores every blob that still authenticates."""
    a = sample_agent(src, big=3 * MiB)
    first = backup_agent(src, a, local_url)
    repo = open_for_reading(src, open_bucket(local_url), local_url)
    big = (a.folders.home / "big.bin").read_bytes()
    pack, offset = _blob_of(repo, big[:MiB])
    _flip(local_url, pack, offset + 100)
    (a.folders.home / "run.sh").unlink()

    r = lnk("agent", "backup", "repair", "--from", local_url, "--json")
    assert r.code == 13, r.err  # one blob is lost until the next backup
    rep = json.loads(r.out)
    assert (rep["lost"], rep["damaged"]) == (1, [pack]), rep
    assert rep["salvaged"] >= 1

    backup_agent(src, a, local_url)  # big.bin is still here: its lost chunk is stored again
    assert ok("agent", "backup", "verify", "--from", local_url, "--json").json()["ok"]
    give_keys(src, dst)
    restore_agent(dst, "work", local_url, snapshot=first.snapshot)
    run = dst.folders("work").home / "run.sh"
    assert run.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (dst.folders("work").home / "big.bin").read_bytes() == big


def test_a_missing_pack_is_recorded_and_the_next_backup_succeeds(
    src: Machine, local_url: str
) -> None:
    a = sample_agent(src, big=2 * MiB)
    backup_agent(src, a, local_url)
    b = open_bucket(local_url)
    victim = max(b.list("data/"), key=lambda kv: kv[1])[0]
    b.delete(victim)
    r = lnk("agent", "backup", "verify", "--from", local_url, "--json")
    assert r.code == 13 and any("missing" in p for p in json.loads(r.out)["problems"])
    rep = backup_agent(src, a, local_url)  # not refused for "packs deleted while it ran"
    assert rep.new_blobs >= 2
    assert ok("agent", "backup", "verify", "--from", local_url, "--json").json()["ok"]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_lock_left_by_a_dead_backup_does_not_block_prune(src: Machine, local_url: str) -> None:
    a = sample_agent(src)
    backup_agent(src, a, local_url)
    backup_agent(src, a, local_url)
    b = open_bucket(local_url)
    dead = lock_doc("dead") | {"pid": _dead_pid(), "pstart": ""}
    b.put("locks/dead", json.dumps(dead).encode())
    rep = ok("agent", "backup", "prune", "--from", local_url, "--keep", "last=1", "--json").json()
    assert rep["deferred"] is False and rep["cleared_locks"] == ["locks/dead"]
    assert len(rep["forgotten"]) == 1 and not b.exists("locks/dead")

    # a live backup's lock, or one from another host, still holds packs back
    for name, doc in (
        ("live", lock_doc("live")),  # this test's own process: alive
        ("far", lock_doc("far") | {"host": "elsewhere", "pid": _dead_pid()}),
    ):
        b.put(f"locks/{name}", json.dumps(doc).encode())
        repo = open_for_listing(src, b, local_url)
        from lnk.backup.maintenance import prune

        assert prune(repo, {"last": 1}).deferred is True
        b.delete(f"locks/{name}")


def test_a_reader_uses_a_copy_when_its_pack_fails(src: Machine, tmp_path: Path) -> None:
    """Unit-level: a blob whose listed pack is gone is read from another pack."""
    root = tmp_path / "b"
    root.mkdir()
    url = f"file://{root}"
    a = sample_agent(src, big=MiB + 10)
    first = backup_agent(src, a, url)
    b = open_bucket(url)
    repo = open_for_reading(src, b, url)
    big = (a.folders.home / "big.bin").read_bytes()
    pack, _ = _blob_of(repo, big[:MiB])
    repo.mark_damaged(pack, "is corrupted (test)")
    backup_agent(src, a, url)  # stores the pack's blobs again elsewhere
    b.delete(pack_key(pack))
    dst = Machine(tmp_path / "dst")
    give_keys(src, dst)
    restore_agent(dst, "work", url, snapshot=first.snapshot)
    assert (dst.folders("work").home / "big.bin").read_bytes() == big
