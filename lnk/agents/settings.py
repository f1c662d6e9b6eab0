"""An agent's settings file: ``~/.config/lnk/agents/<name>.toml``.

The file carries a format version.  Loading an older one migrates it and
writes it back.  The agent's ID is read from this file alone
(:func:`read_agent_key`), as it is, without migrating: a service's name may be
asked for at any moment.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from lnk.agents.bots import check_bots
from lnk.errors import InvalidInput

SETTINGS_FORMAT = 2
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
ID_RE = re.compile(r"^ag-[a-z2-7]{20}$")
OWNER_RE = re.compile(r"^(local|acct)-[A-Za-z0-9_-]{1,64}$")
HARNESS_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")  # builtin, or lnk-<harness> on PATH
RESERVED_SERVICE_PREFIXES = ("link.", "lnk-")


def check_name(name: str) -> str:
    """Refuse names that can't be a folder or a flag value safely."""
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        shown = repr(name)
        raise InvalidInput(
            f"{shown} is not a valid agent name",
            hint="use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "(no '/', '..', spaces or control characters)",
        )
    return name


def new_agent_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "ag-" + "".join(secrets.choice(alphabet) for _ in range(20))


def check_service_name(name: str) -> str:
    """A harness may name services of its own, never one of Link's."""
    if name.startswith(RESERVED_SERVICE_PREFIXES):
        raise InvalidInput(
            f"the service name {name!r} is reserved for lnk",
            hint="a harness's own services must not start with 'link.' or 'lnk-'",
        )
    return name


@dataclass
class ModelSettings:
    provider: str = "offline"  # "offline" (built in, deterministic) or "openai" (compatible API)
    base_url: str = ""
    name: str = ""
    key_env: str = "OPENAI_API_KEY"


@dataclass
class Settings:
    id: str
    name: str
    owner: str
    harness: str = "builtin"
    sandbox: bool = True
    port_base: int = 0
    port_count: int = 4
    store: str = "files"  # collection driver: "files" or "sqlite"
    renew_s: int = 10
    lapse_s: int = 60
    model: ModelSettings = field(default_factory=ModelSettings)
    format: int = SETTINGS_FORMAT
    # raised by every commit of a stream here (a move's cutover): a bridge of an older
    # epoch acts no more (lnk.connections.fence)
    epoch: int = 0
    bots: dict[str, dict[str, Any]] = field(default_factory=dict)  # connections (bots.py)

    @property
    def ports(self) -> list[int]:
        return list(range(self.port_base, self.port_base + self.port_count))

    @property
    def endpoint_port(self) -> int:
        return self.port_base

    @property
    def service_name(self) -> str:
        return service_name(self.id)

    def to_toml(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "harness": self.harness,
            "sandbox": self.sandbox,
            "store": self.store,
            "ports": {"base": self.port_base, "count": self.port_count},
            "turns": {"renew": self.renew_s, "lapse": self.lapse_s},
            "model": asdict(self.model),
            "epoch": self.epoch,
        } | ({"bots": self.bots} if self.bots else {})

    @classmethod
    def from_toml(cls, data: dict[str, Any], where: str) -> Settings:
        try:
            ports = data.get("ports", {})
            turns = data.get("turns", {})
            model = data.get("model", {})
            s = cls(
                id=_typed(data, "id", str),
                name=_typed(data, "name", str),
                owner=_typed(data, "owner", str),
                harness=str(data.get("harness", "builtin")),
                sandbox=_typed(data, "sandbox", bool),
                port_base=int(ports.get("base", 0)),
                port_count=int(ports.get("count", 4)),
                store=str(data.get("store", "files")),
                renew_s=int(turns.get("renew", 10)),
                lapse_s=int(turns.get("lapse", 60)),
                model=ModelSettings(**{k: str(v) for k, v in model.items()}),
                epoch=_epoch(data.get("epoch", 0)),
                bots=check_bots(data.get("bots"), where),
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise InvalidInput(
                f"the settings file {where} is not valid: {e}",
                hint="fix or remove the file by hand, or restore the agent from a backup",
            ) from e
        if not HARNESS_RE.match(s.harness):
            raise InvalidInput(
                f"the settings file {where} names the harness {s.harness!r}, not a harness "
                "name (lowercase letters, digits and '-')",
                hint='fix it by hand: harness = "builtin", or an adapter\'s name',
            )
        if not ID_RE.match(s.id):
            raise InvalidInput(
                f"the settings file {where} has an invalid id {s.id!r}",
                hint="an agent's id looks like ag- and 20 letters or digits 2-7",
            )
        if not OWNER_RE.match(s.owner):
            raise InvalidInput(
                f"the settings file {where} has an invalid owner {s.owner!r}",
                hint="an owner is local-<machine> or acct-<account>",
            )
        check_name(s.name)
        if s.store not in ("files", "sqlite"):
            raise InvalidInput(
                f"the settings file {where} names an unknown store {s.store!r}",
                hint="store is 'files' or 'sqlite'",
            )
        if not (0 <= s.port_base <= 65535 - s.port_count) or not 1 <= s.port_count <= 16:
            raise InvalidInput(
                f"the settings file {where} has invalid ports",
                hint="[ports] base and count must describe ports below 65536",
            )
        return s


def _epoch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise ValueError("'epoch' must be a whole number from 0")
    return value


def _typed(data: dict[str, Any], key: str, typ: type) -> Any:
    if key not in data:
        raise ValueError(f"missing {key!r}")
    value = data[key]
    if not isinstance(value, typ):
        raise ValueError(f"{key!r} must be a {typ.__name__}")
    return value


def service_name(agent_key: str) -> str:
    return f"lnk-agent-{agent_key}"


def migrate(data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Bring settings of an older format up to date; returns (data, changed)."""
    version = data.get("format", 1)
    if not isinstance(version, int) or version > SETTINGS_FORMAT:
        raise InvalidInput(
            f"the settings were written by a newer lnk (format {version}; this lnk reads up to "
            f"{SETTINGS_FORMAT})",
            hint="upgrade lnk on this machine",
        )
    changed = False
    if version == 1:
        # format 1 kept `no_sandbox` and a single `port`, and had no store/turns sections
        data = dict(data)
        data["sandbox"] = not bool(data.pop("no_sandbox", False))
        port = data.pop("port", None)
        data.setdefault("ports", {"base": int(port) if port else 0, "count": 4})
        data.setdefault("store", "files")
        data.setdefault("turns", {"renew": 10, "lapse": 60})
        if "id" not in data:
            data["id"] = new_agent_id()
        data["format"] = 2
        changed = True
    return data, changed


def read_raw(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidInput(
            f"the settings file {path} is not valid TOML: {e}",
            hint="fix or remove the file by hand, or restore the agent from a backup",
        ) from e


def read_agent_key(path: Path) -> str:
    """The key everything running is named by: the ID, read from the file as it is.

    An agent from before IDs is keyed by its name.
    """
    data = read_raw(path)
    key = data.get("id") or data.get("name") or path.stem
    return str(key)


def load(path: Path) -> Settings:
    data = read_raw(path)
    data, changed = migrate(data)
    settings = Settings.from_toml(data, str(path))
    if changed:
        save(path, settings)
    return settings


def save(path: Path, settings: Settings) -> None:
    write_toml_atomic(path, settings.to_toml())


def write_toml_atomic(path: Path, data: dict[str, Any], mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
