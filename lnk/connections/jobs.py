"""An agent's jobs: ``Agent/schedule/<job>.toml``, one file a job, and the instants each is due.

    # Agent/schedule/morning.toml: every day at 9 in Paris
    cron = "0 9 * * *"              # five fields; a sixth is seconds (croniter's)
    tz = "Europe/Paris"             # an IANA zone (default UTC): DST as the zone has it
    message = "What is on today?"
    thread = "telegram"             # optional: "schedule:<job>" (default), "link:<name>",
                                    # or "telegram" (the owner's chat: the answer goes there)
    catch_up = "1h"                 # optional: a missed slot this recent still fires (default 1h)

    # Agent/schedule/dentist.toml: once
    at = "2026-12-03T09:00:00+01:00"   # with its UTC offset
    message = "Remind me of the dentist at 10"

The agent writes this folder from its sandbox, so every file is foreign text: read
without following a link, at most :data:`MAX_FILE` bytes, checked field by field.  A
file that doesn't fit is refused with one line naming it and why (logged once per
version of the file), never a crash; the other jobs go on.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from lnk.text import one_line

JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
THREAD_RE = re.compile(r"^(schedule|link):[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DURATION_RE = re.compile(r"^(\d{1,6})([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_FILE = 64 * 1024
MAX_JOBS = 200
MAX_MESSAGE = 16_384
DEFAULT_CATCH_UP = 3600.0
MAX_CATCH_UP = 7 * 86400.0
KEYS = {"cron", "tz", "at", "message", "thread", "catch_up", "enabled"}


class JobRefused(ValueError):
    """A job file that doesn't fit the format: its one line says why."""


@dataclass(frozen=True)
class Job:
    name: str
    message: str
    thread: str  # "schedule:<job>", "link:<name>" or "telegram"
    cron: str | None = None
    tz: tzinfo = UTC
    at: float | None = None  # a one-shot's instant (unix seconds)
    catch_up: float = DEFAULT_CATCH_UP
    enabled: bool = True

    def due(self, after: float, until: float, limit: int = 1000) -> list[float]:
        """The job's instants in (after, until], oldest first, at most ``limit`` of the
        newest (unix seconds)."""
        if self.at is not None:
            return [self.at] if after < self.at <= until else []
        assert self.cron is not None
        if until <= after:
            return []
        start = datetime.fromtimestamp(after, self.tz)
        it = croniter(self.cron, start)
        out: list[float] = []
        while True:
            t = float(it.get_next(float))
            if t > until:
                return out
            if t > after:
                out.append(t)
                if len(out) > limit:
                    del out[0]

    def next_after(self, after: float) -> float:
        """When the job is next due after ``after`` (inf if never)."""
        if self.at is not None:
            return self.at if self.at > after else math.inf
        assert self.cron is not None
        return float(croniter(self.cron, datetime.fromtimestamp(after, self.tz)).get_next(float))


def _duration(value: object) -> float:
    m = DURATION_RE.match(value) if isinstance(value, str) else None
    if m is None:
        raise JobRefused('catch_up is not a duration like "90s", "30m", "1h" or "2d"')
    seconds = float(int(m[1]) * UNITS[m[2]])
    if seconds > MAX_CATCH_UP:
        raise JobRefused("catch_up is longer than 7 days")
    return seconds


def parse_job(name: str, data: dict[str, object]) -> Job:
    """A job from its file's TOML, checked; JobRefused naming the first thing wrong."""
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise JobRefused(
            f"unknown key {one_line(unknown[0], 40)!r} (known: {', '.join(sorted(KEYS))})"
        )
    message = data.get("message")
    if not isinstance(message, str) or not message.strip() or len(message) > MAX_MESSAGE:
        raise JobRefused(f"message is not a text of 1 to {MAX_MESSAGE} characters")
    thread = data.get("thread", f"schedule:{name}")
    if not isinstance(thread, str) or not (thread == "telegram" or THREAD_RE.match(thread)):
        raise JobRefused('thread is not "telegram", "schedule:NAME" or "link:NAME"')
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise JobRefused("enabled is not true or false")
    catch_up = _duration(data["catch_up"]) if "catch_up" in data else DEFAULT_CATCH_UP
    cron, at = data.get("cron"), data.get("at")
    if (cron is None) == (at is None):
        raise JobRefused("a job has either cron (repeating) or at (once), and not both")
    tz_name = data.get("tz", "UTC")
    if not isinstance(tz_name, str) or len(tz_name) > 64:
        raise JobRefused("tz is not a time zone's name")
    try:
        tz: tzinfo = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise JobRefused(f"tz {one_line(tz_name, 64)!r} is not a time zone here") from None
    if cron is not None:
        if not isinstance(cron, str) or len(cron) > 200 or not croniter.is_valid(cron):
            raise JobRefused("cron is not a cron expression (five fields, or six with seconds)")
        return Job(name, message, thread, cron=cron, tz=tz, catch_up=catch_up, enabled=enabled)
    when = at
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            raise JobRefused("at is not a date and time (2026-12-03T09:00:00+01:00)") from None
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise JobRefused("at has no UTC offset (write 2026-12-03T09:00:00+01:00)")
    return Job(name, message, thread, at=when.timestamp(), catch_up=catch_up, enabled=enabled)


def _read(path: Path) -> dict[str, object]:
    """A job file's TOML, never through a link, at most MAX_FILE bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JobRefused("it is not a regular file")
        raw = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE:
        raise JobRefused(f"it is larger than {MAX_FILE} bytes")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise JobRefused(f"it is not TOML ({one_line(str(e), 120)})") from None


def read_jobs(folder: Path) -> Iterator[tuple[str, Job | JobRefused, tuple[int, int]]]:
    """Each ``*.toml`` in the folder: its name, its job or why it is refused, and its
    version (mtime, size: a refusal is told once per version)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    n = 0
    for entry in entries:
        if not entry.name.endswith(".toml") or entry.name.startswith("."):
            continue
        n += 1
        name = entry.name[: -len(".toml")]
        try:
            st = entry.stat(follow_symlinks=False)
            version = (st.st_mtime_ns, st.st_size)
        except OSError:
            continue
        if n > MAX_JOBS:
            yield name, JobRefused(f"more than {MAX_JOBS} jobs in the folder"), version
            continue
        if not JOB_RE.match(name):
            yield name, JobRefused("a job's name is 1-64 letters, digits, '_' or '-'"), version
            continue
        try:
            yield name, parse_job(name, _read(Path(entry.path))), version
        except JobRefused as e:
            yield name, e, version
        except OSError as e:
            yield name, JobRefused(f"it can't be read ({type(e).__name__})"), version
