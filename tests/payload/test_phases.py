"""Receiver keys and the bulk/final phases, in-process."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest
from payload_helpers import (
    EVENTS,
    agent_files,
    collections_of,
    fill_collections,
    load_agent,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.errors import NotFound, StreamError
from lnk.formats.reader import StreamReader
from lnk.payload import manifest as M
from lnk.payload import receivers
from lnk.payload.send import send_agent


def test_the_key_is_private_and_gone_after_commit(src: Machine, dst: Machine) -> None:
    r = prepare(dst)
    key = r.dir / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(r.dir.stat().st_mode) == 0o700
    a = sample_agent(src)
    data, _ = send_bytes(a, r)
    assert receive_bytes(dst, r, data).committed
    assert not key.exists() and not r.dir.exists()
    with pytest.raises(NotFound):
        receivers.open_receiver(dst, r.rid)


def test_abandon_deletes_the_key(dst: Machine) -> None:
    r = prepare(dst)
    r.abandon()
    assert not (r.dir / "key").exists()
    with pytest.raises(NotFound):
        receivers.open_receiver(dst, r.rid)


def _records(data: bytes, r: receivers.Receiver) -> list[tuple[int, bytes]]:
    import io

    return list(StreamReader(io.BytesIO(data), r.key()))


def _events_in(records: list[tuple[int, bytes]]) -> list[int]:
    lines = b"".join(body for t, body in records if t == M.COLLECTION).splitlines()
    return [rec["n"] for rec in map(json.loads, lines) if rec["t"] == "event"]


def test_bulk_then_final(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)  # 3 events
    r = prepare(dst)
    bulk, brep = send_bytes(a, r, phase="bulk")
    rep = receive_bytes(dst, r, bulk)
    assert rep.phase == "bulk" and not rep.committed
    assert (r.dir / "key").exists()  # the final phase needs it
    assert not dst.folders("work").root.exists() and not dst.settings_file("work").exists()
    assert brep.watermarks == {"events/link:main": 3}
    # the agent keeps working while the bulk travels
    fill_collections(a, events=2)
    changed = os.urandom(5000)
    write(a.folders.home / "docs" / "report.txt", changed)
    final, frep = send_bytes(
        a,
        r,
        phase="final",
        since=brep.watermarks,
        base_stream=brep.stream_id,
        inventory=r.inventory(),
    )
    assert _events_in(_records(final, r)) == [4, 5]  # only what came after the bulk
    assert frep.data_bytes == len(changed)  # only the changed file's bytes
    rep = receive_bytes(dst, r, final)
    assert rep.committed and rep.phase == "final"
    b = load_agent(dst)
    want = agent_files(a.folders.root)
    assert agent_files(b.folders.root) == want
    assert collections_of(b) == collections_of(a)
    assert [e.number for e in _store_events(b)] == [1, 2, 3, 4, 5]
    assert not r.dir.exists()


def _store_events(agent):
    from lnk.agents.stores import open_agent_store

    s = open_agent_store(agent.folders.chats, agent.settings.store)
    try:
        return s.read(EVENTS)
    finally:
        s.close()


def test_a_final_without_its_bulk_is_refused(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    r = prepare(dst)
    final, _ = send_bytes(a, r, phase="final", base_stream="00" * 16)
    with pytest.raises(StreamError, match="builds on"):
        receive_bytes(dst, r, final)
    assert not dst.folders("work").root.exists()


def test_a_final_on_another_bulk_is_refused(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    r = prepare(dst)
    bulk, brep = send_bytes(a, r, phase="bulk")
    receive_bytes(dst, r, bulk)
    final, _ = send_bytes(a, r, phase="final", since=brep.watermarks, base_stream="ab" * 16)
    with pytest.raises(StreamError, match="builds on"):
        receive_bytes(dst, r, final)
    assert (r.dir / "key").exists()
    assert not dst.folders("work").root.exists()


class _Flushes(io.BytesIO):
    """A stream's bytes, and how many had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[int] = []

    def flush(self) -> None:
        self.at.append(len(self.getvalue()))
        super().flush()


@pytest.mark.parametrize("phase", ["full", "bulk", "final"])
def test_a_send_puts_its_head_on_the_wire_before_it_walks(
    src: Machine, dst: Machine, phase: str
) -> None:
    """The HEAD goes out alone first: the receiver learns what arrives, and starts its
    check of what it holds (a walk of its base, for a final) beside the send's walk,
    not once the stream has ended."""
    a = sample_agent(src)
    r = prepare(dst)
    out = _Flushes()
    send_agent(a, out, r.key().public, phase=phase, base_stream="00" * 16)
    assert len(out.at) >= 2 and out.at[0] < out.at[-1]
    first = StreamReader(io.BytesIO(out.getvalue()[: out.at[0]]), r.key())
    records = iter(first)
    rtype, body = next(records)
    assert rtype == M.HEAD and json.loads(body)["phase"] == phase
    with pytest.raises(StreamError, match="cut short"):
        next(records)  # nothing but the HEAD had been written
