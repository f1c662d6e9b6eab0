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

import base64
import builtins
import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import tomli_w

import lnk
from lnk.agents.layout import Machine
from lnk.agents.settings import check_name
from lnk.errors import AlreadyExists, InvalidInput, LnkError, NotFound, Refused, TransportError
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.transport.legs import Leg, LocalLeg, SshLeg

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
    before: dict[str, object] | None
    after: dict[str, object]

    def describe(self) -> str:
        now = f"lnk {self.after['version']} (stream format {self.after['stream_format']})"
        if self.action == "found":
            return f"box {self.box.name} answers: {now}"
        if self.action == "upgraded" and self.before:
            return (
                f"box {self.box.name}: upgraded lnk {self.before.get('version')} "
                f"(stream format {self.before.get('stream_format')}) to {now}"
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


def remote_info(leg: Leg) -> dict[str, object]:
    """``{"version": ..., "stream_format": ...}`` of the lnk at a leg.

    Asks ``lnk version --json``; an lnk too old to have it answers
    ``lnk --version`` only, and its stream format is None (unknown).
    """
    r = leg.run(["version", "--json"], check=False, bare=True)
    if r.returncode == 0:
        try:
            data = json.loads(r.stdout)
            return {"version": str(data["version"]), "stream_format": data.get("stream_format")}
        except (ValueError, KeyError, TypeError):
            pass
    elif r.returncode != 2:
        leg.check(r.returncode, r.stderr.decode("utf-8", "replace"))
    r = leg.run(["--version"], bare=True)
    m = re.search(r"version\s+(\S+)", r.stdout.decode("utf-8", "replace"))
    if not m:
        raise TransportError(
            f"{leg.name} does not run lnk: 'lnk --version' said {r.stdout[:200]!r}",
            hint="set LNK_REMOTE_LNK to the lnk program there",
        )
    return {"version": m.group(1), "stream_format": None}


def version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("."):
        m = re.match(r"\d+", p)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def needs_install(info: dict[str, object] | None) -> bool:
    """Missing, older, or of another stream format (a dev build of the same version)."""
    if info is None:
        return True
    if info.get("stream_format") != STREAM_FORMAT:
        return True
    return version_tuple(str(info["version"])) < version_tuple(lnk.__version__)


def _probe(leg: SshLeg) -> dict[str, object] | None:
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
        and before.get("stream_format") not in (None, STREAM_FORMAT)
        and version_tuple(str(before["version"])) > version_tuple(lnk.__version__)
    ):
        raise Refused(
            f"box {box.name} runs lnk {before['version']} (stream format "
            f"{before['stream_format']}), newer than this lnk {lnk.__version__} "
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


def ensure_current(box: Box, *, install: bool = True) -> AddReport:
    """Make the box speak this lnk before a move: upgrade an older or missing one.

    A local box runs this very lnk.  An SSH box is asked its version; one that
    is older or of another stream format gets the running lnk installed, as
    ``box add`` does (and the registry learns where, if it went to ``~/.local``).
    """
    if box.local is not None:
        info = {"version": lnk.__version__, "stream_format": STREAM_FORMAT}
        return AddReport(box, "found", info, info)
    report = _add_ssh(box, install)
    if report.box.remote_lnk != box.remote_lnk:
        boxes = _load()
        if box.name in boxes:
            boxes[box.name]["remote_lnk"] = str(report.box.remote_lnk)
            _save(boxes)
    return report


# --- the agents on every box --------------------------------------------------


@dataclass
class BoxAgents:
    """What one box said about its own agents: rows of ``agent list --json``, or why not."""

    box: str
    agents: builtins.list[dict[str, Any]] | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.agents is not None


def _ask_agents(box: Box, timeout: float) -> BoxAgents:
    leg = box.leg()
    for args in (["agent", "list", "--here", "--json"], ["agent", "list", "--json"]):
        try:
            p = leg.popen(args)
        except LnkError as e:
            return BoxAgents(box.name, error=e.message)
        with p:
            try:
                out = p.read_answer(timeout=timeout)
            except (LnkError, subprocess.TimeoutExpired) as e:
                why = e.message if isinstance(e, LnkError) else "no answer in time"
                return BoxAgents(box.name, error=why)
            if p.proc.returncode == 2 and "--here" in args:
                continue  # an lnk older than --here: its own agents are the rows placed "here"
            try:
                leg.check(p.proc.returncode, p.stderr_text())
                rows = json.loads(out)
                if isinstance(rows, dict):
                    rows = rows.get("agents")
                if not isinstance(rows, builtins.list):
                    raise ValueError("not a list of agents")
            except LnkError as e:
                return BoxAgents(box.name, error=e.message)
            except ValueError as e:
                return BoxAgents(box.name, error=f"an answer that is not an agent list ({e})")
        return BoxAgents(
            box.name,
            agents=[r for r in rows if isinstance(r, dict) and r.get("place", "here") == "here"],
        )
    return BoxAgents(box.name, error="no answer")


def agents_on_boxes(timeout: float = 20.0) -> builtins.list[BoxAgents]:
    """Ask every added box, at once, which agents live there (its own, not its boxes')."""
    found = list_boxes()
    if not found:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(found))) as pool:
        return builtins.list(pool.map(lambda b: _ask_agents(b, timeout), found))


