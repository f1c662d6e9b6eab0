"""Link's own harness, ``builtin``, answering the contract in-process: the first adapter.

Its answers are the same typed values an outside adapter's parse into; what it does
not need to ask (install: it is lnk; configure: the runner writes ``harness.json`` at
each start, so there is nothing to keep in step; endpoint: the runner's own command)
is said in docs/adapters.md.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from lnk.agents.layout import AGENT_COLLECTION_DIRS
from lnk.harnesses import contract as C

NAME = "builtin"


def release() -> str:
    try:
        return version("lnk")
    except PackageNotFoundError:
        return "0"


def describe() -> C.Describe:
    return C.Describe(NAME, release(), release(), C.CONTRACT_VERSION)


def needs() -> C.Needs:
    return C.Needs(("model",))


def internet_hosts() -> C.Hosts:
    return C.Hosts(())  # nothing to install


def state() -> C.State:
    """Its brain's folders (chats travel as collections), and the person's Home."""
    paths = [C.StatePath(f"Agent/{d}", "dir") for d in AGENT_COLLECTION_DIRS]
    return C.State((*paths, C.StatePath("Home", "dir")))
