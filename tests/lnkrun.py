"""Run the real ``lnk`` command line as a black box, on a chosen machine (HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def lnk(
    *args: str,
    home: Path | None = None,
    env: dict[str, str] | None = None,
    input: bytes | str | None = None,
    timeout: float = 120,
) -> Result:
    e = dict(os.environ)
    if home is not None:
        e["HOME"] = str(home)
    if env:
        e.update(env)
    data = input.encode() if isinstance(input, str) else input
    p = subprocess.run(
        [sys.executable, "-c", "from lnk.cli.main import main; main()", *args],
        input=data,
        capture_output=True,
        env=e,
        timeout=timeout,
    )
    return Result(
        p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    )


def ok(*args: str, **kw: Any) -> Result:
    r = lnk(*args, **kw)
    assert r.code == 0, f"lnk {' '.join(args)} failed ({r.code}): {r.err}"
    return r
