"""``~/.lnk/machine.toml``: this machine's own settings, which no agent reaches.

id = "m-..."            made on first use; the owner stand-in is local-<id>
unsandboxed = false     refuses every way of running an agent without a sandbox
keep_moved = "30d"      how long a moved agent's files are kept ("90d", "never")
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from lnk.agents.layout import Machine
from lnk.agents.settings import read_raw, write_toml_atomic
from lnk.errors import InvalidInput

KEEP_RE = re.compile(r"^(\d{1,4})d$")


@dataclass
class MachineSettings:
    id: str
    unsandboxed: bool = True
    keep_moved: str = "30d"

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


def load_machine(machine: Machine) -> MachineSettings:
    path = machine.machine_toml
    data = read_raw(path) if path.exists() else {}
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
    ms = MachineSettings(id=data["id"], unsandboxed=unsandboxed, keep_moved=str(keep))
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
