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
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

from lnk.agents.layout import Machine
from lnk.agents.registry import LAST_BACKUP as LAST
from lnk.agents.registry import Agent
from lnk.backup.maintenance import RULES
from lnk.errors import InvalidInput

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


def lnk_command() -> list[str]:
    exe = shutil.which("lnk")
    return [exe] if exe else [sys.executable, "-m", "lnk"]


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


def timer_text(agent: Agent, every: int) -> str:
    return (
        f"[Unit]\nDescription=lnk backup of the agent {agent.name}, every {every}s\n\n"
        f"[Timer]\nOnBootSec=5min\nOnUnitActiveSec={every}s\n"
        f"Unit={unit_name(agent)}.service\n\n[Install]\nWantedBy=timers.target\n"
    )


def plist_text(agent: Agent, args: list[str], every: int) -> str:
    items = "".join(f"    <string>{escape(a)}</string>\n" for a in args)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" '
        '"http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n<plist version="1.0">\n<dict>\n'
        f"  <key>Label</key><string>com.lnk.backup.{agent.id}</string>\n"
        f"  <key>ProgramArguments</key>\n  <array>\n{items}  </array>\n"
        f"  <key>StartInterval</key><integer>{every}</integer>\n"
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
    doc = {
        "time": datetime.now(UTC).isoformat(),
        "ok": ok,
        "error": error,
        "snapshot": snapshot,
        "url": url,
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
