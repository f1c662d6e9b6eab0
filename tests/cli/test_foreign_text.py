"""Text from a sandbox or a box reaches the person's terminal escaped, and bounded (issue 22).

A hostile box here is a real process: ``LNK_SSH_COMMAND`` names a script that
answers as a box of the attacker's would, whatever lnk asks it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tomli_w

from lnk.agents import registry
from lnk.agents.layout import Machine
from tests.lnkrun import lnk

ESC = "\x1b"
OSC52 = "\x1b]52;c;aGVsbG8=\x07"  # writes "hello" to the clipboard
NAME = f"ev{OSC52}il\r\x1b[2Kforged line"


def _raw_control(text: str) -> bool:
    return any(c in text for c in (ESC, "\x07", "\r", "\x9b"))


def test_status_escapes_what_the_sandbox_wrote(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    a.runtime.mkdir(parents=True, exist_ok=True)
    (a.runtime / "proxy-refused.json").write_text(
        json.dumps({"host": NAME, "port": 443, "at": "now", "why": f"why{OSC52}\nforged: yes"})
    )
    r = lnk("agent", "status")
    assert r.code == 0, r.err
    assert not _raw_control(r.out)
    assert "\\x1b]52;c;aGVsbG8=\\x07" in r.out
    assert "forged: yes" not in r.out.splitlines()  # the newline stays inside its line
    assert sum(line.startswith("refused:") for line in r.out.splitlines()) == 1


def test_logs_escape_and_keep_lines_as_the_harness_wrote_them(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    a.runtime.mkdir(parents=True, exist_ok=True)
    (a.runtime / "harness.log").write_bytes(
        b"line one\n"
        + f"tool said {OSC52}\r\x1b[2Klnk runner: stopped\n".encode()
        + b"\x9b31mred\xff\n"
        + b"x" * 100_000
        + b"\n"
    )
    r = lnk("agent", "logs")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == 4
    assert lines[0] == "line one"
    assert not _raw_control(r.out)
    assert lines[1].startswith("tool said \\x1b]52") and "\\x0d\\x1b[2Klnk runner" in lines[1]
    assert len(lines[3]) < 5000 and "bytes more" in lines[3]


def _fake_ssh(tmp: Path, boxes: dict[str, str]) -> dict[str, str]:
    """A script standing in for ssh: each destination runs its shell line, whatever lnk asks."""
    script = tmp / "fakessh"
    cases = "".join(f"  {dest}) {line} ;;\n" for dest, line in boxes.items())
    script.write_text(
        "#!/bin/sh\n"
        'while [ "$#" -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done\n'
        f'case "$1" in\n{cases}esac\n'
    )
    script.chmod(0o755)
    return {"LNK_SSH_COMMAND": str(script)}


def _boxes(home: Path, names: list[str]) -> None:
    path = home / ".config" / "lnk" / "boxes.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"boxes": {n: {"destination": n} for n in names}}))


def test_list_escapes_a_box_s_names(home: Path, tmp_path: Path) -> None:
    rows = [{"name": NAME, "id": "ag-" + "a" * 20, "place": "here", "state": f"running{OSC52}"}]
    payload = tmp_path / "rows.json"
    payload.write_text(json.dumps(rows))
    _boxes(home, ["evilbox"])
    env = _fake_ssh(tmp_path, {"evilbox": f"cat {payload}"})
    r = lnk("agent", "list", env=env)
    assert r.code == 0, r.err
    assert not _raw_control(r.out + r.err)
    assert "\\x1b]52;c;aGVsbG8=\\x07" in r.out and "forged line" in r.out
    assert len(r.out.splitlines()) == 2  # the header and the one row


def _peak_kib(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    p = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "PEAK %M",
            sys.executable,
            "-c",
            "from lnk.cli.main import main; main()",
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    peak = int(p.stderr.rsplit("PEAK ", 1)[1].split()[0])
    return peak, p.stderr.rsplit("PEAK ", 1)[0]


def test_a_huge_box_answer_is_refused_within_a_bounded_memory(home: Path, tmp_path: Path) -> None:
    _boxes(home, ["bigbox", "loudbox"])
    env = _fake_ssh(
        tmp_path,
        {
            "bigbox": "head -c 536870912 /dev/zero",  # 512 MiB answer
            # 64 MiB of error message, then the protocol's error line naming it whole
            "loudbox": (
                "head -c 67108864 /dev/zero | tr '\\0' A >&2; "
                'printf \'{"error": {"exit": 1, "class": "LnkError", "message": "\' >&2; '
                "head -c 67108864 /dev/zero | tr '\\0' B >&2; printf '\"}}\\n' >&2; exit 1"
            ),
        },
    )
    peak, err = _peak_kib(["agent", "list"], env)
    assert peak <= 64 * 1024, f"lnk agent list peaked at {peak} KiB"
    lines = [line for line in err.splitlines() if line.startswith("lnk: ")]
    big = next(line for line in lines if "bigbox" in line)
    assert "more than 8 MiB" in big
    loud = next(line for line in lines if "loudbox" in line)
    assert len(loud) < 1200, len(loud)
