"""The table says whose word counts for every setting an agent has."""

from __future__ import annotations

import re

from lnk.agents.policy import HERE, NEVER, RULE, STREAM, TABLE, table
from lnk.agents.settings import Settings


def test_every_setting_has_its_word_in_the_table() -> None:
    keys = set(Settings("ag-" + "a" * 20, "work", "local-m").to_toml())
    named = {w for r in TABLE for w in re.findall(r"[a-z_]+", r.setting)}
    assert keys <= named, keys - named
    assert all(r.word in (STREAM, HERE, RULE, NEVER) for r in TABLE)
    words = {r.setting: r.word for r in TABLE}
    assert words["sandbox"] == words["model"] == words["ports"] == HERE
    assert words["harness grants"] == NEVER
    assert len(table()) == len(TABLE)
