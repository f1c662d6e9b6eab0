"""What the agent's bridge adds to a message: Telegram (the test Bot API server on loopback)
to the harness and back, against the same message handed to the endpoint directly, as
``lnk agent chat send`` hands it (the proof, then the keyed message, one connection).

    python bench/bench_bridge.py [-n 50]

It makes a throwaway HOME with one unsandboxed agent (the offline model), starts its
runner (and so its bridge), pairs a bot through the real ``lnk agent connect telegram``,
then measures, N times each:

* direct: ``send_message`` to the endpoint -> its answer;
* bridge: the owner's message queued on the Bot API server -> the bridge's sendMessage of
  the answer recorded there (its long poll woken, the ledger's writes, the endpoint's
  proof and turn, the sendMessage);

and prints the median and p90 of each and of what the bridge adds (bridge - direct).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "connections"), str(ROOT / "tests")]


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.9) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    n = ap.parse_args().n
    home = Path(tempfile.mkdtemp(prefix="lnk-bench-bridge-"))
    os.environ["HOME"] = str(home)
    from bridge_kit import OWNER, TOKEN, connect
    from telegram_api import BotApiServer

    from lnk.agents import registry
    from lnk.agents.layout import Machine
    from lnk.harness.client import read_key, send_message
    from lnk.runtime.startup import wait_for_endpoint

    agent = registry.create(Machine(home), "bench")
    agent.settings.sandbox = False
    agent.save()
    server = BotApiServer(conflict_delay=0)
    server.start()
    server.add_bot(TOKEN, username="bench_bot")
    runner = subprocess.Popen(
        [sys.executable, "-m", "lnk.runtime.runner", agent.id],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ep = wait_for_endpoint(agent.runtime, timeout=60, proc=runner)
        port, key = int(ep["port"]), read_key(agent.runtime / "key")
        r = connect(home, server, "bench")
        assert r.returncode == 0, r.stderr
        sent = len(server.sent(TOKEN))
        direct, bridged = [], []
        for i in range(n + 3):  # the first three warm up
            t0 = time.perf_counter()
            send_message(port, key, f"telegram:{OWNER}", f"direct {i}", message_id=f"d-{i}")
            d = time.perf_counter() - t0
            t0 = time.perf_counter()
            server.user_says(TOKEN, user_id=OWNER, text=f"bridged {i}")
            assert server.wait_sent(TOKEN, sent + 1, 30), "no answer came"
            b = time.perf_counter() - t0
            sent += 1
            if i >= 3:
                direct.append(d * 1000)
                bridged.append(b * 1000)
        added = [b - d for b, d in zip(bridged, direct, strict=True)]
        for name, xs in (("direct (chat send's path)", direct), ("through the bridge", bridged),
                         ("added by the bridge", added)):  # fmt: skip
            print(
                f"{name:28} median {statistics.median(xs):6.1f} ms   p90 {p90(xs):6.1f} ms   (n={n})"
            )
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(60)
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
