"""An agent's provider keys: ``~/.config/lnk/secrets/<agent id>.toml`` (0600).

Kept under ``~/.config/lnk``, which no sandbox shows, and read only by the
agent's proxy outside its sandbox, which adds the key to the requests it
forwards to the agent's model (``lnk agent secret set``).  A key is named as
the ``[model] key_env`` names it (``OPENAI_API_KEY`` by default).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from lnk.agents.layout import Machine
from lnk.agents.settings import ID_RE, write_toml_atomic
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


def _path(machine: Machine, agent_id: str) -> Path:
    if not ID_RE.match(agent_id):
        raise InvalidInput(f"{agent_id!r} is not an agent's ID", hint="an ID is ag- and 20 letters")
    return machine.config_dir / "secrets" / f"{agent_id}.toml"


def _read(machine: Machine, agent_id: str) -> dict[str, str]:
    path = _path(machine, agent_id)
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


def _check_value(name: str, value: str) -> str:
    value = value.strip()
    if not value or len(value.encode()) > MAX_SECRET_BYTES or "\n" in value:
        raise InvalidInput(
            f"the value for {name} is empty, more than one line, or too long",
            hint='pipe the key alone: printf %s "$KEY" | lnk agent secret set NAME',
        )
    return value


def _write(machine: Machine, agent_id: str, data: dict[str, str]) -> None:
    path = _path(machine, agent_id)
    if not data:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    write_toml_atomic(path, data, mode=0o600)


def set_secret(machine: Machine, agent_id: str, name: str, value: str) -> None:
    check_name(name)
    data = _read(machine, agent_id)
    data[name] = _check_value(name, value)
    _write(machine, agent_id, data)


def remove(machine: Machine, agent_id: str, name: str) -> bool:
    data = _read(machine, agent_id)
    if data.pop(name, None) is None:
        return False
    _write(machine, agent_id, data)
    return True


def remove_all(machine: Machine, agent_id: str) -> list[str]:
    """Forget every secret of the agent here (it is removed, or it moved away)."""
    gone = names(machine, agent_id)
    _path(machine, agent_id).unlink(missing_ok=True)
    return gone


def export(machine: Machine, agent_id: str) -> dict[str, str]:
    """Every secret of the agent, for its move (carried over the legs, never a stream)."""
    return _read(machine, agent_id)


def import_all(machine: Machine, agent_id: str, doc: object) -> list[str]:
    """Keep what :func:`export` gave at the other end (checked as ``set`` checks one)."""
    if not isinstance(doc, dict) or len(doc) > 64:
        raise InvalidInput("the secrets sent are not a small JSON object of names and values")
    data = _read(machine, agent_id)
    for name, value in doc.items():
        if not isinstance(value, str):
            raise InvalidInput(f"the secret {name!r} sent is not a text")
        data[check_name(str(name))] = _check_value(str(name), value)
    _write(machine, agent_id, data)
    return sorted(str(n) for n in doc)
