"""What commands print: data on stdout (JSON with --json), words on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from lnk.text import escape


def safe(text: str, *, lines: bool = False) -> str:
    """Foreign text, escaped for the terminal (:func:`lnk.text.escape`)."""
    return escape(text, lines=lines)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def out(line: str = "", *, lines: bool = False) -> None:
    """Data on stdout, one line (or, with ``lines``, text of many): whatever it holds
    from outside is escaped (:func:`safe`)."""
    sys.stdout.write(safe(line, lines=lines) + "\n")
    sys.stdout.flush()


def say(line: str) -> None:
    """A note for the person (stderr), never data."""
    sys.stderr.write(f"lnk: {safe(line)}\n")
    sys.stderr.flush()


def ask_secret(question: str) -> str | None:
    """A key asked on the terminal (not echoed); None when there is no terminal."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    import getpass

    return getpass.getpass(f"lnk: {safe(question)}", stream=sys.stderr) or None


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        out("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def progress_bar(total: int | None, desc: str = "", unit: str = "B") -> Any:
    """A bar object with .update(n)/.close(); a silent one when not on a terminal."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False)
    return _Silent()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *a: object) -> None:
        pass


def size_text(n: int) -> str:
    """A number of bytes for a person: 512 B, 1.5 KiB, 3.2 MiB, 1.0 GiB."""
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if f < 1024 or unit == "GiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return str(n)
