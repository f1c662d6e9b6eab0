"""The agent's grants (``Config/sandbox.toml``) and what a stream may carry of them.

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

A stream is written by the machine the agent leaves, so the machine receiving
it decides: of the stream's grants, the wide ones are dropped and named as the
``lnk agent allow`` flags that would give them here.  A harness's grants never
come from a stream.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

import tomli_w

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
}
MAX_GRANTS_BYTES = 64 * 1024


@dataclass
class Filtered:
    grants: dict[str, Any]
    dropped: list[str] = field(default_factory=list)  # as lnk agent allow flags

    def to_toml(self) -> str:
        return tomli_w.dumps(self.grants)


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
