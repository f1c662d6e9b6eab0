"""A repository written by the lnk of 2026-11-30 (format 1, layout 2), frozen under
frozen/v1 with its test owner key: this lnk must still verify and restore it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bk_helpers import agent_files, collections_of, link_groups
from lnkrun import ok

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup import agent_keys
from lnk.backup.agent_restore import restore_agent

FROZEN = Path(__file__).parent / "frozen" / "v1"


def _copy(tmp: Path) -> str:
    shutil.copytree(FROZEN / "bucket", tmp / "bucket")
    shutil.copy(FROZEN / ".bucket.lnk-labels.json", tmp / ".bucket.lnk-labels.json")
    return f"file://{tmp / 'bucket'}"


def test_the_frozen_repository_still_restores(tmp_path: Path) -> None:
    url = _copy(tmp_path)
    want = json.loads((FROZEN / "expected.json").read_text())
    first, newest = want["snapshots"]
    m = Machine(tmp_path / "m")
    agent_keys.import_keys(m, agent_keys.parse_text((FROZEN / "owner-key.txt").read_text()))
    out = restore_agent(m, want["agent"], url)
    assert out.snapshot == newest and out.layout == 2
    a = registry.find(m, want["agent"])
    assert a.id == want["id"]
    assert {k: list(v) for k, v in agent_files(a.folders.root).items()} == want["files"]
    assert sorted(sorted(g) for g in link_groups(a.folders.root)) == want["links"]
    assert collections_of(a) == want["collections"]

    older = Machine(tmp_path / "older")
    agent_keys.import_keys(older, agent_keys.parse_text((FROZEN / "owner-key.txt").read_text()))
    restore_agent(older, want["agent"], url, snapshot=first)
    got = agent_files(registry.find(older, want["agent"]).folders.root)
    assert "Home/later.txt" not in got
    assert {k: list(v) for k, v in got.items()} == {
        k: v for k, v in want["files"].items() if k != "Home/later.txt"
    }


def test_the_frozen_repository_verifies(tmp_path: Path, home: Path) -> None:
    url = _copy(tmp_path)
    ok("backup", "key", "import", input=(FROZEN / "owner-key.txt").read_text())
    rep = ok("agent", "backup", "verify", "--from", url, "--read-data", "--json").json()
    assert rep["ok"] and rep["snapshots"] == 2 and rep["packs_read"] == 2
