"""Every error lnk raises on purpose.

One root, :class:`LnkError`.  Each subclass carries a message written for the
person at the terminal, an optional hint (what to do about it) and an exit
code.  Library code raises and never prints; ``lnk.cli.main`` is the one place
that turns an error (or a signal) into ``lnk: error: ...`` / ``lnk: hint: ...``
on stderr and an exit code.

    LnkError                      1   anything else that went wrong
    ├── UsageError                2   the command line itself is wrong
    ├── NotFound                  3   no such agent, box, snapshot, receiver ...
    ├── AlreadyExists             4   a name or ID that is taken
    ├── InvalidInput              5   a name, setting or file that makes no sense
    ├── Refused                   6   policy says no (sandbox off, wrong owner ...)
    ├── SandboxUnavailable        7   bubblewrap missing or unable to run
    ├── AgentNotRunning           8   the agent's harness does not answer
    ├── PortsUnavailable          9   no free block of ports
    ├── StreamError              10   a stream is malformed, tampered or truncated
    │   └── FormatMismatch       11   a stream of another format number
    ├── TransportError           12   SSH, a box or a bucket failed
    ├── BackupError              13   a backup repository is damaged or refuses
    └── Interrupted             130   Ctrl-C or a signal (128 + signal number)

Add a subclass only where a caller branches on it.
"""

from __future__ import annotations


class LnkError(Exception):
    """Something went wrong."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(LnkError):
    exit_code = 2


class NotFound(LnkError):
    exit_code = 3


class AlreadyExists(LnkError):
    exit_code = 4


class InvalidInput(LnkError):
    exit_code = 5


class Refused(LnkError):
    exit_code = 6


class SandboxUnavailable(LnkError):
    exit_code = 7


class AgentNotRunning(LnkError):
    exit_code = 8


class PortsUnavailable(LnkError):
    exit_code = 9


class StreamError(LnkError):
    exit_code = 10


class FormatMismatch(StreamError):
    exit_code = 11


class TransportError(LnkError):
    exit_code = 12


class BackupError(LnkError):
    exit_code = 13


class Interrupted(LnkError):
    exit_code = 130

    def __init__(self, message: str = "interrupted", hint: str | None = None, signum: int = 2):
        super().__init__(message, hint)
        self.exit_code = 128 + signum


EXIT_CODES: dict[str, int] = {
    cls.__name__: cls.exit_code
    for cls in (
        LnkError,
        UsageError,
        NotFound,
        AlreadyExists,
        InvalidInput,
        Refused,
        SandboxUnavailable,
        AgentNotRunning,
        PortsUnavailable,
        StreamError,
        FormatMismatch,
        TransportError,
        BackupError,
        Interrupted,
    )
}