# --- installing lnk on a box -------------------------------------------------


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _package_files() -> builtins.list[tuple[str, Path]]:
    root = Path(lnk.__file__).parent
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root.parent).as_posix()
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            files.append((rel, p))
    return files


def _metadata_text() -> str:
    lines = [
        "Metadata-Version: 2.1",
        "Name: lnk",
        f"Version: {lnk.__version__}",
        "Summary: Carry AI agents' state between machines and into and out of buckets",
    ]
    try:
        meta = metadata.metadata("lnk")
        if meta["Requires-Python"]:
            lines.append(f"Requires-Python: {meta['Requires-Python']}")
        lines += [
            f"Requires-Dist: {r}"
            for r in (meta.get_all("Requires-Dist") or [])
            if "extra ==" not in r
        ]
    except metadata.PackageNotFoundError:
        pass
    return "\n".join(lines) + "\n"


def build_wheel() -> Path:
    """A wheel of the running lnk's own files, cached under ``~/.lnk/cache/wheels/``.

    Built by hand (a zip with dist-info), so it needs neither the source tree
    nor a build tool; keyed by a hash of the files, since a dev build changes
    without a new version.
    """
    files = _package_files()
    meta = _metadata_text()
    key = hashlib.sha256(meta.encode())
    for rel, p in files:
        key.update(rel.encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                key.update(chunk)
    wheel_name = f"lnk-{lnk.__version__}-py3-none-any.whl"
    out = Machine.current().state_dir / "cache" / "wheels" / key.hexdigest()[:16] / wheel_name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    dist = f"lnk-{lnk.__version__}.dist-info"
    extra = {
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: lnk\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{dist}/entry_points.txt": "[console_scripts]\nlnk = lnk.cli.main:main\n",
    }
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    record = []
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
            for rel, p in files:
                h = hashlib.sha256()
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with p.open("rb") as src, z.open(info, "w") as dst:
                    for chunk in iter(lambda: src.read(1 << 16), b""):
                        h.update(chunk)
                        dst.write(chunk)
                record.append(f"{rel},sha256={_b64(h.digest())},{p.stat().st_size}")
            for rel, text in extra.items():
                data = text.encode()
                z.writestr(rel, data)
                record.append(f"{rel},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}")
            record.append(f"{dist}/RECORD,,")
            z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return out


def install_script(wheel_name: str) -> str:
    """The shell line run on the box: wheel on stdin, pip install --user."""
    w = shlex.quote(wheel_name)
    pip = (
        "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_BREAK_SYSTEM_PACKAGES=1 "
        "python3 -m pip install --user --quiet"
    )
    return (
        'command -v python3 >/dev/null || { echo "python3 is not installed" >&2; exit 90; }; '
        'python3 -m pip --version >/dev/null 2>&1 || { echo "pip is not installed" >&2; exit 91; }; '
        'd=$(mktemp -d "${TMPDIR:-/tmp}/lnk-install.XXXXXX") || exit 92; '
        "trap 'rm -rf \"$d\"' EXIT; "
        f'cat > "$d"/{w} && '
        f'{pip} --force-reinstall --no-deps "$d"/{w} && {pip} "$d"/{w}'
    )


def install_wheel(leg: Leg, wheel: Path) -> None:
    """Send the wheel over the leg (stdin) and install it there for the user."""
    with wheel.open("rb") as f:
        r = leg.run_shell(install_script(wheel.name), stdin=f, check=False)
    if r.returncode == 0:
        return
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode == 255:
        leg.check(r.returncode, err)
    need = {
        90: "install python3 (3.11 or later) on it",
        91: "install pip there (e.g. apt-get install python3-pip)",
    }
    lines = [ln for ln in err.splitlines() if ln.strip()]
    raise TransportError(
        f"installing lnk on {leg.name} failed: {lines[-1] if lines else f'exit {r.returncode}'}",
        hint=need.get(
            r.returncode,
            "run 'python3 -m pip install --user lnk' there by hand, or set LNK_REMOTE_LNK",
        ),
    )


list = list_boxes  # the registry's verbs: add, list, get, remove (boxes.list())
