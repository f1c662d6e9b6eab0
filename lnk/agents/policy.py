"""Whose word counts when an agent arrives: the receiving machine decides, the stream informs.

A stream (or a backup snapshot) is written by the machine the agent leaves.
When that is a box, the box would otherwise choose what the agent may do on
your computer.  So of what a stream carries, :data:`TABLE` says what it may
set, what the receiving machine keeps as its own, and what is dropped and
named.  docs/stream-format.md ("Whose word counts") is the same table.

Grants follow one rule (decisions.txt, "The agent's grants"):

1. the computer running ``lnk agent move`` sends the agent's grants when the
   agent leaves it (at ``state-receive --prepare --grants -``, never in the
   stream): they are applied as they are;
2. an agent coming back keeps the grants it has here: a live copy's, or those
   remembered when it moved away (``~/.lnk/moved/<id>.local.toml``, beside
   the moved note, which no sandbox reaches);
3. one arriving any other way gets the stream's minus the wide ones, each
   named as the ``lnk agent allow`` flag that gives it here.

Everything not taken from the stream is reported, with the command that
would restore it here (``lnk agent start --no-sandbox`` for the sandbox).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import tomli_w

from lnk.agents.grants import KNOWN_SECTIONS, MAX_GRANTS_BYTES, parse
from lnk.agents.grants import TABLE as GRANT_FIELDS
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings, Settings, write_toml_atomic
from lnk.errors import InvalidInput

# where each setting's word comes from
STREAM = "stream"  # the stream (or snapshot) sets it
HERE = "here"  # the receiving machine keeps its own
RULE = "rule"  # grants: see the module's docstring
NEVER = "never"  # never carried: dropped and named


@dataclass(frozen=True)
class Rule:
    setting: str
    word: str  # STREAM, HERE, RULE or NEVER
    why: str


TABLE: tuple[Rule, ...] = (
    Rule("format", STREAM, "the settings' format; an older one is migrated"),
    Rule(
        "id, name, owner",
        STREAM,
        "who the agent is; an account's agent is refused unless "
        "this machine is signed in as that account",
    ),
    Rule("harness", STREAM, "the program that runs the agent"),
    Rule("turns (renew, lapse)", STREAM, "how long a turn holds the agent"),
    Rule("store", HERE, "the collections' driver here: --store, the live copy's, or files"),
    Rule("ports", HERE, "a block free on this machine (the live copy's if it has one)"),
    Rule(
        "sandbox",
        HERE,
        "a stream never turns it off: an agent new here arrives sandboxed; "
        "only a person turns it off here (lnk agent start --no-sandbox)",
    ),
    Rule(
        "model",
        HERE,
        "each machine keeps a model it can reach: the one it had for the agent if it "
        "answers, else the mover's (sent at the prepare, never in the stream), else the "
        "offline model; a model's base_url and key_env never come from a stream",
    ),
    Rule(
        "grants (Config/sandbox.toml)",
        RULE,
        "the mover's when the agent leaves it; the "
        "grants it has here when it comes back; else the stream's minus the wide ones",
    ),
    Rule(
        "epoch",
        HERE,
        "raised past both the stream's and the live copy's at every commit here, "
        "so a bridge of an earlier copy acts no more",
    ),
    Rule("harness grants", NEVER, "granted here for what the harness asks for here"),
)


def table() -> list[dict[str, str]]:
    return [{"setting": r.setting, "word": r.word, "why": r.why} for r in TABLE]


@dataclass
class Arrival:
    """What the receiving machine writes, and what of the stream it did not take."""

    settings: Settings
    grants: str | None  # the text of Config/sandbox.toml; None leaves the file as it is
    grants_from: str  # "mover", "here" or "stream"
    dropped: list[str] = field(default_factory=list)  # grants, as lnk agent allow flags
    kept_here: list[dict[str, str]] = field(default_factory=list)


# ---- what a machine remembers of an agent that moved away ---------------------------
def _record(machine: Machine, agent_id: str) -> Path:
    return machine.state_dir / "moved" / f"{agent_id}.local.toml"


def remember(machine: Machine, settings: Settings, grants_file: Path) -> None:
    """Before the agent leaves: keep what this machine decided for it, for its return."""
    data: dict[str, Any] = {
        "sandbox": settings.sandbox,
        "model": settings.model.__dict__.copy(),
    }
    with contextlib.suppress(OSError):
        data["grants"] = grants_file.read_text()
    write_toml_atomic(_record(machine, settings.id), data)


def forget(machine: Machine, agent_id: str) -> None:
    """The agent is back: what was remembered of it is in its files again."""
    _record(machine, agent_id).unlink(missing_ok=True)


def _remembered(machine: Machine, agent_id: str) -> dict[str, Any]:
    try:
        with open(_record(machine, agent_id), "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        data = {}
    if "grants" not in data:
        # a note from before the record: the grants file kept with the agent's folders
        kept = _kept_folder(machine, agent_id)
        if kept is not None:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                data["grants"] = (kept / "Config" / "sandbox.toml").read_text()
    return data


def _kept_folder(machine: Machine, agent_id: str) -> Path | None:
    try:
        note = json.loads((machine.state_dir / "moved" / f"{agent_id}.json").read_text())
        kept = Path(note["kept"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return kept if kept.is_dir() else None


def remembered_model(machine: Machine, agent_id: str) -> ModelSettings | None:
    """The model this machine had for the agent when it left, if it did."""
    old = _remembered(machine, agent_id).get("model")
    return _model(old) if isinstance(old, dict) else None


def model_for_arrival(
    machine: Machine,
    agent_id: str | None,
    here: ModelSettings | None,
    mover: ModelSettings | None,
    answers: Callable[[ModelSettings], bool],
) -> ModelSettings:
    """The model the agent thinks with here once it arrives (decided at the prepare):

    1. a copy of it living here keeps its own;
    2. the model this machine had for it, if that one answers here (back on your
       computer, your own model is used again);
    3. the mover's word (the model it runs with where the mover knows it);
    4. the model this machine had for it, answering or not;
    5. the offline model.
    """
    if here is not None:
        return here
    old = remembered_model(machine, agent_id) if agent_id else None
    if old is not None and old != mover and answers(old):
        return old
    return mover or old or ModelSettings()


# ---- the stream's grants, minus the wide ones --------------------------------------
_LIMIT_FLAGS = {f.key: f.flag for f in GRANT_FIELDS if f.section == "limits"}


@dataclass
class Filtered:
    grants: dict[str, Any]
    dropped: list[str] = field(default_factory=list)  # as lnk agent allow flags

    def to_toml(self) -> str:
        return tomli_w.dumps(self.grants)


def _strs(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if value is None:
        return []
    return [str(value)]


def _wide_path(p: str) -> bool:
    return p == "~" or p.startswith(("~", "/")) or ".." in p.split("/")


def filter_from_stream(text: str) -> Filtered:
    """Keep what a stream may grant here; name what was dropped."""
    data = parse(text, "the stream's grants")
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for section, body in data.items():
        if section not in KNOWN_SECTIONS or not isinstance(body, dict):
            dropped.append(f"[{section}] (not a section this lnk knows)")
            continue
        if section == "files":
            out: dict[str, list[str]] = {}
            for mode in ("read", "write"):
                for p in _strs(body.get(mode)):
                    if _wide_path(p):
                        dropped.append(f"--{mode} {p!r}")
                    else:
                        out.setdefault(mode, []).append(p)
            if out:
                kept["files"] = out
        elif section == "network":
            mode = body.get("mode", "proxy")
            if mode != "proxy":
                dropped.append(f"--network-mode {mode}")
        elif section == "internet":
            kept["internet"] = {"hosts": _strs(body.get("hosts", ["*"]))}
        elif section == "lan":
            dropped += [f"--lan-host {h}" for h in _strs(body.get("hosts"))]
        elif section == "ports":
            dropped += [f"--port {p}" for p in _strs(body.get("allow"))]
        elif section == "browser":
            if body.get("host"):
                dropped.append(f"--browser-host {body['host']}")
        elif section == "tcp":
            dropped += [f"--tcp {e}" for e in _strs(body.get("endpoints"))]
        elif section == "tools":
            dropped += [f"--tool {t}" for t in _strs(body.get("outside"))]
        elif section == "limits":
            dropped += [f"--{_LIMIT_FLAGS.get(k, k)} {v}" for k, v in body.items()]
        elif section == "commands":
            keep = []
            for c in _strs(body.get("allow")):
                if "/" in c or c == "*" or "*" in c:
                    dropped.append(f"--command {c}")
                else:
                    keep.append(c)
            if keep:
                kept["commands"] = {"allow": keep}
    return Filtered(kept, dropped)


# ---- deciding ----------------------------------------------------------------------
def arrive(
    machine: Machine,
    stream: Settings,
    stream_grants: str,
    here: Settings | None,
    mover_grants: str | None,
    model: ModelSettings | None = None,
    told: bool = False,
) -> Arrival:
    """The settings and grants an arriving agent gets here.

    ``stream`` is the stream's settings (validated), ``here`` the live copy's if the
    agent lives here, ``mover_grants`` what the computer running the move sent, and
    ``model`` the model decided at the prepare (:func:`model_for_arrival`; without
    one, as that decides it with no mover's word and no probe), ``told`` whether the
    mover named it (and heard then which the agent would think with).
    """
    old = _remembered(machine, stream.id) if here is None else {}
    sandbox = here.sandbox if here is not None else bool(old.get("sandbox", True))
    if model is None:
        model = model_for_arrival(
            machine, stream.id, here.model if here else None, None, lambda m: True
        )
    s = replace(stream, sandbox=sandbox, model=model)
    kept: list[dict[str, str]] = []
    name = stream.name
    if not stream.sandbox and s.sandbox:
        kept.append(
            {
                "setting": "sandbox",
                "stream": "false",
                "here": "true",
                "restore": f"lnk agent start --no-sandbox --agent {name}",
            }
        )
    if stream.model != model and not told:  # a mover that named the model heard it then
        kept.append(
            {
                "setting": "model",
                "stream": describe_model(stream.model),
                "here": describe_model(model),
                "restore": f"lnk agent model --agent {name} NAME --model-url URL",
            }
        )
    if mover_grants is not None:
        parse(mover_grants, "the grants the mover sent")
        return Arrival(s, mover_grants, "mover", [], kept)
    if here is not None:
        return Arrival(s, None, "here", [], kept)
    if isinstance(old.get("grants"), str):
        return Arrival(s, old["grants"], "here", [], kept)
    if not stream_grants.strip():
        return Arrival(s, None, "stream", [], kept)
    f = filter_from_stream(stream_grants)
    return Arrival(s, f.to_toml(), "stream", f.dropped, kept)


def model_settings(d: dict[str, Any]) -> ModelSettings:
    """Model settings as kept in a file this machine wrote (unknown keys left out)."""
    return _model(d)


def _model(d: dict[str, Any]) -> ModelSettings:
    known = ModelSettings.__dataclass_fields__
    return ModelSettings(**{k: str(v) for k, v in d.items() if k in known})


def describe_model(m: ModelSettings) -> str:
    if m.provider == "offline":
        return "offline (built in)"
    return (
        f"{m.provider} {m.name or '(no name)'} at {m.base_url or '(no URL)'}, key from ${m.key_env}"
    )


def mover_grants(src: BinaryIO) -> str:
    """The grants a mover sent at prepare: UTF-8 TOML within the grants' limit (read
    no further than one byte past it)."""
    raw = src.read(MAX_GRANTS_BYTES + 1)
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise InvalidInput(
            "the grants sent with --grants are not UTF-8", hint="send Config/sandbox.toml as it is"
        ) from e
    try:
        parse(text, "the grants sent with --grants")
    except RecursionError:
        raise InvalidInput(
            "the grants sent with --grants are nested too deeply",
            hint="send Config/sandbox.toml as it is",
        ) from None
    return text


def grants_to_send(grants_file: Path) -> str:
    """What the computer running a move sends as the agent's grants: its file, as it is."""
    try:
        return grants_file.read_text()
    except FileNotFoundError:
        return ""


def kept_lines(arrival_kept: list[dict[str, str]], dropped: list[str], agent: str) -> list[str]:
    """The person's lines for what was not taken from the stream (text not yet escaped)."""
    lines = []
    for k in arrival_kept:
        if k["setting"] == "sandbox":
            lines.append(
                f"{agent} arrives sandboxed: a stream never turns the sandbox off (it had "
                f"sandbox = false); only you turn it off here: {k['restore']}"
            )
            continue
        lines.append(
            f"kept this machine's {k['setting']} ({k['here']}), not the stream's "
            f"({k['stream']}); to change it: {k['restore']}"
        )
    for flag in dropped:
        lines.append(
            f"not granted here (the stream asked for it): {flag}; "
            f"lnk agent allow {flag} --agent {agent} gives it"
        )
    return lines
