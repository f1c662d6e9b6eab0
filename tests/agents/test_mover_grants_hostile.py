"""``state-receive --prepare --grants -``: what a mover sends is checked like a stream's grants."""

from __future__ import annotations

from pathlib import Path

import pytest
from lnkrun import lnk

from lnk.agents.grants import MAX_GRANTS_BYTES
from lnk.errors import InvalidInput

CASES = {
    "over the grants' limit": b"# " + b"x" * MAX_GRANTS_BYTES + b"\n",
    "not UTF-8": b"[files]\nread = ['\xff\xfe']\n",
    "a lone surrogate, escaped": b'[files]\nread = ["\\udc80"]\n',
    "not TOML": b"[files\nread = \n",
    "nested too deep": b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_mover_grants_are_refused_in_one_line(home: Path, case: str) -> None:
    r = lnk("agent", "state-receive", "--prepare", "--grants", "-", "--json", input=CASES[case])
    assert r.code == InvalidInput.exit_code, r.err
    lines = r.err.splitlines()
    assert lines and lines[0].startswith("lnk: error: ") and "Traceback" not in r.err, r.err
    assert len([ln for ln in lines if ln.startswith("lnk: error: ")]) == 1
    receivers = home / ".lnk" / "receivers"
    assert not receivers.exists() or not any(receivers.iterdir())  # nothing prepared


def test_good_mover_grants_are_kept_with_the_receiver(home: Path) -> None:
    r = lnk(
        "agent",
        "state-receive",
        "--prepare",
        "--grants",
        "-",
        "--json",
        input=b'[files]\nread = ["docs"]\n',
    )
    assert r.code == 0, r.err
    assert r.json()["receiver"].startswith("rcv-")
