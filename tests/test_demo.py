"""The README's first command: the demo runs end to end, sandboxed, on this machine."""

from __future__ import annotations

from pathlib import Path

from tests.lnkrun import ok


def test_demo_runs_sandboxed_end_to_end(tmp_path: Path) -> None:
    r = ok("demo", "--dir", str(tmp_path / "demo"), timeout=600)
    out = r.out
    assert "[demo] you said: hello (message 1 in link:main)" in out
    assert "sandboxed: True" in out
    assert "[demo] you said: hello from b" in out  # restored on machine b from the backup
    assert "[demo] you said: back home" in out  # moved to the box and back
    # the moved-back copy carries the file and the conversation
    assert (tmp_path / "demo/a/Link/Agents/demo/Home/notes.md").exists()
    assert not (tmp_path / "demo/box/.config/lnk/agents/demo.toml").exists()
    assert list((tmp_path / "demo/box/Link/Moved").iterdir())
    # and the demo ends with its agent on one machine: b let go of its restored copy
    holders = [
        m
        for m in ("a", "b", "box")
        if (tmp_path / f"demo/{m}/.config/lnk/agents/demo.toml").exists()
    ]
    assert holders == ["a"]
    assert not (tmp_path / "demo/b/Link/Agents/demo").exists()
