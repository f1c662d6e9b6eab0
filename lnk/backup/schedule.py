"""Backups on a schedule: a systemd user timer, a launchd agent, or a crontab line.

    ~/.config/systemd/user/lnk-backup-<id>.service   runs one scheduled backup
    ~/.config/systemd/user/lnk-backup-<id>.timer     every --every
    ~/Library/LaunchAgents/com.lnk.backup.<id>.plist (macOS)

A scheduled run is ``lnk agent backup --agent-id ID --to URL --scheduled
[--keep RULES]``: a backup, then a prune with the retention (the timers:
:mod:`lnk.backup.timers`).  Its result is recorded in
``~/.lnk/agents/<id>/backup-last.json`` (time, ok, error), which ``lnk agent
status`` shows, and a line goes to the agent's log; the run of an agent that is
not here any more fails with a line in ``~/.lnk/schedules/<id>.json``, which
``lnk agent backup status`` shows, and on stderr (the system's journal).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lnk.agents import secrets
from lnk.agents.layout import Machine
from lnk.agents.moved import lives_elsewhere
from lnk.agents.registry import LAST_BACKUP as LAST
from lnk.agents.registry import Agent, find_by_id, last_backup
from lnk.backup.maintenance import RULES
from lnk.errors import BackupError, InvalidInput, NotFound

_EVERY = re.compile(r"^(\d+)([mhd])$")


def parse_every(text: str) -> int:
    """``30m``, ``6h``, ``1d`` -> seconds (at least 5 minutes)."""
    m = _EVERY.match(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise InvalidInput(
            f"--every {text!r} is not an interval",
            hint="write it as a number and m, h or d, e.g. 6h",
        )
    secs = int(m.group(1)) * {"m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if secs < 300:
        raise InvalidInput(f"--every {text} is too often", hint="back up at most every 5m")
    return secs


def parse_keep(text: str | None) -> dict[str, int]:
    """``daily=7,weekly=4`` -> {"daily": 7, "weekly": 4}."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, n = part.strip().partition("=")
        if name not in RULES or not n.isdigit():
            raise InvalidInput(
                f"--keep {part!r} is not a rule",
                hint=f"write RULE=N,... with rules {', '.join(RULES)}",
            )
        out[name] = int(n)
    return out


def keep_text(keep: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in keep.items())


def lnk_command(argv0: str | None = None) -> list[str]:
    """The running lnk program, by its absolute path: a schedule runs the lnk that
    wrote it, never whichever ``lnk`` comes first on a PATH.  Run as a module
    (``python -m lnk``), it is this Python with ``-m lnk``."""
    arg = sys.argv[0] if argv0 is None else argv0
    path = Path(arg)
    if arg and path.name not in ("__main__.py", "-c") and path.is_file():
        return [str(path.resolve())]
    return [str(Path(sys.executable).resolve()), "-m", "lnk"]


# ---- a scheduled run of an agent that is not here ------------------------------------
BUCKET_SECRETS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
)
"""The agent's secrets a scheduled run uses for its bucket: a box's key for the agent's
bucket, which reaches its objects only (docs/buckets.md)."""


def _absent_path(machine: Machine, agent_id: str) -> Path:
    return machine.state_dir / "schedules" / f"{agent_id}.json"


def scheduled_agent(machine: Machine, agent_id: str, url: str) -> Agent:
    """The agent a scheduled run backs up; when it is not here, the failure is recorded
    where ``lnk agent backup status`` finds it (by the agent's name too) and raised."""
    a = find_by_id(machine, agent_id)
    if a is not None:
        _absent_path(machine, agent_id).unlink(missing_ok=True)
        return a
    where = lives_elsewhere(machine, agent_id)
    name = str((read_schedule_name(machine, agent_id)) or agent_id)
    error = f"the agent {name} ({agent_id}) is not on this machine" + (
        f": {where}" if where else ""
    )
    path = _absent_path(machine, agent_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC).isoformat()
    path.write_text(
        json.dumps({"agent": name, "id": agent_id, "time": now, "url": url, "error": error})
    )
    raise NotFound(
        f"scheduled backup to {url}: {error}",
        hint=f"remove this machine's timer: lnk agent backup schedule --agent-id {agent_id} --remove",
    )


