"""Throughput of a box-to-box stream relayed through this computer.

Starts the SSH test hosts of tests/hosts.py (needs root), then streams SIZE
bytes from hostA to hostB in several ways and prints a table of bytes/s:

* plain OpenSSH in a shell pipe (``ssh hostA ... | ssh hostB ...``), default
  cipher and aes128-gcm;
* ``lnk.transport.pipes.pipe`` (the two ssh processes share one OS pipe, fd to
  fd), both ciphers;
* the same two SshLeg processes with the bytes copied through Python, to show
  what the fd-to-fd relay saves.

    python bench/bench_ssh.py [--size 1G]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hosts import Hosts, running_hosts

from lnk.transport.legs import SshLeg
from lnk.transport.pipes import pipe

GCM = "aes128-gcm@openssh.com"


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1:].upper()])
    return int(text)


def plain(hosts: Hosts, size: int, cipher: str | None) -> float:
    c = f"-c {cipher} " if cipher else ""
    ssh = f"ssh -F {hosts.ssh_config} {c}"
    line = f"{ssh}hostA -- 'head -c {size} /dev/zero' | {ssh}hostB -- 'wc -c' "
    t = time.perf_counter()
    out = subprocess.run(line, shell=True, check=True, capture_output=True).stdout
    elapsed = time.perf_counter() - t
    assert int(out.split()[0]) == size, out
    return elapsed


def with_legs(hosts: Hosts, size: int, cipher: str | None) -> float:
    os.environ["LNK_SSH_COMMAND"] = hosts.ssh_command + (f" -c {cipher}" if cipher else "")
    t = time.perf_counter()
    pipe(SshLeg("hostA"), f"head -c {size} /dev/zero", SshLeg("hostB"), 'wc -c > "$HOME/count"')
    elapsed = time.perf_counter() - t
    got = SshLeg("hostB").run_shell('cat "$HOME/count"').stdout
    assert int(got.split()[0]) == size, got
    return elapsed


def through_python(hosts: Hosts, size: int, cipher: str | None) -> float:
    os.environ["LNK_SSH_COMMAND"] = hosts.ssh_command + (f" -c {cipher}" if cipher else "")
    t = time.perf_counter()
    with (
        SshLeg("hostA").popen_shell(f"head -c {size} /dev/zero") as a,
        SshLeg("hostB").popen_shell('wc -c > "$HOME/count"', stdin=subprocess.PIPE) as b,
    ):
        assert a.stdout is not None and b.stdin is not None
        src, dst = a.stdout.fileno(), b.stdin
        while chunk := os.read(src, 1 << 20):
            dst.write(chunk)
        b.wait()
        a.wait()
    elapsed = time.perf_counter() - t
    got = SshLeg("hostB").run_shell('cat "$HOME/count"').stdout
    assert int(got.split()[0]) == size, got
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="bytes to stream (K/M/G suffixes)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per case (best is shown)")
    args = ap.parse_args()
    size = _size(args.size)
    cases = [
        ("ssh A | ssh B (shell)", plain, None),
        ("ssh A | ssh B (shell)", plain, GCM),
        ("SshLeg pipe, fd to fd", with_legs, None),
        ("SshLeg pipe, fd to fd", with_legs, GCM),
        ("SshLeg, copied in Python", through_python, None),
        ("SshLeg, copied in Python", through_python, GCM),
    ]
    with tempfile.TemporaryDirectory(prefix="lnk-bench-") as d:
        os.environ["HOME"] = d
        with running_hosts(Path(d)) as hosts:
            print(f"{size} bytes hostA -> this computer -> hostB, best of {args.repeat}")
            print(f"{'case':28} {'cipher':24} {'seconds':>8} {'MiB/s':>8}")
            for label, fn, cipher in cases:
                best = min(fn(hosts, size, cipher) for _ in range(args.repeat))
                print(
                    f"{label:28} {cipher or 'default':24} {best:8.2f} "
                    f"{size / best / (1 << 20):8.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
