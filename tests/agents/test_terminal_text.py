"""Text from a stream or a bucket reaches the terminal with its control characters escaped."""

from __future__ import annotations

from pathlib import Path

import tomli_w
from lnkrun import lnk, ok
from trust_helpers import AGENT, grants_file, send_stream

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # a clipboard write
CSI = "\x1b[2J\x1b[31m"  # clear the screen, red
CR = "\rlnk: all is well"


def _clean(err: str) -> None:
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err, repr(err)
    assert "Traceback" not in err


def test_grant_names_from_a_stream_are_escaped(home: Path, tmp_path: Path) -> None:
    box = tmp_path / "box"
    box.mkdir()
    ok("agent", "create", AGENT, home=box)
    grants = {
        "lan": {"hosts": [f"{OSC52}nas"]},
        f"{CSI}x": {"a": 1},
        "tcp": {"endpoints": [f"{CR}:22", "\u202egit.example:22"]},
    }
    grants_file(box).write_text(tomli_w.dumps(grants))
    prep = ok("agent", "state-receive", "--prepare", "--json").json()
    stream = tmp_path / "stream"
    send_stream(box, prep["public_key"], stream)
    r = ok("agent", "state-receive", "--receiver", prep["receiver"], input=stream.read_bytes())
    _clean(r.err)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07nas" in r.err
    assert "\\x1b[2J\\x1b[31mx" in r.err
    assert "\\x0dlnk: all is well" in r.err
    assert "\\u202egit.example" in r.err and "\u202e" not in r.err


def test_error_lines_are_escaped(home: Path, tmp_path: Path) -> None:
    ok("agent", "create", AGENT)
    url = f"file://{tmp_path}/none{OSC52}{CSI}{CR}"
    r = lnk("agent", "backup", "--agent", AGENT, "--to", url)
    assert r.code != 0
    _clean(r.err)
    assert "\\x1b]52;c;" in r.err
    # the backup key made by this run is told (once), then the error: one line, escaped
    lines = [ln for ln in r.err.splitlines() if "made your backup key pair" not in ln]
    assert lines[0].startswith("lnk: error:") and len(lines) <= 2
