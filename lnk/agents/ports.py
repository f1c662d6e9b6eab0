"""Blocks of ports for agents.

``main`` keeps its harness's default ports.  Other agents allocate from 20000
upward, free of this user's other agents and of ports a program holds now.  At
start, if a program holds a port of the block, the agent moves to a random free
block below 32768 before it starts anything.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable

from lnk.errors import PortsUnavailable

BLOCK = 4
FIRST = 20000
LIMIT = 32768  # the kernel hands out ephemeral ports above this
DEFAULT_PORTS = {"builtin": 18700, "hermes": 8642}  # Hermes's API server's port


def _test_offset() -> int:
    """Under lnk's own test suite alone (``LNK_TESTING=1``), each parallel test worker's
    agents take their ports ``LNK_TEST_PORT_OFFSET`` higher, so two workers' agents never
    race for one block."""
    if os.environ.get("LNK_TESTING") != "1":
        return 0
    v = os.environ.get("LNK_TEST_PORT_OFFSET", "")
    return int(v) if v.isdigit() and int(v) < 8000 else 0


def first() -> int:
    """The first port of the blocks agents other than ``main`` are given."""
    return FIRST + _test_offset()


def default_base(harness: str) -> int | None:
    """``main``'s block for this harness: the harness's own default ports."""
    base = DEFAULT_PORTS.get(harness)
    return None if base is None else base + _test_offset()


def port_free(port: int) -> bool:
    """True if nothing listens on (or holds) this loopback port now."""
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.bind((addr, port))
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (99, 97):  # no IPv6 here
                continue
            return False
        finally:
            s.close()
    return True


def block_free(base: int, count: int = BLOCK) -> bool:
    return all(port_free(p) for p in range(base, base + count))


def _overlaps(base: int, count: int, taken: Iterable[tuple[int, int]]) -> bool:
    return any(base < b + c and b < base + count for b, c in taken)


def allocate(name: str, harness: str, taken: list[tuple[int, int]], count: int = BLOCK) -> int:
    """A base port for a new agent: main gets the harness default."""
    main_base = default_base(harness) if name == "main" else None
    if main_base is not None and not _overlaps(main_base, count, taken):
        return main_base
    base = first()
    while base + count <= LIMIT:
        if not _overlaps(base, count, taken) and block_free(base, count):
            return base
        base += count
    raise PortsUnavailable(
        f"no free block of {count} ports between {FIRST} and {LIMIT}",
        hint="remove agents you no longer use (lnk agent remove NAME) or stop programs holding ports",
    )


def random_free_block(
    taken: list[tuple[int, int]],
    count: int = BLOCK,
    tries: int = 200,
    rng: random.Random | None = None,
) -> int:
    rng = rng or random.Random()
    for _ in range(tries):
        base = rng.randrange(1024, LIMIT - count) // count * count
        if not _overlaps(base, count, taken) and block_free(base, count):
            return base
    raise PortsUnavailable(
        "every port block tried below 32768 is held by a program",
        hint="stop the programs holding ports on this machine, then start the agent again",
    )
