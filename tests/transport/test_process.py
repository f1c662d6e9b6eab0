"""A command started by a leg, as the leg hands it its input."""

from __future__ import annotations

import subprocess
import tempfile

from lnk.errors import LnkError
from lnk.transport.process import LegProcess


class _Here:
    name = "here"

    def check(self, code: int, stderr: str) -> None:
        assert code == 0, stderr

    def launch_failed(self, program: str) -> LnkError:
        return LnkError(f"{program} is missing")


def test_a_file_is_read_from_its_position_not_from_its_descriptors() -> None:
    """A spooled answer (an inventory) read in part, or sought back within what Python
    buffered, then handed on by descriptor: the command reads from the file's position,
    whatever the descriptor's offset was."""
    with tempfile.TemporaryFile() as f:
        f.write(b"0123456789" * 100)
        f.seek(0)
        assert f.read(3) == b"012"  # buffered: the descriptor is at the end already
        with LegProcess(_Here(), ["cat"], ["cat"], None, f, subprocess.PIPE) as p:
            assert p.read_answer() == (b"0123456789" * 100)[3:]
        f.seek(0)  # back within the buffer: only Python's position moves
        with LegProcess(_Here(), ["cat"], ["cat"], None, f, subprocess.PIPE) as p:
            assert p.read_answer() == b"0123456789" * 100
