"""Latency of the built-in harness, sandboxed and not.

    python bench/bench_agent.py [-n 50]

For each mode it makes a throwaway HOME with one agent, starts the runner
(``python -m lnk.runtime.runner``) and measures:

* cold start: runner launched -> first answer received;
* message to first byte: a proved message (challenge, proof, keyed message on
  one connection) -> the first byte of the answer, median and p90 over N.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_byte(port: int, key: bytes, text: str) -> float:
    from lnk.bridges.proof import new_challenge, verify_endpoint_proof

    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    challenge = new_challenge()
    conn.request(
        "POST",
        "/_link/proof",
        body=json.dumps({"challenge": base64.b64encode(challenge).decode()}),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    proof = base64.b64decode(json.loads(resp.read())["proof"])
    assert verify_endpoint_proof(key, challenge, proof)
    conn.request(
        "POST",
        "/_link/message",
        body=json.dumps({"thread": "link:bench", "text": text}),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + base64.b64encode(key).decode(),
        },
    )
    resp = conn.getresponse()  # returns once the status line (the first byte) arrived
    elapsed = time.perf_counter() - t0
    resp.read()
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"the agent answered HTTP {resp.status}")
    return elapsed


def bench(sandbox: bool, n: int) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="lnk-bench-"))
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    proc = None
    try:
        from lnk.agents import registry
        from lnk.agents.layout import Machine
        from lnk.harness import client
        from lnk.runtime.startup import wait_for_endpoint

        agent = registry.create(Machine.current(), "bench")
        agent.settings.sandbox = sandbox
        agent.save()
        log = open(home / "runner.log", "wb")  # noqa: SIM115 - closed with the runner
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "lnk.runtime.runner", agent.id],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        endpoint = wait_for_endpoint(agent.runtime, timeout=60, proc=proc)
        key = client.read_key(agent.runtime / "key")
        client.send_message(endpoint["port"], key, "link:bench", "first", timeout=60)
        cold = time.perf_counter() - t0
        times = [first_byte(endpoint["port"], key, f"message {i}") for i in range(n)]
        return {
            "cold": cold,
            "median": statistics.median(times),
            "p90": sorted(times)[max(0, int(len(times) * 0.9) - 1)],
        }
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        if old_home is not None:
            os.environ["HOME"] = old_home
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=50, help="messages per mode (default 50)")
    args = ap.parse_args()
    rows = [("unsandboxed", bench(False, args.n)), ("sandboxed", bench(True, args.n))]
    print(f"{'mode':<12} {'cold start->answer':>20} {'msg->1st byte median':>22} {'p90':>10}")
    for mode, r in rows:
        print(
            f"{mode:<12} {r['cold'] * 1000:>17.1f} ms {r['median'] * 1000:>19.2f} ms "
            f"{r['p90'] * 1000:>7.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
