"""The agent's grants (``Config/sandbox.toml``): read, checked, changed and written
through one table.

The file is a sandbox spec in the agent's own terms:

    [files]     read = [...], write = [...]      folders of Home ("." is all of it), "~" yours
    [network]   mode = "proxy" | "host"
    [internet]  hosts = ["*"]
    [lan]       hosts = [...]
    [ports]     allow = [8080, ...]
    [browser]   host = "..."
    [tcp]       endpoints = ["github.com:22"]
    [tools]     outside = [...]
    [commands]  allow = ["git", "/usr/bin/x", "*"]
    [limits]    memory = "4G", processes = 1024, files = 4096   (unset: this machine's defaults)

What a stream may carry of them is :mod:`lnk.agents.policy`'s (the machine
receiving it decides).  A harness's grants never come from a stream.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from lnk.errors import InvalidInput

KNOWN_SECTIONS = {
    "files",
    "network",
    "internet",
    "lan",
    "ports",
    "browser",
    "tcp",
    "tools",
    "commands",
    "limits",
}
MAX_GRANTS_BYTES = 64 * 1024


def parse(text: str, where: str = "sandbox.toml") -> dict[str, Any]:
    if len(text.encode()) > MAX_GRANTS_BYTES:
        raise InvalidInput(
            f"{where} is larger than {MAX_GRANTS_BYTES} bytes",
            hint="an agent's grants are a short TOML file",
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(f"{where} is not valid TOML: {e}", hint="fix the file by hand") from e
    return data


# ---------------------------------------------------------------------------
# The one table: every section and key the file may hold, the lnk agent allow
# flag that edits it, and whether this machine's sandbox enforces it.  It reads
# the file, writes it back, prints it (show --permissions) and says what start
# must refuse.


@dataclass(frozen=True)
class Field:
    section: str
    key: str
    flag: str  # the lnk agent allow / deny flag, without "--"
    attr: str  # the Spec attribute
    kind: str  # "paths" | "hosts" | "lan" | "ports" | "endpoints" | "mode" | "strs" | "str"
    # | "size" | "count"
    enforced: bool  # does bubblewrap + the agent's proxy hold it here?


TABLE: tuple[Field, ...] = (
    Field("files", "read", "read", "read", "paths", True),
    Field("files", "write", "write", "write", "paths", True),
    Field("network", "mode", "network-mode", "mode", "mode", True),
    Field("internet", "hosts", "host", "hosts", "hosts", True),
    Field("lan", "hosts", "lan-host", "lan", "lan", True),
    Field("ports", "allow", "port", "ports", "ports", True),
    Field("tcp", "endpoints", "tcp", "tcp", "endpoints", True),
    Field("browser", "host", "browser-host", "browser", "str", False),
    Field("tools", "outside", "tool", "tools", "strs", False),
    Field("commands", "allow", "command", "commands", "strs", False),
    Field("limits", "memory", "memory", "memory", "size", True),
    Field("limits", "processes", "processes", "processes", "count", True),
    Field("limits", "files", "open-files", "files", "count", True),
)
BY_FLAG = {f.flag: f for f in TABLE}
NETWORK_MODES = ("proxy", "host")
_HOST_RE = re.compile(r"^(\*|(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?|[0-9a-f:.]+)$")


@dataclass
class Spec:
    """The agent's grants as read through :data:`TABLE`."""

    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)
    mode: str = "proxy"
    hosts: list[str] = field(default_factory=lambda: ["*"])  # "!x" is a denial
    lan: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    tcp: list[str] = field(default_factory=list)
    browser: str = ""
    tools: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    memory: str = ""  # "" / 0: this machine's default (lnk.sandbox.limits)
    processes: int = 0
    files: int = 0
    # what the table doesn't know, kept as read so start can name it and a write keeps it
    unknown: dict[str, Any] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)  # "section.key" the file names

    def tcp_endpoints(self) -> list[tuple[str, int]]:
        return [split_endpoint(e) for e in self.tcp]


def norm_host(value: str) -> str:
    """A host as the proxy compares it: lower case, no trailing dot, no brackets."""
    h = value.strip().lower().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h


