"""Seal + open throughput of the sealed stream (not a test; prints a table).

    python bench/bench_stream.py [MiB]        # default 128 MiB per row

MB/s are of logical (uncompressed) body bytes, 10^6 bytes per MB.  Seal and
open are timed separately, each over an in-memory sink/source, so the
figures are CPU only.
"""

from __future__ import annotations

import io
import os
import random
import sys
import time
from collections.abc import Iterator

from lnk.formats import RECORD_MAX, ReceiverKey, StreamReader, StreamWriter


class _Sink(io.RawIOBase):
    """Counts bytes and keeps the last stream for the open run (bounded by size)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.parts.append(bytes(b))
        return len(b)


def bodies(kind: str, mib: int) -> Iterator[bytes]:
    if kind == "random":
        block = os.urandom(RECORD_MAX)
        for i in range(mib):
            yield bytes([i % 256]) + block[1:]
    else:
        rnd = random.Random(1)
        vocab = [rnd.randbytes(rnd.randrange(3, 10)).hex().encode() for _ in range(500)]
        for i in range(mib):
            buf = bytearray()
            while len(buf) < RECORD_MAX:
                words = b" ".join(rnd.choices(vocab, k=rnd.randrange(4, 30)))
                buf += b'{"role":"assistant","id":"%s","seq":%d,"content":"%s"}\n' % (
                    rnd.randbytes(8).hex().encode(),
                    i,
                    words,
                )
            yield bytes(buf[:RECORD_MAX])


def run(kind: str, workers: int, mib: int, key: ReceiverKey) -> tuple[float, float, float]:
    data = list(bodies(kind, mib))
    sink = _Sink()
    t0 = time.perf_counter()
    with StreamWriter(sink, key.public, {"kind": "bench"}, workers=workers) as w:  # type: ignore[arg-type]
        for body in data:
            w.write(1, body)
    t1 = time.perf_counter()
    stream = io.BytesIO(b"".join(sink.parts))
    wire = len(stream.getvalue())
    del sink
    t2 = time.perf_counter()
    n = sum(len(b) for _, b in StreamReader(stream, key, workers=workers))
    t3 = time.perf_counter()
    total = sum(len(b) for b in data)
    assert n == total
    return total / (t1 - t0) / 1e6, total / (t3 - t2) / 1e6, total / wire


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    key = ReceiverKey.generate()
    print(f"{mib} MiB per row, {os.cpu_count()} CPUs")
    print(f"{'data':<14}{'workers':>8}{'seal MB/s':>12}{'open MB/s':>12}{'ratio':>8}")
    for kind in ("incompressible", "json-like"):
        for workers in (1, 2):
            seal, opn, ratio = run(
                "random" if kind == "incompressible" else "json", workers, mib, key
            )
            print(f"{kind:<14}{workers:>8}{seal:>12.0f}{opn:>12.0f}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
