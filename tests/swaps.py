"""A folder of an agent's swapped for a link while lnk walks and reads it (what the
agent may do from inside its sandbox): the tests of the send's and the backup's reads."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lnk.payload.walk import WalkedFile

SECRET = b"the machine's own secret\n"


def outside_with(tmp_path: Path, names: list[str]) -> Path:
    """A folder outside the agent's, holding files of these names, each the secret."""
    out = tmp_path / "outside"
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        (out / n).write_bytes(SECRET)
    return out


def swap_for_link(folder: Path, target: Path) -> None:
    """``folder`` moved aside (``<name>.was``) and a link to ``target`` put in its place."""
    os.rename(folder, folder.with_name(folder.name + ".was"))
    os.symlink(target, folder)


def swapping_walk(
    real: Callable[..., Iterator[WalkedFile]], after: str, folder: Path, target: Path
) -> tuple[Callable[..., Iterator[WalkedFile]], list[str]]:
    """A walk as ``real``, but once it has handed on the file ``after`` (its folder
    listed, its files not read yet) ``folder`` is swapped for a link to ``target``; and
    the list that says the swap was made."""
    swapped: list[str] = []

    def walk(*args: Any, **kw: Any) -> Iterator[WalkedFile]:
        for f in real(*args, **kw):
            yield f
            if f.rel == after and not swapped:
                swapped.append(f.rel)
                swap_for_link(folder, target)

    return walk, swapped
