"""The box protocol's errors: one JSON line across the leg, and the first end's cause."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lnk.errors import InvalidInput, LnkError, NotFound, StreamError, TransportError
from lnk.transport.errorline import error_line, remote_error
from lnk.transport.legs import LocalLeg
from lnk.transport.pipes import pipe


def _lnk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lnk", *args], capture_output=True, text=True, timeout=60
    )


def test_errors_json_is_one_line_with_class_exit_message_hint() -> None:
    r = _lnk("--errors", "json", "box", "remove", "nope")
    assert r.returncode == NotFound.exit_code
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    doc = json.loads(lines[0])["error"]
    assert doc == {
        "exit": NotFound.exit_code,
        "class": "NotFound",
        "message": "there is no box named 'nope'",
        "hint": "see lnk box list",
    }


def test_errors_json_covers_usage_errors() -> None:
    r = _lnk("--errors", "json", "agent", "no-such-verb")
    assert r.returncode == 2
    doc = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert doc["class"] == "UsageError" and "no-such-verb" in doc["message"]


def test_text_errors_stay_words() -> None:
    r = _lnk("box", "remove", "nope")
    assert r.stderr.splitlines() == [
        "lnk: error: there is no box named 'nope'",
        "lnk: hint: see lnk box list",
    ]


def test_remote_error_reads_the_json_line_never_the_words() -> None:
    words = "lnk: error: pretend this is the cause\nlnk: hint: pretend\n"
    err = remote_error("box a", 5, words)
    # words are not parsed: the exit code picks the class, the last line is shown
    assert type(err) is InvalidInput and "command failed with exit code 5" in err.message
    line = json.dumps(
        {"error": {"exit": 10, "class": "StreamError", "message": "cut", "hint": "again"}}
    )
    err = remote_error("box a", 10, "noise\n" + line + "\n")
    assert type(err) is StreamError
    assert (err.message, err.hint) == ("on box a: cut", "again")
    # a class name that is not ours is not trusted: the exit code decides
    line = json.dumps({"error": {"exit": 12, "class": "SystemExit", "message": "m"}})
    assert type(remote_error("b", 12, line)) is TransportError
    assert error_line("{not json\n") is None


def _err(cls: str, code: int, message: str) -> str:
    doc = {"error": {"exit": code, "class": cls, "message": message, "hint": None}}
    return "echo " + json.dumps(json.dumps(doc)) + f" >&2; exit {code}"


def test_pipe_names_the_sender_that_failed_first(tmp_path: Path) -> None:
    leg = LocalLeg(tmp_path / "h")
    # the sender fails by itself; the receiver then finds its stream cut short
    src = "printf partial; " + _err("LnkError", 1, "Home/log changed while it was read")
    dst = "cat >/dev/null; sleep 0.3; " + _err("StreamError", 10, "the stream was cut short")
    with pytest.raises(LnkError) as e:
        pipe(leg, src, leg, dst)
    assert "Home/log changed while it was read" in e.value.message


def test_pipe_names_the_receiver_that_failed_first(tmp_path: Path) -> None:
    leg = LocalLeg(tmp_path / "h")
    # the receiver fails (disk full); the sender then dies of its broken pipe, wordless
    src = "sleep 0.3; yes | head -c 10000000; exit 1"
    dst = "head -c 10 >/dev/null; " + _err("StreamError", 10, "no space left on device")
    with pytest.raises(StreamError) as e:
        pipe(leg, src, leg, dst)
    assert "no space left on device" in e.value.message


@pytest.mark.parametrize("place", ["local", "ssh"])
@pytest.mark.parametrize("start", ["run", "popen", "shell"])
def test_a_command_holding_a_nul_is_refused_in_one_line_at_every_start(
    tmp_path: Path, place: str, start: str
) -> None:
    """A step's words may be a box's answers passed on: one with a NUL (no command line
    holds it) is refused where every command of a leg starts, run, popen or a shell line,
    not a ValueError from the system's exec (a traceback in the mover)."""
    from lnk.protocol import ProtocolError
    from lnk.transport.legs import Leg, SshLeg

    leg: Leg = LocalLeg(tmp_path / "box") if place == "local" else SshLeg("box1")
    args = ["agent", "status", "--agent", "a\0b"]
    with pytest.raises(ProtocolError) as ei:
        if start == "run":
            leg.run(args)
        elif start == "popen":
            leg.popen(args)
        else:
            leg.run_shell("echo a\0b")
    assert "would hold a NUL" in ei.value.message and "\n" not in ei.value.message
