"""Named fault points for tests: ``LNK_FAULT=point[,point...]`` kills the process there.

Only honoured when ``LNK_TESTING=1`` is set too, so nothing a user sets by
accident can make lnk die midway.
"""

from __future__ import annotations

import os
import signal


def armed(point: str) -> bool:
    if os.environ.get("LNK_TESTING") != "1":
        return False
    return point in os.environ.get("LNK_FAULT", "").split(",")


def fault(point: str) -> None:
    """Die here, as kill -9 would, if the test asked for it."""
    if armed(point):
        os.kill(os.getpid(), signal.SIGKILL)
