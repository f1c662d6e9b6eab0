"""Hermes's home in the agent's folders: install, configure (and .lnk/configured), state.

HERMES_HOME is ``Agent/harness/`` (the harness's state, carried by a move and a
backup); Hermes works in the agent's ``Home/`` (the person's files).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from lnk_hermes import ADAPTER_RELEASE, HARNESS, HARNESS_RELEASE

INSTALLED_MARK = ".lnk-installed"
# what a move and a backup carry of Hermes's home (relative to it), and how
STATE = (
    ("state.db", "sqlite"),
    ("kanban.db", "sqlite"),
    ("config.yaml", "file"),
    (".env", "file"),
    ("SOUL.md", "file"),
    ("memories", "dir"),
    ("skills", "dir"),
    ("sessions", "dir"),
    ("cron", "dir"),
    ("pairing", "dir"),
    ("lnk", "dir"),  # the endpoint's own: lnk thread -> Hermes session, answers by message ID
)


class AdapterFailure(Exception):
    """One line for lnk to show (exit 1)."""


def _version_of(python: Path) -> str:
    r = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({HARNESS!r}))"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return r.stdout.strip() if r.returncode == 0 else ""


def install(req: dict[str, Any]) -> dict[str, Any]:
    """Hermes in a virtualenv of its own under lnk's tools folder (``tools/hermes-agent-X``).

    ``LNK_HERMES_VENV`` names a virtualenv that already holds this release (the test
    suite's, made once by scripts/install.sh --test): it is used as it is."""
    given = os.environ.get("LNK_HERMES_VENV", "")
    if given:
        root = Path(given)
        got = _version_of(root / "bin" / "python")
        if got != HARNESS_RELEASE:
            raise AdapterFailure(
                f"LNK_HERMES_VENV={given} holds {HARNESS} {got or 'nothing'}, not {HARNESS_RELEASE}"
            )
        return {"root": str(root.resolve()), "harness": HARNESS_RELEASE}
    tools = Path(str(req.get("tools", "")))
    if not tools.is_absolute():
        raise AdapterFailure("install needs lnk's tools folder (an absolute path)")
    root = tools / f"{HARNESS}-{HARNESS_RELEASE}"
    if not (root / INSTALLED_MARK).exists():
        venv = [sys.executable, "-m", "venv", "--clear", str(root)]
        pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q"]
        for argv in (venv, [*pip, f"{HARNESS}=={HARNESS_RELEASE}"]):  # progress: on stderr
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=sys.stderr)
        (root / INSTALLED_MARK).write_text(HARNESS_RELEASE + "\n")
    return {"root": str(root), "harness": HARNESS_RELEASE}


def _yaml_text(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML string


def config_yaml(req: dict[str, Any]) -> str:
    m = req["model"]
    if m.get("provider") != "openai" or not m.get("base_url") or not m.get("name"):
        raise AdapterFailure(
            "Hermes needs an OpenAI-compatible model: set one with "
            "lnk agent model NAME --model-url URL"
        )
    lines = [
        "# written by lnk-hermes from the agent's settings; lnk's settings win at each start",
        "model:",
        "  provider: custom",
        f"  default: {_yaml_text(m['name'])}",
        f"  base_url: {_yaml_text(m['base_url'])}",
    ]
    if m.get("key"):
        lines.append(f"  api_key: {_yaml_text(m['key'])}")  # the placeholder: never the key
    elif m.get("key_env"):  # unsandboxed: Hermes reads the variable (never the key on disk)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", str(m["key_env"])):
            raise AdapterFailure(f"the key's variable {m['key_env']!r} is not a variable name")
        lines.append(f"  api_key: {_yaml_text('${' + str(m['key_env']) + '}')}")
    lines += [
        "terminal:",
        f"  cwd: {_yaml_text(req['folders']['home'])}",
        "security:",
        "  tirith_enabled: false",  # it would fetch a scanner from the internet
        "",
    ]
    return "\n".join(lines)


def env_file(req: dict[str, Any]) -> str:
    m = req["model"]
    lines = ["# written by lnk-hermes: nothing secret (the agent's proxy adds the model's key)"]
    if m.get("key"):
        lines.append(f"OPENAI_API_KEY={m['key']}")
    return "\n".join([*lines, ""])


def adapter_digest() -> str:
    """The adapter program itself: a rebuilt one keeps its version, not its digest."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for p in sorted(here.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def configured_hash(req: dict[str, Any], config: bytes, env: bytes) -> str:
    given = {k: req.get(k) for k in ("agent", "folders", "model", "ports", "sandboxed")}
    h = hashlib.sha256()
    for part in (
        json.dumps(given, sort_keys=True).encode(),
        ADAPTER_RELEASE.encode(),
        str(req.get("install", {}).get("harness", HARNESS_RELEASE)).encode(),
        adapter_digest().encode(),
        config,
        env,
    ):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def configure(req: dict[str, Any]) -> dict[str, Any]:
    """config.yaml, .env and .lnk/agent.json from the agent's settings, unless
    ``.lnk/configured`` says all of it is as it was."""
    home = Path(req["folders"]["harness"])
    mark = home / ".lnk" / "configured"
    now = configured_hash(req, _read(home / "config.yaml"), _read(home / ".env"))
    if _read(mark).decode(errors="replace").strip() == now:
        return {"changed": False, "home": str(home)}
    config, env = config_yaml(req).encode(), env_file(req).encode()
    (home / ".lnk").mkdir(parents=True, exist_ok=True, mode=0o700)
    _write(home / "config.yaml", config, 0o600)
    _write(home / ".env", env, 0o600)
    agent = req["agent"] | {"sandboxed": req["sandboxed"], "workdir": req["folders"]["home"]}
    agent |= {"key_env": req["model"].get("key_env", "")}
    _write(home / ".lnk" / "agent.json", json.dumps(agent).encode(), 0o600)
    _write(mark, configured_hash(req, config, env).encode() + b"\n", 0o600)
    return {"changed": True, "home": str(home)}


def state(req: dict[str, Any]) -> dict[str, Any]:
    home = Path(req["folders"]["harness"])
    root = Path(req["folders"]["root"])
    rel = home.relative_to(root).as_posix()
    return {"paths": [{"path": f"{rel}/{name}", "kind": kind} for name, kind in STATE]}


def endpoint(req: dict[str, Any]) -> dict[str, Any]:
    home = str(req["home"])
    root = str(req["install"]["root"]) if "install" in req else ""
    if not root:
        raise AdapterFailure("endpoint needs the install's root")
    listen = req["listen"]
    where = ["--unix", str(listen["unix"])] if "unix" in listen else ["--port", str(listen["port"])]
    package_parent = str(Path(__file__).resolve().parent.parent)
    argv = [
        os.path.realpath(sys.executable),
        "-m",
        "lnk_hermes.serve",
        "--home",
        home,
        "--hermes",
        f"{root}/bin/hermes",
        "--key-file",
        str(req["key_file"]),
        *where,
    ]
    return {
        "argv": argv,
        "env": {"HERMES_HOME": home},
        "read": [root, package_parent],
        "write": [home],
        "proof": True,
    }
