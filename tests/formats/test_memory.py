"""Streaming 200 MiB through writer and reader keeps memory bounded."""

from __future__ import annotations

import hashlib
import os
import threading
import tracemalloc

from lnk.formats import RECORD_MAX, ReceiverKey, StreamReader, StreamWriter

TOTAL_RECORDS = 200  # 200 MiB of bodies
PEAK_LIMIT = 32 * 1024 * 1024


def test_200_mib_through_a_pipe_in_bounded_memory() -> None:
    key = ReceiverKey.generate()
    block = os.urandom(RECORD_MAX)  # incompressible: every record is a full 1 MiB
    text = (b'{"role":"assistant","content":"ok"}\n' * 30000)[:RECORD_MAX]
    sent = hashlib.sha256()
    errors: list[BaseException] = []
    rfd, wfd = os.pipe()

    def send() -> None:
        try:
            with os.fdopen(wfd, "wb") as out, StreamWriter(out, key.public, {"kind": "bulk"}) as w:
                for i in range(TOTAL_RECORDS):
                    body = (text if i % 4 == 0 else block)[: RECORD_MAX - i % 3]
                    sent.update(body)
                    w.write(1, body)
        except BaseException as exc:  # pragma: no cover - asserted below
            errors.append(exc)

    tracemalloc.start()
    try:
        sender = threading.Thread(target=send)
        sender.start()
        got = hashlib.sha256()
        count = 0
        total = 0
        with os.fdopen(rfd, "rb") as inp:
            reader = StreamReader(inp, key)
            for _rtype, body in reader:
                got.update(body)
                count += 1
                total += len(body)
        sender.join(timeout=120)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not sender.is_alive() and not errors
    assert reader.complete and count == TOTAL_RECORDS
    assert total > 199 * RECORD_MAX
    assert got.digest() == sent.digest()
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.1f} MiB"
