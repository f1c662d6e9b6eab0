"""An agent's provider keys: ``~/.config/lnk/secrets/<agent id>.toml`` (0600).

Kept under ``~/.config/lnk``, which no sandbox shows, and read only by the
agent's proxy outside its sandbox, which adds the key to the requests it
forwards to the agent's model (``lnk agent secret set``).  A key is named as
the ``[model] key_env`` names it (``OPENAI_API_KEY`` by default).
"""

from __future__ import annotations

import re
import tomllib

from lnk.agents.layout import Machine
from lnk.agents.settings import write_toml_atomic
from lnk.errors import InvalidInput

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_SECRET_BYTES = 16 * 1024


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise InvalidInput(
            f"{name!r} is not a secret's name",
            hint="name it as the variable [model] key_env names, e.g. OPENAI_API_KEY",
        )
    return name


def _read(machine: Machine, agent_id: str) -> dict[str, str]:
    path = machine.config_dir / "secrets" / f"{agent_id}.toml"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{path} is not valid TOML: {e}", hint="fix or remove it") from e
    return {str(k): str(v) for k, v in data.items()}


def get(machine: Machine, agent_id: str, name: str) -> str | None:
    return _read(machine, agent_id).get(name)


def names(machine: Machine, agent_id: str) -> list[str]:
    return sorted(_read(machine, agent_id))


def set_secret(machine: Machine, agent_id: str, name: str, value: str) -> None:
    check_name(name)
    value = value.strip()
    if not value or len(value.encode()) > MAX_SECRET_BYTES or "\n" in value:
        raise InvalidInput(
            f"the value for {name} is empty, more than one line, or too long",
            hint='pipe the key alone: printf %s "$KEY" | lnk agent secret set NAME',
        )
    data = _read(machine, agent_id)
    data[name] = value
    folder = machine.config_dir / "secrets"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    write_toml_atomic(folder / f"{agent_id}.toml", data, mode=0o600)


def remove(machine: Machine, agent_id: str, name: str) -> bool:
    data = _read(machine, agent_id)
    if data.pop(name, None) is None:
        return False
    write_toml_atomic(machine.config_dir / "secrets" / f"{agent_id}.toml", data, mode=0o600)
    return True
