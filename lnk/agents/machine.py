"""``~/.lnk/machine.toml``: this machine's own settings, which no agent reaches.

id = "m-..."            made on first use; the owner stand-in is local-<id>
unsandboxed = false     refuses every way of running an agent without a sandbox
keep_moved = "30d"      how long a moved agent's files are kept ("90d", "never")

It is read only if only you or root could have written it (it and ~/.lnk owned
by you or root, writable by no group or other): an agent that could write it
could otherwise loosen what decides its sandbox.

``/etc/lnk/kind.toml`` (root's) says what kind of machine this is:

kind = "box"            a box never runs an agent without a sandbox, whatever
                        a user's machine.toml says (what a person's file says
                        loosens nothing root decides)

Tests point ``LNK_KIND_FILE`` at a file of their own (read only with LNK_TESTING=1).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from lnk.agents.layout import Machine
from lnk.agents.settings import read_raw, write_toml_atomic
from lnk.errors import InvalidInput, Refused

KIND_FILE = Path("/etc/lnk/kind.toml")

KEEP_RE = re.compile(r"^(\d{1,4})d$")


def now() -> float:
    """The time, as lnk's expiries read it; a test sets it with LNK_NOW (LNK_TESTING=1 only)."""
    if os.environ.get("LNK_TESTING") == "1" and os.environ.get("LNK_NOW"):
        return float(os.environ["LNK_NOW"])
    return time.time()


def kind_file() -> Path:
    if os.environ.get("LNK_TESTING") == "1" and os.environ.get("LNK_KIND_FILE"):
        return Path(os.environ["LNK_KIND_FILE"])
    return KIND_FILE


def machine_kind() -> str:
    """What root's kind.toml says this machine is ("box"), or "" without one."""
    path = kind_file()
    if not path.exists():
        return ""
    kind = read_raw(path).get("kind", "")
    if not isinstance(kind, str):
        raise InvalidInput(f"kind in {path} must be a string", hint='write kind = "box"')
    return kind


@dataclass
class MachineSettings:
    id: str
    unsandboxed: bool = True
    keep_moved: str = "30d"
    kind: str = ""  # root's kind.toml: "box" on a box
    path: Path = Path("~/.lnk/machine.toml")

    def check_unsandboxed(self, name: str) -> None:
        """Refuse to run the agent ``name`` without a sandbox if this machine says so."""
        if self.kind == "box":
            raise Refused(
                f"this machine is a box ({kind_file()} says so), and a box never runs an agent "
                "without a sandbox",
                hint=f"start it sandboxed: lnk agent start --agent {name} --sandbox",
            )
        if not self.unsandboxed:
            raise Refused(
                "this machine refuses to run agents without a sandbox (unsandboxed = false in "
                f"{self.path})",
                hint=f"start it sandboxed: lnk agent start --agent {name} --sandbox",
            )

    @property
    def owner_stand_in(self) -> str:
        return f"local-{self.id}"

    def keep_moved_days(self) -> int | None:
        """Days to keep a moved agent's files, or None for never deleting them."""
        if self.keep_moved == "never":
            return None
        m = KEEP_RE.match(self.keep_moved)
        if not m:
            raise InvalidInput(
                f"keep_moved = {self.keep_moved!r} in machine.toml is not valid",
                hint='write a number of days such as "30d", or "never"',
            )
        return int(m.group(1))


def _check_writers(path: Path) -> None:
    """Refuse a file (and its folder) that another than the user or root could have written."""
    me = os.getuid()
    for p in (path.parent, path):
        st = os.stat(p)
        if st.st_uid not in (me, 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Refused(
                f"{path} is not read: {p} could be written by another than you or root "
                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})",
                hint=f"chmod go-w {p}" + ("" if st.st_uid in (me, 0) else f"; chown {me} {p}"),
            )


def load_machine(machine: Machine) -> MachineSettings:
    path = machine.machine_toml
    exists = path.exists()
    if exists:
        _check_writers(path)
    data = read_raw(path) if exists else {}
    changed = False
    if not isinstance(data.get("id"), str) or not data["id"]:
        data["id"] = "m-" + secrets.token_hex(6)
        changed = True
    unsandboxed = data.get("unsandboxed", True)
    if not isinstance(unsandboxed, bool):
        raise InvalidInput(
            f"unsandboxed in {path} must be true or false",
            hint="write unsandboxed = false to refuse agents without a sandbox",
        )
    keep = data.get("keep_moved", "30d")
    ms = MachineSettings(
        id=data["id"], unsandboxed=unsandboxed, keep_moved=str(keep), kind=machine_kind(), path=path
    )
    ms.keep_moved_days()
    if changed:
        _write(path, data)
    return ms


def _write(path: Path, data: dict[str, object]) -> None:
    write_toml_atomic(path, data, mode=0o600)


def account_owner(machine: Machine) -> str | None:
    """The signed-in account's owner ID (``acct-<id>``), if this machine is signed in."""
    path = machine.config_dir / "account.toml"
    if not path.exists():
        return None
    acct = read_raw(path).get("id")
    return f"acct-{acct}" if isinstance(acct, str) and acct else None
