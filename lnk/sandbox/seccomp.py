"""The sandbox's seccomp filter: the system calls no harness needs, refused.

bubblewrap loads a compiled filter from a file descriptor (``--seccomp FD``);
libseccomp (through ``pyseccomp``, its ctypes binding) compiles it.  The
filter is a deny list on top of what the dropped capabilities already stop:
a call a capability would refuse is refused here too, so a kernel bug behind
one of them (mounts, keyrings, BPF, io_uring, user namespaces) is out of the
agent's reach even where a capability check is missing.

Refused with ``EPERM``: mounting and pivoting, tracing other processes and
reading their memory, kernel modules and kexec, the kernel keyring, BPF,
perf events, userfaultfd, entering or making namespaces (``setns``,
``unshare``, ``clone`` with a ``CLONE_NEW*`` flag), handles to files by
number, swap, reboot, the kernel log, accounting, quotas, I/O ports, the
clock, io_uring, and the terminal's ``TIOCSTI``/``TIOCLINUX``.  ``clone3``
answers ``ENOSYS`` (its flags are in memory a filter can't read), so the C
library falls back to ``clone``, whose flags it can.
"""

from __future__ import annotations

import errno
import tempfile
from functools import cache

from lnk.errors import SandboxUnavailable

REFUSED = (
    # mounts and the root
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    # the kernel itself
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "lookup_dcookie",
    "syslog",
    "acct",
    "quotactl",
    "quotactl_fd",
    "swapon",
    "swapoff",
    "reboot",
    "iopl",
    "ioperm",
    "vhangup",
    # namespaces
    "setns",
    "unshare",
    # files by handle (a handle names a file outside the sandbox's mounts)
    "open_by_handle_at",
    "name_to_handle_at",
    # the clock
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    # io_uring: a large kernel surface no harness needs
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)

CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

HINT = "install libseccomp (apt-get install libseccomp2) and pip's pyseccomp"


@cache
def compiled() -> bytes:
    """The filter as BPF bytes, for this machine's architecture (compiled once)."""
    try:
        import pyseccomp as sc  # noqa: PLC0415 (Linux only; a missing libseccomp is refused here)
    except (ImportError, OSError) as e:
        raise SandboxUnavailable(
            f"the sandbox's system call filter can't be made: {e}", hint=HINT
        ) from e
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        eperm = sc.ERRNO(errno.EPERM)
        for name in REFUSED:
            try:
                f.add_rule(eperm, name)
            except (OSError, ValueError, RuntimeError):
                continue  # a call this architecture doesn't have
        for flag in CLONE_NEW_FLAGS:
            f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for request in (TIOCSTI, TIOCLINUX):
            f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        with tempfile.TemporaryFile() as out:
            f.export_bpf(out)
            out.seek(0)
            bpf = out.read()
    except (OSError, ValueError, RuntimeError) as e:
        raise SandboxUnavailable(
            f"the sandbox's system call filter can't be compiled: {e}", hint=HINT
        ) from e
    return bpf
