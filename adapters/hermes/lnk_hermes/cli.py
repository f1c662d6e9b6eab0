"""``lnk-hermes COMMAND``: one JSON request on stdin, one JSON answer on stdout.

Commands (lnk's docs/adapters.md): describe, needs, internet-hosts, install,
configure, state, endpoint.  A failure is one line on stderr and exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from lnk_hermes import ADAPTER_RELEASE, CONTRACT, HARNESS_RELEASE, home

MAX_REQUEST = 1 << 20


def describe(req: dict[str, Any]) -> dict[str, Any]:
    return {
        "contract": CONTRACT,
        "name": "hermes",
        "adapter": ADAPTER_RELEASE,
        "harness": HARNESS_RELEASE,
    }


def needs(req: dict[str, Any]) -> dict[str, Any]:
    # the model through the agent's proxy; its home (Agent/harness) writable; its install
    # (lnk's tools folder) readable.  No network of its own, no host's ports.
    return {"needs": ["model", "harness-home", "tools"]}


def internet_hosts(req: dict[str, Any]) -> dict[str, Any]:
    return {"hosts": ["pypi.org", "files.pythonhosted.org"]}  # install: pip, nothing else


COMMANDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "describe": describe,
    "needs": needs,
    "internet-hosts": internet_hosts,
    "install": home.install,
    "configure": home.configure,
    "state": home.state,
    "endpoint": home.endpoint,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in COMMANDS:
        print(f"usage: lnk-hermes {{{'|'.join(COMMANDS)}}} < request.json", file=sys.stderr)
        return 2
    raw = sys.stdin.read(MAX_REQUEST) if not sys.stdin.isatty() else ""
    try:
        req = json.loads(raw) if raw.strip() else {}
        if not isinstance(req, dict):
            raise ValueError("the request is not a JSON object")
        answer = COMMANDS[args[0]](req)
    except (home.AdapterFailure, ValueError, KeyError, OSError) as e:
        print(f"lnk-hermes {args[0]}: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"lnk-hermes {args[0]}: {e.cmd[0]} failed (exit {e.returncode})", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
