"""What commands print: data on stdout (JSON with --json), words on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

# bidirectional overrides and isolates: they reorder what the terminal shows
_BIDI = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})


def safe(text: str) -> str:
    """Text that came from a stream or a bucket, fit for a terminal.

    Control characters (C0, DEL, C1: ESC sequences, OSC 52 clipboard
    writes, ``\\r`` overwriting a line), lone surrogates and bidirectional
    overrides are shown escaped (``\\x1b``, ``\\ud800``), never sent as they are.
    """
    if text.isprintable() and text.isascii():
        return text
    out: list[str] = []
    for ch in text:
        o = ord(ch)
        if o < 0x20 or 0x7F <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF or o in _BIDI:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def say(line: str) -> None:
    """A note for the person (stderr), never data."""
    sys.stderr.write(f"lnk: {safe(line)}\n")
    sys.stderr.flush()


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
