"""A stream's paths are checked by a fast pattern for the common case and in full for
any other: both give the same answer for every string (accepted, or the same refusal)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lnk.errors import StreamError
from lnk.payload import manifest as M

NAME_CHARS = st.characters(codec="utf-8") | st.sampled_from(["/", ".", "\x00", "\x7f", "\udc80"])
PATHS = st.builds(
    lambda root, names: "/".join([root, *names]),
    st.sampled_from([*M.FILE_ROOTS, "Agent", "Home2", "", "/Home"]),
    st.lists(
        st.text(NAME_CHARS, max_size=12) | st.sampled_from([".", "..", "", "x" * 256]), max_size=6
    ),
)


def _answer(check: object, p: object) -> str:
    try:
        return "ok: " + check(p)  # type: ignore[operator]
    except StreamError as e:
        return "refused: " + e.message


@settings(max_examples=3000, deadline=None)
@given(p=PATHS | st.text(NAME_CHARS, max_size=40))
@example(p="Home/" + "é" * 130)  # 260 bytes: past the fast pattern's bound, still fine
@example(p="Home/a/.hidden")
@example(p="Home/a/..")
@example(p="Home/\udc80")
@example(p="Agent/skills")
@example(p="Agent/skillsx/a")
def test_the_fast_check_and_the_full_check_agree(p: str) -> None:
    assert _answer(M.check_path, p) == _answer(M._check_path, p)


@pytest.mark.parametrize(
    ("p", "ok"),
    [
        ("Home/notes/today.md", True),
        ("Agent/memory/index", True),
        ("Home/.env", True),
        ("Home/" + "x" * 256, False),
        ("Home/a/../b", False),
        ("Home/a\x1b[31m", False),
        ("Agent/chats/x", False),
        ("/Home/a", False),
    ],
)
def test_paths(p: str, ok: bool) -> None:
    assert _answer(M.check_path, p).startswith("ok" if ok else "refused")
