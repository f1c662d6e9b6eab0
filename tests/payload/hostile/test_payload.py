"""Payload records that break a rule of the spec: one line naming it, exit 10 (or 6),
nothing changed.  Odd Unicode, wrong types, every stated limit, hard links across
folders with different write rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hostile_kit import Dest, dentry, dump, fentry, jl, records, roots, settings, summary_of

from lnk.payload import manifest as M

STREAM = 10
Build = Callable[[Dest], list[tuple[int, bytes]]]


def _files(*ents: dict[str, Any], data: bytes = b"") -> Build:
    return lambda d: records(d.head(), [*roots(), *ents], data)


def _head(**over: Any) -> Build:
    return lambda d: records(d.head(**over), roots())


def _settings(**over: Any) -> Build:
    return lambda d: records(d.head(settings={**settings(d.agent_id), **over}), roots())


def _summary(value: Any) -> Build:
    def build(d: Dest) -> list[tuple[int, bytes]]:
        recs = records(d.head(), [*roots(), fentry("Home/x", b"abc")], b"abc", summary=None)
        s = value(summary_of(recs)) if callable(value) else value
        return [*recs, (M.SUMMARY, s if isinstance(s, bytes) else dump(s))]

    return build


def _raw(rtype: int, body: bytes) -> Build:
    def build(d: Dest) -> list[tuple[int, bytes]]:
        recs = records(d.head(), roots())
        if rtype == M.HEAD:
            return [(M.HEAD, body), *recs[1:]]
        return [*recs[:-1], (rtype, body), recs[-1]]

    return build


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _root_as_file(root: str) -> Build:
    """A stream naming one of the agent's roots (Home, Agent/memory ...) as a file."""

    def build(d: Dest) -> list[tuple[int, bytes]]:
        ents = [e for e in roots() if e["p"] != root]
        return records(d.head(), [*ents, fentry(root, b"abc")], b"abc")

    return build