def split_endpoint(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise InvalidInput(
            f"{value!r} is not an endpoint host:port",
            hint="name an endpoint as host:port, e.g. --tcp github.com:22",
        )
    h = norm_host(host)
    if not _HOST_RE.match(h) or h.startswith("*"):
        raise InvalidInput(f"{value!r} does not name one host", hint="e.g. --tcp github.com:22")
    return h, int(port)


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MIN_MEMORY = 64 << 20
MAX_COUNT = 1 << 20


def parse_size(text: str) -> int:
    """``"4G"``, ``"512M"``, ``"2GiB"`` or a number of bytes; InvalidInput otherwise."""
    m = _SIZE_RE.match(str(text))
    if not m or int(m.group(1)) * _UNITS[m.group(2).lower()] < MIN_MEMORY:
        raise InvalidInput(f"{text!r} is not a size of 64M or more", hint="e.g. --memory 4G")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _check_value(f: Field, value: Any, where: str) -> Any:
    """One value of ``f``, checked and normalised; InvalidInput naming the line."""

    def bad(why: str) -> InvalidInput:
        return InvalidInput(
            f"{where}: [{f.section}] {f.key} has {value!r}: {why}",
            hint=f"fix it with lnk agent deny --{f.flag} / allow --{f.flag}, or by hand",
        )

    if f.kind == "count":
        if isinstance(value, bool) or not str(value).isdigit() or not 0 < int(value) <= MAX_COUNT:
            raise bad(f"not a count (1-{MAX_COUNT})")
        return int(value)
    if f.kind == "ports":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise bad("not a port number")
        if not str(value).isdigit() or not 0 < int(value) < 65536:
            raise bad("not a port number (1-65535)")
        return int(value)
    if not isinstance(value, str) or not value.strip():
        raise bad("not a non-empty string")
    if f.kind == "mode":
        if value not in NETWORK_MODES:
            raise bad("mode is 'proxy' or 'host'")
        return value
    if f.kind == "size":
        try:
            parse_size(value)
        except InvalidInput as e:
            raise bad("not a size of 64M or more (e.g. 4G)") from e
        return value.strip()
    if f.kind in ("hosts", "lan"):
        deny = value.startswith("!") and f.kind == "hosts"
        h = norm_host(value[1:] if deny else value)
        if f.kind == "lan" and "/" in h:
            try:
                ipaddress.ip_network(h, strict=False)
            except ValueError as e:
                raise bad("not a network") from e
        elif not _HOST_RE.match(h):
            raise bad("not a host name, *.domain, * or an address")
        return ("!" if deny else "") + h
    if f.kind == "endpoints":
        h, p = split_endpoint(value)
        return f"{h}:{p}"
    return value


def spec_from_data(data: dict[str, Any], where: str = "sandbox.toml") -> Spec:
    spec = Spec()
    fields = {(f.section, f.key): f for f in TABLE}
    for section, body in data.items():
        if not isinstance(body, dict):
            spec.unknown[section] = body
            continue
        for key, value in body.items():
            f = fields.get((section, key))
            if f is None:
                spec.unknown.setdefault(section, {})[key] = value
                continue
            spec.present.add(f"{section}.{key}")
            if f.kind in ("mode", "str", "size", "count"):
                setattr(spec, f.attr, value if f.kind == "str" else _check_value(f, value, where))
                continue
            values = value if isinstance(value, list) else [value]
            checked = [_check_value(f, v, where) for v in values]
            setattr(spec, f.attr, list(dict.fromkeys(checked)))
    return spec


def read_spec(path: Path) -> Spec:
    """The agent's file through the table (a missing file is Link's defaults)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Spec()
    return spec_from_data(parse(text, str(path)), str(path))


def spec_to_data(spec: Spec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    default = Spec()
    for f in TABLE:
        value = getattr(spec, f.attr)
        if value == getattr(default, f.attr) and f"{f.section}.{f.key}" not in spec.present:
            continue
        if value in ("", [], 0) and f.attr != "hosts":
            continue
        out.setdefault(f.section, {})[f.key] = value
    for section, body in spec.unknown.items():
        if isinstance(body, dict) and isinstance(out.get(section), dict):
            out[section].update(body)
        else:
            out[section] = body
    return out


HEADER = "# What this agent may do, in its own terms (lnk agent allow / deny change it).\n"


def write_spec(path: Path, spec: Spec) -> None:
    """Write the file back, atomically, as the table's sections; a person's comments and
    the order of what they wrote stay (tomlkit edits the document in place)."""
    try:
        doc = tomlkit.parse(path.read_text())
    except (FileNotFoundError, tomlkit.exceptions.ParseError):
        doc = tomlkit.parse(HEADER)
    data = spec_to_data(spec)
    table_keys = {(f.section, f.key) for f in TABLE}
    for section in list(doc.keys()):
        body = doc[section]
        if section not in data and isinstance(body, dict):
            for key in list(body.keys()):
                if (section, key) in table_keys:
                    del body[key]
            if not body:
                del doc[section]
        elif section not in data and any(section == f.section for f in TABLE):
            del doc[section]
    for section, body in data.items():
        if not isinstance(body, dict):
            doc[section] = body
            continue
        if section not in doc or not isinstance(doc[section], dict):
            doc[section] = tomlkit.table()
        target = doc[section]
        for key in list(target.keys()):
            if (section, key) in table_keys and key not in body:
                del target[key]
        for key, value in body.items():
            if target.get(key) != value:
                target[key] = value
    text = tomlkit.dumps(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def unenforceable(spec: Spec) -> list[str]:
    """What the file says that this machine's sandbox can't hold, each named as its line."""
    out: list[str] = []
    for f in TABLE:
        if not f.enforced and getattr(spec, f.attr) not in ("", [], 0):
            out.append(f"[{f.section}] {f.key}")
    for section, body in spec.unknown.items():
        if isinstance(body, dict):
            out += [f"[{section}] {key}" for key in body]
        else:
            out.append(f"{section}")
    return out


def _host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])  # subdomains, not the apex
    return host == pattern


def host_listed(hosts: list[str], host: str) -> bool | None:
    """Denials first, then allows: True, False (denied), or None (not on the list)."""
    h = norm_host(host)
    if any(_host_matches(p[1:], h) for p in hosts if p.startswith("!")):
        return False
    if any(_host_matches(p, h) for p in hosts if not p.startswith("!")):
        return True
    return None


def change(spec: Spec, flag: str, value: str, *, allow: bool) -> str:
    """``lnk agent allow`` / ``deny`` of one flag's value; returns what changed, in words."""
    f = BY_FLAG.get(flag)
    if f is None:
        raise InvalidInput(f"--{flag} is not a grant lnk knows", hint="see lnk agent allow --help")
    spec.present.add(f"{f.section}.{f.key}")
    if f.kind == "mode":
        if value != "host":
            raise InvalidInput(
                f"--network-mode {value}: the one mode to allow or deny is 'host'",
                hint="lnk agent allow --network-mode host; lnk agent deny --network-mode host",
            )
        spec.mode = "host" if allow else "proxy"
        return f"[network] mode = {spec.mode!r}"
    if f.kind == "str":
        spec.browser = value if allow else ""
        return f"[{f.section}] {f.key} = {spec.browser!r}"
    if f.kind in ("size", "count"):
        setattr(
            spec,
            f.attr,
            _check_value(f, value, "the grant") if allow else type(getattr(Spec(), f.attr))(),
        )
        return (
            f"[{f.section}] {f.key} = {getattr(spec, f.attr)!r}"
            if allow
            else f"[{f.section}] {f.key}: this machine's default"
        )
    checked = _check_value(f, value, "the grant")
    current: list[Any] = list(getattr(spec, f.attr))
    if f.kind == "hosts":
        h = str(checked).lstrip("!")
        current = [x for x in current if x.lstrip("!") != h]
        if allow:
            current.append(h)
        elif host_listed(current, h) is not None:
            current.append("!" + h)  # still matched by a wider entry: deny it by name
    elif allow:
        if checked not in current:
            current.append(checked)
    else:
        current = [x for x in current if x != checked]
    setattr(spec, f.attr, current)
    return f"[{f.section}] {f.key} = {current!r}"


def as_flags(spec: Spec) -> list[str]:
    """What the agent runs with, as the lnk agent allow flags that give it."""
    out: list[str] = []
    for f in TABLE:
        value = getattr(spec, f.attr)
        if f.kind == "mode":
            if value == "host":
                out.append("--network-mode host")
        elif f.kind in ("str", "size", "count"):
            if value:
                out.append(f"--{f.flag} {value}")
        else:
            out += [f"--{f.flag} {v}" for v in value]
    return out
