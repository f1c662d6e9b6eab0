"""The README's exit-code table is lnk.errors' table: same classes, same codes."""

from __future__ import annotations

import re
from pathlib import Path

import lnk.errors as errors
from lnk.errors import EXIT_CODES

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_table() -> dict[str, str]:
    text = README.read_text()
    start = text.index("| code | class | meaning |")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        code, cls = (c.strip() for c in line.split("|")[1:3])
        rows[cls.strip("`")] = code
    return rows


def test_readme_table_matches_the_error_classes() -> None:
    rows = _readme_table()
    rows.pop("\u2013", None)  # 0, success: no class
    assert rows.pop("Interrupted") == "128+N"
    assert errors.Interrupted("x", signum=2).exit_code == 130
    ours = {name: str(code) for name, code in EXIT_CODES.items() if name != "Interrupted"}
    assert rows == ours


def test_every_error_class_is_in_the_table() -> None:
    classes = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.LnkError)
    }
    assert classes == set(EXIT_CODES)
    assert all(re.fullmatch(r"\d+", str(c)) for c in EXIT_CODES.values())
