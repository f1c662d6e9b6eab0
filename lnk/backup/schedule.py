"""Backups on a schedule: a systemd user timer, a launchd agent, or a crontab line.

    ~/.config/systemd/user/lnk-backup-<id>.service   runs one scheduled backup
    ~/.config/systemd/user/lnk-backup-<id>.timer     every --every
    ~/Library/LaunchAgents/com.lnk.backup.<id>.plist (macOS)

A scheduled run is ``lnk agent backup --agent NAME --to URL --scheduled
[--keep RULES]``: a backup, then a prune with the retention.  Its result is
recorded in ``~/.lnk/agents/<id>/backup-last.json`` (time, ok, error), which
``lnk agent status`` shows, and a line goes to the agent's log.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from lnk.agents.layout import Machine
from lnk.agents.registry import LAST_BACKUP as LAST
from lnk.agents.registry import Agent, last_backup
from lnk.backup.maintenance import RULES
from lnk.errors import BackupError, InvalidInput

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


def run_args(agent: Agent, url: str, keep: dict[str, int]) -> list[str]:
    args = [*lnk_command(), "agent", "backup", "--agent", agent.name, "--to", url, "--scheduled"]
    if keep:
        args += ["--keep", keep_text(keep)]
    return args


def cron_spec(every: int) -> str:
    minutes = every // 60
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = minutes // 60
    if hours < 24:
        return f"0 */{hours} * * *"
    return f"0 3 */{hours // 24} * *"


@dataclass
class Schedule:
    agent: str
    url: str
    every_s: int
    keep: dict[str, int]
    command: list[str]
    files: list[str] = field(default_factory=list)
    installed: bool = False  # the timer / launchd agent is active
    crontab: str = ""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def unit_name(agent: Agent) -> str:
    return f"lnk-backup-{agent.id}"


def service_text(agent: Agent, args: list[str]) -> str:
    return (
        f"[Unit]\nDescription=lnk backup of the agent {agent.name}\n\n"
        f"[Service]\nType=oneshot\nExecStart={shlex.join(args)}\n"
    )


def on_calendar(every: int) -> str:
    """A systemd calendar expression for ``every`` seconds (whole minutes, hours or
    days; at fixed wall-clock times, so ``Persistent=true`` can catch up a run missed
    while the machine was off or asleep)."""
    minutes = every // 60
    if minutes < 60:
        return f"*-*-* *:00/{minutes}:00"
    hours = minutes // 60
    if hours < 24:
        return f"*-*-* 00/{hours}:00:00"
    return f"*-*-01/{hours // 24} 03:00:00"


def calendar_points(every: int) -> list[dict[str, int]]:
    """launchd ``StartCalendarInterval`` entries for ``every`` seconds: launchd runs a
    calendar job missed while the machine slept when it wakes (StartInterval does not)."""
    minutes = every // 60
    if minutes < 60:
        return [{"Minute": m} for m in range(0, 60, minutes)]
    hours = minutes // 60
    if hours < 24:
        return [{"Hour": h, "Minute": 0} for h in range(0, 24, hours)]
    return [{"Day": d, "Hour": 3, "Minute": 0} for d in range(1, 32, hours // 24)]


def timer_text(agent: Agent, every: int) -> str:
    return (
        f"[Unit]\nDescription=lnk backup of the agent {agent.name}, every {every}s\n\n"
        f"[Timer]\nOnCalendar={on_calendar(every)}\nPersistent=true\n"
        f"Unit={unit_name(agent)}.service\n\n[Install]\nWantedBy=timers.target\n"
    )


def plist_text(agent: Agent, args: list[str], every: int) -> str:
    items = "".join(f"    <string>{escape(a)}</string>\n" for a in args)
    points = "".join(
        "    <dict>"
        + "".join(f"<key>{k}</key><integer>{v}</integer>" for k, v in p.items())
        + "</dict>\n"
        for p in calendar_points(every)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" '
        '"http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n<plist version="1.0">\n<dict>\n'
        f"  <key>Label</key><string>com.lnk.backup.{agent.id}</string>\n"
        f"  <key>ProgramArguments</key>\n  <array>\n{items}  </array>\n"
        f"  <key>StartCalendarInterval</key>\n  <array>\n{points}  </array>\n"
        "  <key>RunAtLoad</key><false/>\n</dict>\n</plist>\n"
    )


def user_systemd_running() -> bool:
    try:
        p = subprocess.run(
            ["systemctl", "--user", "is-system-running"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.stdout.strip() in ("running", "degraded", "starting")


def install(
    machine: Machine,
    agent: Agent,
    url: str,
    every: int,
    keep: dict[str, int],
    *,
    platform: str | None = None,
) -> Schedule:
    args = run_args(agent, url, keep)
    sched = Schedule(agent.name, url, every, keep, args)
    sched.crontab = f"{cron_spec(every)} {shlex.join(args)}"
    if (platform or sys.platform) == "darwin":
        path = machine.home / "Library" / "LaunchAgents" / f"com.lnk.backup.{agent.id}.plist"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plist_text(agent, args, every))
        sched.files.append(str(path))
        p = subprocess.run(["launchctl", "load", "-w", str(path)], capture_output=True, text=True)
        sched.installed = p.returncode == 0
        sched.note = "" if sched.installed else f"launchctl load failed: {p.stderr.strip()}"
        return sched
    d = machine.home / ".config" / "systemd" / "user"
    d.mkdir(parents=True, exist_ok=True)
    for suffix, text in (
        ("service", service_text(agent, args)),
        ("timer", timer_text(agent, every)),
    ):
        path = d / f"{unit_name(agent)}.{suffix}"
        path.write_text(text)
        sched.files.append(str(path))
    if not user_systemd_running():
        sched.note = (
            "no systemd user manager runs here (systemctl --user is-system-running), "
            "so the timer is written but not active; add this line to your crontab "
            "(crontab -e) instead"
        )
        return sched
    for cmd in (["daemon-reload"], ["enable", "--now", f"{unit_name(agent)}.timer"]):
        p = subprocess.run(["systemctl", "--user", *cmd], capture_output=True, text=True)
        if p.returncode != 0:
            sched.note = f"systemctl --user {' '.join(cmd)} failed: {p.stderr.strip()}"
            return sched
    sched.installed = True
    return sched


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