def read_schedule_name(machine: Machine, agent_id: str) -> str | None:
    """The agent's name as its schedule here recorded it."""
    try:
        with open(machine.config_dir / "schedules" / f"{agent_id}.toml", "rb") as f:
            name = tomllib.load(f).get("agent")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    return str(name) if name else None


def absent_runs(machine: Machine, name: str) -> list[dict[str, Any]]:
    """The scheduled runs that found an agent of this name (or ID) not here."""
    d = machine.state_dir / "schedules"
    out: list[dict[str, Any]] = []
    for p in sorted(d.glob("ag-*.json")) if d.is_dir() else []:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and name in (doc.get("agent"), doc.get("id")):
            out.append(doc)
    return out


def bucket_env(machine: Machine, agent: Agent) -> dict[str, str]:
    """The agent's own key for its bucket (its secrets), for a scheduled run."""
    return {
        name: value
        for name in BUCKET_SECRETS
        if (value := secrets.get(machine, agent.id, name)) is not None
    }


# ---- the result of a scheduled run --------------------------------------------------
def record_result(
    agent: Agent,
    ok: bool,
    error: str | None = None,
    snapshot: str | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    before = last_backup(agent.runtime) or {}
    doc = {
        "time": now,
        "ok": ok,
        "error": error,
        "snapshot": snapshot,
        "url": url,
        # the last run that succeeded (this one, or the one a failure follows)
        "last_ok": now
        if ok
        else before.get("last_ok", before.get("time") if before.get("ok") else None),
    }
    agent.runtime.mkdir(parents=True, exist_ok=True)
    tmp = agent.runtime / (LAST + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, agent.runtime / LAST)
    line = f"{doc['time']} lnk backup to {url}: " + (
        f"ok, snapshot {snapshot}" if ok else f"FAILED: {error}"
    )
    with open(agent.runtime / "harness.log", "a") as f:
        f.write(line + "\n")
    return doc


_AGE = re.compile(r"^(\d+)([smhdw])$")


def parse_age(text: str) -> timedelta:
    """``90m``, ``12h``, ``2d``, ``1w`` -> a timedelta."""
    m = _AGE.match(text.strip())
    if not m:
        raise InvalidInput(
            f"--max-age {text!r} is not an age", hint="write a number and s, m, h, d or w, e.g. 2d"
        )
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
    return timedelta(seconds=int(m.group(1)) * unit)


class BackupStale(BackupError):
    """The agent's last successful backup is too old, or there is none (monitoring)."""


def backup_status(
    agent: Agent, max_age: str | None = None, *, now: datetime | None = None
) -> dict[str, Any]:
    """The agent's last backup run and last success; with ``max_age`` raises
    :class:`BackupStale` (exit 13) when the last success is older or never was."""
    age = parse_age(max_age) if max_age else None
    last = last_backup(agent.runtime) or {}
    ok_at = last.get("last_ok") or (last.get("time") if last.get("ok") else None)
    now = now or datetime.now(UTC)
    when = _parse_time(ok_at)
    out: dict[str, Any] = {
        "agent": agent.name,
        "id": agent.id,
        "last_run": last.get("time"),
        "last_run_ok": last.get("ok"),
        "error": last.get("error"),
        "url": last.get("url"),
        "snapshot": last.get("snapshot") if last.get("ok") else None,
        "last_ok": when.isoformat() if when else None,
        "age_s": int((now - when).total_seconds()) if when else None,
        "max_age_s": int(age.total_seconds()) if age else None,
    }
    out["stale"] = age is not None and (when is None or now - when > age)
    return out


def check_status(status: dict[str, Any]) -> None:
    """Raise :class:`BackupStale` when ``status`` (from :func:`backup_status`) is stale."""
    if not status["stale"]:
        return
    name = status["agent"]
    if status["last_ok"] is None:
        raise BackupStale(
            f"{name} has no successful backup"
            + (f" (the last run failed: {status['error']})" if status["error"] else ""),
            hint=f"lnk agent backup --agent {name} --to URL",
        )
    raise BackupStale(
        f"the last successful backup of {name} is {status['age_s'] // 3600} h old "
        f"({status['last_ok']}), more than --max-age allows",
        hint="see lnk agent logs for the failed runs, or run a backup now",
    )


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)
