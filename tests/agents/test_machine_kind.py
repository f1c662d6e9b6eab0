"""Root's kind.toml marks a box: a box never runs an agent without a sandbox.

And machine.toml is read only if only the user or root could have written it.
"""

from __future__ import annotations

import os
from pathlib import Path

from lnkrun import lnk, ok
from move_helpers import kill_agents
from trust_helpers import AGENT, read_settings, settings_file


def _error_lines(err: str) -> list[str]:
    assert "Traceback" not in err
    return [x for x in err.splitlines() if x.startswith("lnk: error:")]


def test_a_box_refuses_no_sandbox_whatever_machine_toml_says(home: Path, tmp_path: Path) -> None:
    kind = tmp_path / "kind.toml"
    kind.write_text('kind = "box"\n')
    env = {"LNK_KIND_FILE": str(kind)}
    ok("agent", "create", AGENT, env=env)
    (home / ".lnk" / "machine.toml").write_text(
        (home / ".lnk" / "machine.toml").read_text() + "unsandboxed = true\n"
    )
    r = lnk("agent", "start", "--agent", AGENT, "--no-sandbox", env=env)
    assert r.code == 6
    (line,) = _error_lines(r.err)
    assert str(kind) in line and "box" in line
    # the refusal keeps nothing: the agent is still set to run sandboxed
    assert read_settings(home)["sandbox"] is True
    # an agent whose settings say no sandbox (written by hand) is refused too
    text = settings_file(home).read_text().replace("sandbox = true", "sandbox = false")
    settings_file(home).write_text(text)
    r = lnk("agent", "start", "--agent", AGENT, env=env)
    assert r.code == 6 and str(kind) in r.err
    # without the kind file, the same machine may (the person's --no-sandbox)
    try:
        st = ok("agent", "start", "--agent", AGENT, "--no-sandbox", "--json").json()
        assert st["sandboxed"] is False
    finally:
        lnk("agent", "stop", "--agent", AGENT)
        kill_agents([home])


def test_machine_toml_writable_by_others_is_refused(home: Path) -> None:
    ok("agent", "create", AGENT)
    mt = home / ".lnk" / "machine.toml"
    os.chmod(mt, 0o620)
    r = lnk("agent", "create", "other")
    assert r.code == 6
    (line,) = _error_lines(r.err)
    assert str(mt) in line and "620" in line
    assert "chmod go-w" in r.err
    os.chmod(mt, 0o600)
    os.chmod(home / ".lnk", 0o777)
    r = lnk("agent", "create", "other")
    assert r.code == 6 and str(home / ".lnk") in r.err
    os.chmod(home / ".lnk", 0o700)
    os.chown(mt, 12345, 12345)
    r = lnk("agent", "create", "other")
    assert r.code == 6 and "uid 12345" in r.err
    os.chown(mt, 0, 0)
    ok("agent", "create", "other")
