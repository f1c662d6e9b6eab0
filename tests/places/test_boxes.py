"""lnk box add/list/run/remove through the CLI, against real sshd hosts and a local box."""

from __future__ import annotations

import json
import tomllib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from hosts import Hosts, run_lnk

import lnk
from lnk.errors import AlreadyExists, InvalidInput, NotFound
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.places import boxes
from lnk.places.wheel import build_wheel
from lnk.protocol import Version
from lnk.transport.legs import LocalLeg, SshLeg


def test_ssh_box_add_list_run_remove(cli_env: dict[str, str], ssh_env: Hosts, home: Path) -> None:
    code, out, err = run_lnk("box", "add", "a", "hostA", "--json", env=cli_env)
    assert code == 0, err
    added = json.loads(out)
    assert added["action"] == "found"
    assert added["after"] == {"version": lnk.__version__, "stream_format": STREAM_FORMAT}

    code, out, _ = run_lnk("box", "list", "--json", env=cli_env)
    assert code == 0
    assert json.loads(out) == [{"kind": "ssh", "name": "a", "where": "hostA"}]
    with (home / ".config" / "lnk" / "boxes.toml").open("rb") as f:
        assert tomllib.load(f) == {"boxes": {"a": {"destination": "hostA"}}}

    # stdout and exit code of the command there pass through
    code, out, err = run_lnk("box", "run", "a", "--", "version", "--json", env=cli_env)
    assert code == 0, err
    assert json.loads(out)["stream_format"] == STREAM_FORMAT
    code, out, err = run_lnk("box", "run", "a", "--", "box", "remove", "ghost", env=cli_env)
    assert code == NotFound.exit_code
    assert "there is no box named 'ghost'" in err
    # it ran there: hostA's own HOME, not ours
    run_lnk(
        "box",
        "run",
        "a",
        "--",
        "box",
        "add",
        "inner",
        "--local",
        str(ssh_env["hostA"].home / "inner"),
        env=cli_env,
    )
    assert (ssh_env["hostA"].home / ".config" / "lnk" / "boxes.toml").exists()
    assert "inner" not in (home / ".config" / "lnk" / "boxes.toml").read_text()

    code, _, err = run_lnk("box", "remove", "a", env=cli_env)
    assert code == 0
    assert "removed box a" in err
    code, out, _ = run_lnk("box", "list", "--json", env=cli_env)
    assert json.loads(out) == []


