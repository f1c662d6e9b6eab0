"""Nothing secret lingers: receivers expire after 24 hours, kept folders after keep_moved.

The clock is set with LNK_NOW (honoured only under LNK_TESTING=1).
"""

from __future__ import annotations

import time
from pathlib import Path

from lnkrun import lnk, ok
from move_helpers import AGENT, World, make_agent

HOUR = 3600.0


def _later(hours: float) -> dict[str, str]:
    return {"LNK_NOW": str(time.time() + hours * HOUR)}


def test_a_25_hour_old_receiver_is_refused_and_its_key_is_gone(home: Path) -> None:
    old = ok("agent", "state-receive", "--prepare", "--json").json()["receiver"]
    key = home / ".lnk" / "receivers" / old / "key"
    assert key.exists()
    # 23 hours on it is still good
    ok("agent", "state-receive", "--receiver", old, "--inventory", env=_later(23))
    r = lnk("agent", "state-receive", "--receiver", old, "--inventory", env=_later(25))
    assert r.code == 6 and "Traceback" not in r.err
    assert "24 hours" in r.err and old in r.err
    assert not key.exists() and not key.parent.exists()


def test_expired_receivers_are_removed_at_a_receive_or_a_start(home: Path) -> None:
    rids = [ok("agent", "state-receive", "--prepare", "--json").json()["receiver"] for _ in "ab"]
    keys = [home / ".lnk" / "receivers" / rid / "key" for rid in rids]
    # a start (of an agent there isn't, even) removes what expired
    lnk("agent", "start", "--agent", "nobody", env=_later(1))
    assert all(k.exists() for k in keys)
    lnk("agent", "start", "--agent", "nobody", env=_later(25))
    assert not any(k.exists() for k in keys)
    # so does a receive: a fresh receiver made 25 hours "from now" meets one made now
    fresh = ok("agent", "state-receive", "--prepare", "--json").json()["receiver"]
    ok("agent", "state-receive", "--prepare", "--json", env=_later(25))
    assert not (home / ".lnk" / "receivers" / fresh).exists()


def test_kept_folders_go_once_keep_moved_is_over(world: World) -> None:
    make_agent(world)
    world.ok("agent", "move", "--to", "b1")
    kept = list((world.here / "Link" / "Moved").glob(f"{AGENT}-*"))
    assert len(kept) == 1
    world.lnk("agent", "start", "--agent", AGENT, env=_later(29 * 24))
    assert kept[0].exists()
    r = world.lnk("agent", "start", "--agent", AGENT, env=_later(31 * 24))
    assert "moved to" in r.err  # the note stays: start still says where it went
    assert not kept[0].exists()
