"""Boxes: named places an agent can move to, in ``~/.config/lnk/boxes.toml``.

    [boxes.pi]
    destination = "me@pi.local"         # anything ssh takes, aliases from ~/.ssh/config
    remote_lnk = "$HOME/.local/bin/lnk" # only when plain ``lnk`` isn't on the box's PATH

    [boxes.scratch]
    local = "/home/me/other-home"       # another HOME on this machine, no SSH

``add`` checks that the box answers and that its lnk speaks this one's stream
format; when lnk is missing there, older than this one or of another format,
it sends a wheel of the running lnk over the leg and installs it with
``python3 -m pip install --user``.  The two ends of a move must share the
stream format (``STREAM_FORMAT``), not the version: a dev build has none.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import tempfile
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w

import lnk
from lnk.agents.layout import Machine
from lnk.agents.settings import check_name
from lnk.errors import AlreadyExists, InvalidInput, NotFound, Refused, TransportError
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.places.wheel import build_wheel, install_wheel
from lnk.protocol import ServerReady, Version, decode
from lnk.transport.legs import Leg, LocalLeg, SshLeg

_registry_lock = threading.Lock()

USER_LNK = "$HOME/.local/bin/lnk"
"""Where ``pip install --user`` puts the lnk script, for a box whose PATH lacks it."""


@dataclass(frozen=True)
class Box:
    name: str
    destination: str | None = None
    local: Path | None = None
    remote_lnk: str | None = None

    def leg(self) -> Leg:
        if self.local is not None:
            return LocalLeg(self.local, name=f"box {self.name}")
        assert self.destination is not None
        return SshLeg(self.destination, remote_lnk=self.remote_lnk, name=self.name)

    @property
    def where(self) -> str:
        return f"local:{self.local}" if self.local is not None else str(self.destination)

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "name": self.name,
            "kind": "local" if self.local else "ssh",
            "where": self.where,
        }
        if self.remote_lnk:
            d["remote_lnk"] = self.remote_lnk
        return d


@dataclass(frozen=True)
class AddReport:
    box: Box
    action: str  # "found", "installed" or "upgraded"
    before: Version | None
    after: Version

    def describe(self) -> str:
        now = f"lnk {self.after.version} (stream format {self.after.stream_format})"
        if self.action == "found":
            return f"box {self.box.name} answers: {now}"
        if self.action == "upgraded" and self.before:
            return (
                f"box {self.box.name}: upgraded lnk {self.before.version} "
                f"(stream format {self.before.stream_format}) to {now}"
            )
        return f"box {self.box.name}: installed {now}"


# --- the registry ----------------------------------------------------------


def registry_path() -> Path:
    return Machine.current().config_dir / "boxes.toml"


def _load() -> dict[str, dict[str, str]]:
    path = registry_path()
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(
            f"{path} is not valid TOML: {e}",
            hint="fix or remove the file, then add the boxes again",
        ) from e
    boxes = data.get("boxes", {})
    if not isinstance(boxes, dict):
        raise InvalidInput(f"{path}: [boxes] must be a table", hint="fix or remove the file")
    return boxes


def _save(boxes: dict[str, dict[str, str]]) -> None:
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".boxes.", suffix=".toml")
    try:
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump({"boxes": boxes}, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _box(name: str, entry: dict[str, str]) -> Box:
    local = entry.get("local")
    return Box(
        name=name,
        destination=entry.get("destination"),
        local=Path(local) if local else None,
        remote_lnk=entry.get("remote_lnk"),
    )


def list_boxes() -> builtins.list[Box]:
    return [_box(n, e) for n, e in sorted(_load().items())]


def get(name: str) -> Box:
    entry = _load().get(check_name(name))
    if entry is None:
        raise NotFound(
            f"there is no box named {name!r}",
            hint="see lnk box list, or add it with lnk box add NAME DEST",
        )
    return _box(name, entry)


def remove(name: str) -> Box:
    boxes = _load()
    if check_name(name) not in boxes:
        raise NotFound(f"there is no box named {name!r}", hint="see lnk box list")
    box = _box(name, boxes.pop(name))
    _save(boxes)
    return box


def add(
    name: str,
    destination: str | None = None,
    local_dir: Path | str | None = None,
    *,
    install: bool = True,
) -> AddReport:
    """Register a box after checking it answers (and installing lnk there if needed)."""
    check_name(name)
    if (destination is None) == (local_dir is None):
        raise InvalidInput(
            "a box is either an SSH destination or a local directory",
            hint="lnk box add NAME DEST, or lnk box add NAME --local DIR",
        )
    boxes = _load()
    if name in boxes:
        raise AlreadyExists(
            f"there is already a box named {name!r} ({_box(name, boxes[name]).where})",
            hint=f"remove it first with lnk box remove {name}",
        )
    if local_dir is not None:
        path = Path(local_dir).expanduser().absolute()
        path.mkdir(parents=True, exist_ok=True)
        box = Box(name=name, local=path)
        info = remote_info(box.leg())
        report = AddReport(box, "found", info, info)
    else:
        assert destination is not None
        report = _add_ssh(Box(name=name, destination=destination), install)
    entry = (
        {"local": str(report.box.local)}
        if report.box.local
        else {"destination": str(report.box.destination)}
    )
    if report.box.remote_lnk:
        entry["remote_lnk"] = report.box.remote_lnk
    boxes[name] = entry
    _save(boxes)
    return report


# --- versions --------------------------------------------------------------


def remote_info(leg: Leg) -> Version:
    """The release and stream format of the lnk at a leg.

    Asks ``lnk version --json``; an lnk too old to have it answers
    ``lnk --version`` only, and its stream format is None (unknown).
    """
    r = leg.run(["version", "--json"], check=False, bare=True)
    if r.returncode == 0:
        return decode(r.stdout, Version, leg.name)
    if r.returncode != 2:
        leg.check(r.returncode, r.stderr.decode("utf-8", "replace"))
    r = leg.run(["--version"], bare=True)
    m = re.search(r"version\s+(\S+)", r.stdout.decode("utf-8", "replace"))
    if not m:
        raise TransportError(
            f"{leg.name} does not run lnk: 'lnk --version' said {r.stdout[:200]!r}",
            hint="set LNK_REMOTE_LNK to the lnk program there",
        )
    return Version(m.group(1), None)


def version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("."):
        m = re.match(r"\d+", p)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def needs_install(info: Version | None) -> bool:
    """Missing, older, or of another stream format (a dev build of the same version)."""
    if info is None:
        return True
    if info.stream_format != STREAM_FORMAT:
        return True
    return version_tuple(info.version) < version_tuple(lnk.__version__)


def _probe(leg: SshLeg) -> Version | None:
    try:
        return remote_info(leg)
    except TransportError as e:
        if "not installed" in e.message:
            return None
        raise


def _add_ssh(box: Box, install: bool) -> AddReport:
    leg = box.leg()
    assert isinstance(leg, SshLeg)
    before = _probe(leg)
    if before is None and "LNK_REMOTE_LNK" not in os.environ:
        user_leg = SshLeg(leg.destination, remote_lnk=USER_LNK, name=box.name)
        before = _probe(user_leg)
        if before is not None:
            box, leg = Box(box.name, box.destination, None, USER_LNK), user_leg
    if not needs_install(before):
        assert before is not None
        return AddReport(box, "found", before, before)
    if (
        before is not None
        and before.stream_format not in (None, STREAM_FORMAT)
        and version_tuple(before.version) > version_tuple(lnk.__version__)
    ):
        raise Refused(
            f"box {box.name} runs lnk {before.version} (stream format "
            f"{before.stream_format}), newer than this lnk {lnk.__version__} "
            f"(stream format {STREAM_FORMAT})",
            hint="upgrade lnk on this computer, then try again",
        )
    if not install:
        raise TransportError(
            f"box {box.name} needs lnk {lnk.__version__} installed",
            hint="add it again without --no-install",
        )
    install_wheel(leg, build_wheel())
    after = _probe(leg)
    if (after is None or needs_install(after)) and "LNK_REMOTE_LNK" not in os.environ:
        user_leg = SshLeg(leg.destination, remote_lnk=USER_LNK, name=box.name)
        after = _probe(user_leg)
        box = Box(box.name, box.destination, None, USER_LNK)
    if after is None or needs_install(after):
        raise TransportError(
            f"installed lnk {lnk.__version__} on box {box.name}, but it still answers "
            f"{after or 'nothing'}",
            hint="check PATH there, or set LNK_REMOTE_LNK to the installed lnk",
        )
    return AddReport(box, "installed" if before is None else "upgraded", before, after)


# --- a move's box: current before it sends -----------------------------------


def serves_this_lnk(ready: ServerReady) -> bool:
    """Whether a box's lnk server runs exactly this lnk (release and stream format)."""
    return ready.version == lnk.__version__ and ready.stream_format == STREAM_FORMAT


def ensure_current(box: Box, *, install: bool = True) -> AddReport:
    """Make the box speak this lnk before a move: upgrade an older or missing one.

    A local box runs this very lnk.  An SSH box is asked its version; one that
    is older or of another stream format gets the running lnk installed, as
    ``box add`` does (and the registry learns where, if it went to ``~/.local``).
    """
    if box.local is not None:
        here = Version(lnk.__version__, STREAM_FORMAT)
        return AddReport(box, "found", here, here)
    report = _add_ssh(box, install)
    if report.box.remote_lnk != box.remote_lnk:
        with _registry_lock:  # a move checks its two ends at once
            boxes = _load()
            if box.name in boxes:
                boxes[box.name]["remote_lnk"] = str(report.box.remote_lnk)
                _save(boxes)
    return report


list = list_boxes  # the registry's verbs: add, list, get, remove (boxes.list())