def test_local_box(cli_env: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "second-machine"
    code, _, err = run_lnk("box", "add", "here", "--local", str(other), env=cli_env)
    assert code == 0, err
    assert "box here answers: lnk" in err
    code, out, _ = run_lnk("box", "list", env=cli_env)
    assert "here" in out and f"local:{other}" in out
    # a command run there writes under that HOME
    code, _, err = run_lnk(
        "box", "run", "here", "--", "box", "add", "x", "--local", str(tmp_path / "x"), env=cli_env
    )
    assert code == 0, err
    assert (other / ".config" / "lnk" / "boxes.toml").exists()
    code, _, err = run_lnk("box", "add", "here", "--local", str(other), env=cli_env)
    assert code == AlreadyExists.exit_code
    assert "already a box named 'here'" in err


def test_add_installs_then_upgrades(cli_env: dict[str, str], ssh_env: Hosts) -> None:
    """hostC has python3 but no lnk: add installs it; an old lnk there gets upgraded."""
    c = ssh_env["hostC"]
    fake = c.bin / "lnk"
    assert ssh_env.ssh("hostC", 'rm -rf "$HOME/.local"').returncode == 0
    try:
        # an old lnk: no `version --json`, reports 0.0.1
        fake.write_text(
            '#!/bin/sh\n[ "$1" = --version ] && { echo "lnk, version 0.0.1"; exit 0; }\n'
            'echo "Error: No such command" >&2; exit 2\n'
        )
        fake.chmod(0o755)
        code, out, err = run_lnk("box", "add", "c", "hostC", "--json", env=cli_env)
        assert code == 0, err
        report = json.loads(out)
        assert report["action"] == "upgraded"
        assert report["before"] == {"version": "0.0.1", "stream_format": None}
        assert report["after"]["stream_format"] == STREAM_FORMAT
        assert (c.home / ".local" / "bin" / "lnk").exists()

        # nothing at all: installed
        fake.unlink()
        assert ssh_env.ssh("hostC", 'rm -rf "$HOME/.local"').returncode == 0
        assert ssh_env.ssh("hostC", "command -v lnk").returncode != 0
        assert run_lnk("box", "remove", "c", env=cli_env)[0] == 0
        code, out, err = run_lnk("box", "add", "c", "hostC", env=cli_env)
        assert code == 0, err
        assert f"box c: installed lnk {lnk.__version__}" in err
        r = ssh_env.ssh("hostC", "lnk version --json")
        assert json.loads(r.stdout)["stream_format"] == STREAM_FORMAT
    finally:
        fake.unlink(missing_ok=True)


def test_no_install_refuses(cli_env: dict[str, str], ssh_env: Hosts) -> None:
    assert ssh_env.ssh("hostC", 'rm -rf "$HOME/.local"').returncode == 0
    code, _, err = run_lnk("box", "add", "c", "hostC", "--no-install", env=cli_env)
    assert code == 12
    assert "needs lnk" in err
    assert run_lnk("box", "list", "--json", env=cli_env)[1].strip() == "[]"


def test_unreachable_box_fails_clearly(cli_env: dict[str, str]) -> None:
    code, _, err = run_lnk("box", "add", "down", "hostDown", env=cli_env)
    assert code == 12
    assert "lnk: error: cannot reach box down over SSH" in err
    assert "Connection refused" in err
    assert "lnk: hint: check that 'ssh hostDown' works from this computer" in err
    assert run_lnk("box", "list", "--json", env=cli_env)[1].strip() == "[]"


def test_box_run_unknown_box(cli_env: dict[str, str]) -> None:
    code, _, err = run_lnk("box", "run", "nope", "--", "version", env=cli_env)
    assert code == NotFound.exit_code
    assert "no box named 'nope'" in err


def test_registry_api(home: Path, tmp_path: Path) -> None:
    report = boxes.add("one", local_dir=tmp_path / "one")
    assert report.action == "found"
    assert isinstance(boxes.get("one").leg(), LocalLeg)
    with pytest.raises(AlreadyExists):
        boxes.add("one", local_dir=tmp_path / "one")
    with pytest.raises(InvalidInput):
        boxes.add("../evil", local_dir=tmp_path)
    with pytest.raises(InvalidInput):
        boxes.add("both", destination="h", local_dir=tmp_path)
    assert [b.name for b in boxes.list()] == ["one"]
    assert boxes.remove("one").name == "one"
    with pytest.raises(NotFound):
        boxes.get("one")
    with pytest.raises(NotFound):
        boxes.remove("one")


def test_ssh_box_leg_carries_remote_lnk(home: Path) -> None:
    box = boxes.Box(name="b", destination="me@h", remote_lnk="$HOME/.local/bin/lnk")
    leg = box.leg()
    assert isinstance(leg, SshLeg)
    assert leg.remote_command(["version"]) == "$HOME/.local/bin/lnk --errors json version"
    assert leg.remote_command(["version"], bare=True) == "$HOME/.local/bin/lnk version"


def test_needs_install() -> None:
    ours = Version(lnk.__version__, STREAM_FORMAT)
    assert not boxes.needs_install(ours)
    assert not boxes.needs_install(replace(ours, version="99.0"))
    assert boxes.needs_install(None)
    assert boxes.needs_install(replace(ours, version="0.0.1"))
    assert boxes.needs_install(replace(ours, stream_format=STREAM_FORMAT - 1))
    assert boxes.needs_install(replace(ours, stream_format=None))


def test_wheel_is_cached_and_complete(home: Path) -> None:
    w1 = build_wheel()
    w2 = build_wheel()
    assert w1 == w2
    assert w1.is_relative_to(home / ".lnk" / "cache")
    with zipfile.ZipFile(w1) as z:
        names = set(z.namelist())
        assert z.testzip() is None
        record = z.read(f"lnk-{lnk.__version__}.dist-info/RECORD").decode()
    assert "lnk/transport/legs.py" in names
    assert "lnk/__main__.py" in names
    assert not any("__pycache__" in n for n in names)
    assert f"lnk-{lnk.__version__}.dist-info/RECORD,," in record
