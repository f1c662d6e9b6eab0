"""The test hosts themselves: separate machines, and no leftovers after a crash."""

from __future__ import annotations

import os
import subprocess

from hosts import PREFIX, Hosts, clean_stale


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def _names() -> str:
    return (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        + subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    )


def test_stale_namespaces_and_links_are_removed() -> None:
    pid = _dead_pid()
    ns, br = f"{PREFIX}{pid}x", f"{PREFIX}{pid}br"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", br, "type", "bridge"], check=True)
    try:
        assert ns in _names() and br in _names()
        clean_stale()
        assert ns not in _names()
        assert br not in _names()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", br], capture_output=True)


def test_hosts_are_separate_machines(ssh_hosts: Hosts) -> None:
    homes = set()
    for name in ("hostA", "hostB", "hostC"):
        r = ssh_hosts.ssh(name, 'printf "%s %s" "$HOME" "$(hostname -I)"')
        assert r.returncode == 0, r.stderr
        home, addr = r.stdout.decode().split()
        assert home == str(ssh_hosts[name].home)
        assert addr == ssh_hosts[name].address
        homes.add(home)
    assert len(homes) == 3
    # the live session's own namespaces are not stale
    clean_stale()
    assert ssh_hosts.ssh("hostA", "true").returncode == 0
