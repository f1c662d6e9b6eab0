"""The timers that run scheduled backups, keyed by the agent's ID.

    ~/.config/systemd/user/lnk-backup-<id>.service   runs one scheduled backup
    ~/.config/systemd/user/lnk-backup-<id>.timer     every --every
    ~/Library/LaunchAgents/com.lnk.backup.<id>.plist (macOS)
    ~/.config/lnk/schedules/<id>.toml                what they run: url, every, keep

A schedule belongs to the agent (its ID), not to the machine: when the agent
moves away its timer here is removed (:func:`uninstall`, at ``moved-away``),
and the move installs the same schedule where it went.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.agents.settings import write_toml_atomic
from lnk.backup.schedule import keep_text, lnk_command


def run_args(agent: Agent, url: str, keep: dict[str, int]) -> list[str]:
    """The scheduled run: the agent by its ID (a namesake that arrives later is another)."""
    args = [*lnk_command(), "agent", "backup", "--agent-id", agent.id, "--to", url, "--scheduled"]
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


def record_path(machine: Machine, agent_id: str) -> Path:
    return machine.config_dir / "schedules" / f"{agent_id}.toml"


def read_schedule(machine: Machine, agent_id: str) -> dict[str, Any] | None:
    """The agent's schedule here ({agent, url, every_s, keep}), or None."""
    try:
        with open(record_path(machine, agent_id), "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    keep = data.get("keep")
    if not isinstance(data.get("url"), str) or not isinstance(data.get("every_s"), int):
        return None
    return {
        "agent": str(data.get("agent", "")),
        "url": data["url"],
        "every_s": data["every_s"],
        "keep": {str(k): int(v) for k, v in keep.items()} if isinstance(keep, dict) else {},
    }


def _files(machine: Machine, agent_id: str) -> list[Path]:
    unit = f"lnk-backup-{agent_id}"
    d = machine.home / ".config" / "systemd" / "user"
    plist = machine.home / "Library" / "LaunchAgents" / f"com.lnk.backup.{agent_id}.plist"
    return [d / f"{unit}.service", d / f"{unit}.timer", plist]


def uninstall(machine: Machine, agent_id: str) -> list[str]:
    """Stop and remove the agent's timer here; the files it removed (none: no schedule)."""
    files = [p for p in _files(machine, agent_id) if p.exists()]
    unit = f"lnk-backup-{agent_id}.timer"
    if files and files[0].suffix != ".plist" and user_systemd_running():
        subprocess.run(["systemctl", "--user", "disable", "--now", unit], capture_output=True)
    for p in files:
        if p.suffix == ".plist":
            subprocess.run(["launchctl", "unload", "-w", str(p)], capture_output=True)
        p.unlink(missing_ok=True)
    record = record_path(machine, agent_id)
    if record.exists():
        record.unlink()
        files.append(record)
    return [str(p) for p in files]


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
    record = record_path(machine, agent.id)
    record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_toml_atomic(record, {"agent": agent.name, "url": url, "every_s": every, "keep": keep})
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
