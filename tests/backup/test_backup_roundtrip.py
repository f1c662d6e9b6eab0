"""Backup -> restore on another machine, over every backend; incremental, interrupted,
verify and prune."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bk_helpers import (
    GRANTS,
    Recording,
    agent_files,
    collections_of,
    give_keys,
    link_groups,
    sample_agent,
    write,
)
from lnkrun import lnk, ok

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup.agent import backup_agent
from lnk.backup.agent_repos import open_for_listing
from lnk.backup.agent_restore import restore_agent
from lnk.transport.buckets import open_bucket


def test_backup_restore_reproduces_the_agent(src: Machine, dst: Machine, url: str) -> None:
    a = sample_agent(src)
    rep = backup_agent(src, a, url)
    assert rep.labelled and rep.label_problem is None
    assert rep.files == 6 and rep.collections == 2
    give_keys(src, dst)
    out = restore_agent(dst, "work", url)
    assert out.layout == 2 and out.snapshot == rep.snapshot and out.dropped_grants == []
    b = registry.find(dst, "work")
    assert (b.id, b.settings.owner, b.settings.lapse_s) == (a.id, a.settings.owner, 45)
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert link_groups(b.folders.root) == {
        frozenset({"Home/docs/report.txt", "Home/report-link.txt"})
    }
    assert collections_of(b) == collections_of(a)
    assert tomllib.loads(b.folders.sandbox_toml.read_text()) == tomllib.loads(GRANTS)
    # the restored agent starts and answers with its ID
    env = {"HOME": str(dst.home)}
    try:
        ok("agent", "start", "--agent", "work", "--no-sandbox", env=env)
        st = ok("agent", "status", "--agent", "work", "--json", env=env).json()
        assert st["id"] == a.id and st["state"] == "running", st
    finally:
        lnk("agent", "stop", "--agent", "work", env=env)


def test_incremental_backup_uploads_only_new_chunks(src: Machine, url: str) -> None:
    a = sample_agent(src, big=3 << 20)
    first = Recording(open_bucket(url))
    backup_agent(src, a, url, bucket=first)
    assert first.put_bytes > 3 << 20
    write(a.folders.home / "new.txt", b"x" * 10_000)
    second = Recording(open_bucket(url))
    rep = backup_agent(src, a, url, bucket=second)
    assert rep.files == 8
    data_puts = [k for k in second.puts if k.startswith("data/")]
    assert len(data_puts) == 1  # one small pack: the new file, the changed lists
    assert second.put_bytes < 200_000, second.put_bytes
    assert rep.new_blobs <= 6


def test_interrupted_backup_leaves_no_snapshot_and_resumes(
    src: Machine, dst: Machine, url: str
) -> None:
    a = sample_agent(src, big=10 << 20)
    dying = Recording(open_bucket(url), fail_after=4)  # config, lock, a pack and its index
    with pytest.raises(KeyboardInterrupt):
        backup_agent(src, a, url, bucket=dying)
    repo = open_for_listing(src, open_bucket(url), url)
    assert repo.list_snapshots() == []
    assert any(k.startswith("data/") for k, _ in open_bucket(url).list("data/"))
    again = Recording(open_bucket(url))
    backup_agent(src, a, url, bucket=again)
    assert dying.put_bytes > 4 << 20
    # the pack the killed run uploaded is reused: nothing is uploaded twice
    assert again.put_bytes + dying.put_bytes < (10 << 20) + (256 << 10)
    assert len(repo.list_snapshots()) == 1
    give_keys(src, dst)
    restore_agent(dst, "work", url)
    assert agent_files(registry.find(dst, "work").folders.root) == agent_files(a.folders.root)


def test_verify_finds_a_missing_or_corrupted_pack(src: Machine, url: str) -> None:
    a = sample_agent(src)
    backup_agent(src, a, url)
    r = ok("agent", "backup", "verify", "--from", url, "--read-data", "--json")
    assert r.json()["ok"] is True
    b = open_bucket(url)
    packs = [k for k, _ in b.list("data/")]
    assert len(packs) == 1
    body = bytearray(b.get(packs[0]))
    body[-5] ^= 0xFF
    b.put(packs[0], bytes(body))
    assert lnk("agent", "backup", "verify", "--from", url, "--json").code == 0  # sizes agree
    r = lnk("agent", "backup", "verify", "--from", url, "--read-data", "--json")
    assert r.code == 13 and "corrupted" in " ".join(r.json()["problems"])
    b.delete(packs[0])
    r = lnk("agent", "backup", "verify", "--from", url, "--json")
    assert r.code == 13 and "missing" in " ".join(r.json()["problems"])


def test_prune_keeps_what_the_policy_says(src: Machine, url: str) -> None:
    a = sample_agent(src)
    day = datetime(2025, 3, 10, 12, tzinfo=UTC)
    times = [
        day,
        day + timedelta(hours=2),
        day + timedelta(days=1),
        day + timedelta(days=2),
        day + timedelta(days=2, hours=1),
    ]
    ids = [backup_agent(src, a, url, time=t).snapshot for t in times]
    r = ok("agent", "backup", "prune", "--from", url, "--keep", "daily=2", "--json").json()
    assert set(r["kept"]) == {ids[2], ids[4]}
    assert set(r["forgotten"]) == {ids[0], ids[1], ids[3]}
    listed = ok("agent", "backup", "list", "--from", url, "--json").json()
    assert [x["id"] for x in listed] == [ids[2], ids[4]]
    assert listed[0]["agent"] == "work" and listed[0]["files"] == 6


def test_cli_backup_and_restore_refuses_to_overwrite(
    src: Machine, dst: Machine, local_url: str, tmp_path: Path
) -> None:
    sample_agent(src)
    snap = ok("agent", "backup", "--to", local_url).out.strip()
    assert len(snap) == 32
    r = lnk("agent", "restore", "work", "--from", local_url)
    assert r.code == 4 and "--force" in r.err
    r = ok("agent", "restore", "work", "--from", local_url, "--force", "--json")
    assert r.json()["snapshot"] == snap
    key = ok("backup", "key", "export").out
    assert "SECRET" in key and "private " in key
    ok("backup", "key", "import", input=key, home=dst.home)
    assert (dst.config_dir / "backup" / "owner.key").stat().st_mode & 0o777 == 0o600
    r = ok("agent", "restore", "work", "--from", local_url, home=dst.home)
    assert r.out.strip() == registry.find(src, "work").id


def test_a_file_that_only_starts_like_a_database_is_backed_up_as_its_bytes(
    src: Machine, dst: Machine, url: str
) -> None:
    """SQLite cannot read it: the backup stores its bytes (no snapshot, no traceback)."""
    a = sample_agent(src)
    garbage = b"SQLite format 3\x00" + b"\x00damaged past its header" * 200
    write(a.folders.home / "bad.db", garbage)
    backup_agent(src, a, url)
    give_keys(src, dst)
    restore_agent(dst, "work", url)
    b = registry.find(dst, "work")
    assert (b.folders.home / "bad.db").read_bytes() == garbage
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
