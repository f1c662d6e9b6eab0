"""A local bucket never writes into a folder that is something else."""

from __future__ import annotations

from pathlib import Path

from lnkrun import lnk, ok
from trust_helpers import AGENT


def test_a_non_empty_folder_that_is_no_repository_is_refused(home: Path, tmp_path: Path) -> None:
    ok("agent", "create", AGENT)
    theirs = tmp_path / "someones-home"
    theirs.mkdir()
    (theirs / ".bashrc").write_text("# mine\n")
    before = sorted(p.name for p in theirs.iterdir())
    r = lnk("agent", "backup", "--agent", AGENT, "--to", f"file://{theirs}")
    assert r.code == 6 and "Traceback" not in r.err
    assert "not an lnk repository" in r.err and str(theirs) in r.err
    assert sorted(p.name for p in theirs.iterdir()) == before
    assert not (tmp_path / ".someones-home.lnk-labels.json").exists()
    # an empty folder becomes a bucket, and a bucket takes a second backup
    ours = tmp_path / "bucket"
    ours.mkdir()
    ok("agent", "backup", "--agent", AGENT, "--to", f"file://{ours}")
    assert (ours / "config").is_file()
    ok("agent", "backup", "--agent", AGENT, "--to", f"file://{ours}")