CASES: dict[str, tuple[Build, int, str]] = {
    # ---- a root of the agent's named as a file --------------------------------------
    "Home as a file": (_root_as_file("Home"), STREAM, "Home"),
    "Agent/memory as a file": (_root_as_file("Agent/memory"), STREAM, "Agent/memory"),
    # ---- odd Unicode --------------------------------------------------------------
    "lone surrogate in a path": (_files(fentry("Home/\udcff")), STREAM, "lone surrogate"),
    "high surrogate in a folder": (_files(dentry("Home/\ud800")), STREAM, "lone surrogate"),
    "surrogate in settings": (_settings(harness="\ud800"), STREAM, "lone surrogate"),
    "surrogate in a settings key": (_settings(**{"\udfff": 1}), STREAM, "lone surrogate"),
    "surrogate in grants": (
        _head(grants='[files]\nread = ["\ud800"]\n'),
        STREAM,
        "lone surrogate",
    ),
    "surrogate in the agent name": (
        lambda d: records(
            d.head(agent={"id": d.agent_id, "owner": "local-hostile", "name": "w\ud800"}),
            roots(),
        ),
        STREAM,
        "lone surrogate",
    ),
    "surrogate in a collection": (
        lambda d: records(
            d.head(),
            roots(),
            collections=jl(
                {"t": "collection", "v": 1, "kind": "notes", "name": "\udc80", "shape": "map"},
                {"t": "end", "count": 0},
            ),
        ),
        STREAM,
        "lone surrogate",
    ),
    "UTF-8-encoded surrogate bytes": (
        _raw(M.FILES, b'[{"p":"Home/\xed\xa0\x80","t":"d","m":493}]'),
        STREAM,
        "not UTF-8",
    ),
    "Latin-1 bytes in a path": (
        _raw(M.FILES, b'[{"p":"Home/caf\xe9","t":"d","m":493}]'),
        STREAM,
        "not UTF-8",
    ),
    "a BOM before the manifest": (
        lambda d: records(b"\xef\xbb\xbf" + dump(d.head()), roots()),
        STREAM,
        "manifest record is not valid JSON",
    ),
    "DEL in a path": (_files(fentry("Home/a\x7fb")), STREAM, "control character"),
    # ---- JSON shapes ---------------------------------------------------------------
    "summary a list": (_summary([1, 2]), STREAM, "summary is not an object"),
    "summary a string": (_summary("all fine"), STREAM, "summary is not an object"),
    "summary null": (_summary(None), STREAM, "summary is not an object"),
    "summary booleans": (
        _summary(lambda s: {**s, "collections": False, "records": False}),
        STREAM,
        "'collections' is 'False', not a count",
    ),
    "summary floats": (
        _summary(lambda s: {**s, "data_bytes": 3.0}),
        STREAM,
        "'data_bytes' is '3.0', not a count",
    ),
    "summary negative": (_summary(lambda s: {**s, "entries": -1}), STREAM, "not a count"),
    "summary missing a count": (
        _summary(lambda s: {k: v for k, v in s.items() if k != "files"}),
        STREAM,
        "'files' is 'None'",
    ),
    "manifest nested 100000 deep": (
        _raw(M.HEAD, b"[" * 100_000 + b"]" * 100_000),
        STREAM,
        "nested too deeply|nested deeper",
    ),
    "settings nested 600 deep": (
        _settings(model=_nested(600)),
        STREAM,
        "nested deeper than 512",
    ),
    "a file list nested deep": (_raw(M.FILES, b"[" * 5000 + b"]" * 5000), STREAM, "nested"),
    # deeper than 512 yet parsed: no entry is walked, each is refused as not an entry
    "a file list 700 deep": (_raw(M.FILES, b"[" * 700 + b"]" * 700), STREAM, "not an object"),
    "an entry's size nested": (
        _raw(M.FILES, b'[{"p":"Home/x","t":"f","m":420,"s":' + b"[" * 700 + b"]" * 700 + b"}]"),
        STREAM,
        "invalid size",
    ),
    "a collection line nested deep": (
        _raw(M.COLLECTION, b"[" * 5000 + b"]" * 5000 + b"\n"),
        STREAM,
        "nested",
    ),
    "a 10000-digit integer": (
        _raw(M.FILES, b'[{"p":"Home/x","t":"d","m":' + b"7" * 10000 + b"}]"),
        STREAM,
        "not valid JSON",
    ),
    "turns as booleans": (_settings(turns={"renew": True, "lapse": 1}), STREAM, r"\[turns\]"),
    "ports as strings": (_settings(ports={"base": "80"}), STREAM, r"\[ports\]"),
    "agent name not a string": (
        lambda d: records(
            d.head(agent={"id": d.agent_id, "owner": "local-hostile", "name": 5}), roots()
        ),
        STREAM,
        "agent name is invalid",
    ),
    "base_stream not hex": (_head(base_stream="../../x"), STREAM, "base stream is invalid"),
    "mtime past int64": (
        _files(fentry("Home/x", mt=1 << 64)),
        STREAM,
        "invalid mtime",
    ),
    "mode a boolean": (_files(fentry("Home/x", m=True)), STREAM, "invalid mode"),
    "size a float": (_files(fentry("Home/x", s=0.0)), STREAM, "invalid size"),
    "group a boolean": (_files(fentry("Home/x", g=False)), STREAM, "hard-link group"),
    "upper-case SHA": (
        _files(fentry("Home/x", b"abc", h=fentry("x", b"abc")["h"].upper()), data=b"abc"),
        STREAM,
        "invalid SHA-256",
    ),
    # ---- limits the spec states ----------------------------------------------------------
    "a FILES record of 2001 entries": (
        lambda d: records(
            d.head(), [*roots(), *(fentry(f"Home/f{i}") for i in range(1996))], batch=3000
        ),
        STREAM,
        "lists 2001 entries; a FILES record holds at most 2000",
    ),
    "a folder with a size": (
        _files(dentry("Home/d", s=5)),
        STREAM,
        r"folder 'Home/d' carries \['s'\]",
    ),
    "a folder in a link group": (_files(dentry("Home/d", g=1)), STREAM, r"carries \['g'\]"),
    "a folder with a SHA and data": (
        _files(dentry("Home/d", h="0" * 64, d=False)),
        STREAM,
        r"carries \['d', 'h'\]",
    ),
    "grants over 64 KiB": (
        _head(grants="#" + "x" * (64 << 10) + "\n"),
        STREAM,
        "grants are larger than 65536 bytes",
    ),
    "a size over 2^40": (_files(fentry("Home/x", s=(1 << 40) + 1)), STREAM, "invalid size"),
    "mode over 0o7777": (_files(fentry("Home/x", m=0o10000)), STREAM, "invalid mode"),
    "a collection line over its limit": (
        lambda d: records(
            d.head(),
            roots(),
            collections=b'{"t":"collection","x":"' + b"y" * (M.MAX_COLLECTION_LINE + 8),
        ),
        STREAM,
        "larger than any collection",
    ),
    "a record after the summary": (
        lambda d: [*records(d.head(), roots()), (M.FILES, b"[]")],
        STREAM,
        "follows the summary",
    ),
    "empty file with a SHA": (
        _files(fentry("Home/x", h=fentry("x", b"z")["h"])),
        STREAM,
        "not that of nothing",
    ),
    # ---- hard links across write rules -----------------------------------------------------------
    "skills linked to Home": (
        _files(
            fentry("Agent/skills/s.md", b"abc", group=0),
            fentry("Home/s.md", b"abc", group=0, carry=False),
            data=b"abc",
        ),
        STREAM,
        "hard link across folders with different write rules",
    ),
    "Home linked to instructions": (
        _files(
            fentry("Home/i.md", b"abc", group=4),
            fentry("Agent/instructions/i.md", b"abc", group=4, carry=False),
            data=b"abc",
        ),
        STREAM,
        "different write rules",
    ),
    "skills linked to memory": (
        _files(
            fentry("Agent/memory/m.md", b"abc", group=1),
            fentry("Agent/skills/m.md", b"abc", group=1, carry=False),
            data=b"abc",
        ),
        STREAM,
        "different write rules",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused(dest: Dest, case: str) -> None:
    build, code, match = CASES[case]
    dest.refuse(dest.stream(build(dest)), code, match)


def test_grants_nested_deeply_for_a_new_agent(fresh: Dest) -> None:
    """A new agent's grants are parsed (and filtered): TOML nested 30000 deep is refused."""
    h = fresh.head(grants="a = " + "[" * 30000 + "]" * 30000 + "\n")
    fresh.refuse(fresh.stream(records(h, roots())), STREAM, "grants are nested too deeply")


def test_names_with_c1_controls_and_odd_planes_are_applied(fresh: Dest) -> None:
    """The spec refuses C0 controls and DEL only: the rest of Unicode is a name."""
    names = ["a\u0085b", "\U0001f600", "\u202eexe.txt", "\ufeffbom", "\u00e9"]
    ents = [fentry(f"Home/{n}", n.encode(), mode=0o600) for n in names]
    fresh.accept(fresh.stream(records(fresh.head(), [*roots(), *ents], "".join(names).encode())))
    for n in names:
        assert (fresh.agent_root / "Home" / n).read_bytes() == n.encode()


def test_links_within_one_write_rule_still_travel(dest: Dest) -> None:
    ents = [
        fentry("Agent/skills/a.md", b"abc", group=0),
        fentry("Agent/instructions/a.md", b"abc", group=0, carry=False),
        fentry("Home/b.md", b"xyz", group=1),
        fentry("Agent/memory/b.md", b"xyz", group=1, carry=False),
    ]
    dest.accept(dest.stream(records(dest.head(), [*roots(), *ents], b"abcxyz")))
    agent = dest.agent_root / "Agent"
    assert (agent / "skills" / "a.md").stat().st_ino == (
        agent / "instructions" / "a.md"
    ).stat().st_ino
    assert (dest.agent_root / "Home" / "b.md").stat().st_ino == (
        agent / "memory" / "b.md"
    ).stat().st_ino


def test_a_sender_splits_links_across_write_rules(dest: Dest, tmp_path: Any) -> None:
    """An agent whose skill is hard-linked into Home moves: the two arrive as two files."""
    import os

    from hostile_kit import lnk

    src = dest.agent_root
    (src / "Agent" / "skills" / "s.md").write_bytes(b"skill\n")
    os.link(src / "Agent" / "skills" / "s.md", src / "Home" / "s.md")
    there = tmp_path / "there"
    there.mkdir()
    other = Dest.make(there, dest.agent_id, for_agent=False)
    p = lnk(dest.home, "agent", "state-send", "--to", other.pub.text())
    assert p.returncode == 0, p.stderr.decode()
    other.accept(p.stdout)
    a, b = other.agent_root / "Agent" / "skills" / "s.md", other.agent_root / "Home" / "s.md"
    assert a.read_bytes() == b.read_bytes() == b"skill\n"
    assert a.stat().st_ino != b.stat().st_ino
