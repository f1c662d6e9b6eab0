"""What a receiver already holds: a sorted run of 32-byte SHA-256 digests.

The receiver hands it to the sender, which then sends no bytes of a file
whose content is in it.  Kept as one bytes object and searched by bisection,
so a million digests cost 32 MB, not a Python set's 150.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lnk.errors import InvalidInput

DIGEST = 32
MAGIC = b"LNKINV1\n"


class Inventory:
    def __init__(self, blob: bytes = b"") -> None:
        if len(blob) % DIGEST:
            raise InvalidInput("an inventory is a whole number of 32-byte digests",
                               hint="make a new one with lnk agent state-receive --inventory")
        self.blob = blob

    def __len__(self) -> int:
        return len(self.blob) // DIGEST

    def __contains__(self, digest: bytes | str) -> bool:
        d = bytes.fromhex(digest) if isinstance(digest, str) else digest
        lo, hi = 0, len(self)
        blob = self.blob
        while lo < hi:
            mid = (lo + hi) // 2
            cur = blob[mid * DIGEST:(mid + 1) * DIGEST]
            if cur < d:
                lo = mid + 1
            elif cur > d:
                hi = mid
            else:
                return True
        return False

    @classmethod
    def of(cls, digests: Iterable[bytes | str]) -> Inventory:
        items = sorted({bytes.fromhex(d) if isinstance(d, str) else bytes(d) for d in digests})
        return cls(b"".join(items))

    def to_bytes(self) -> bytes:
        return MAGIC + self.blob

    @classmethod
    def from_bytes(cls, data: bytes) -> Inventory:
        if not data.startswith(MAGIC):
            raise InvalidInput("that is not an lnk inventory",
                               hint="make one with lnk agent state-receive --inventory --receiver R")
        blob = data[len(MAGIC):]
        inv = cls(blob)
        for i in range(1, len(inv)):
            if blob[(i - 1) * DIGEST:i * DIGEST] >= blob[i * DIGEST:(i + 1) * DIGEST]:
                raise InvalidInput("the inventory is not sorted", hint="make a new one")
        return inv

    @classmethod
    def load(cls, path: Path) -> Inventory:
        return cls.from_bytes(path.read_bytes())
