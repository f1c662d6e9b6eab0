"""Where the owner's backup key lives, and whether it was ever exported (data only).

``lnk.backup.agent_keys`` writes these files; ``lnk agent status`` reads them to
warn that a backup key that exists on this machine alone restores nothing after
the machine is lost.
"""

from __future__ import annotations

from pathlib import Path

from lnk.agents.layout import Machine

EXPORTED = "exported"  # written by `lnk backup key export` (with the private key)
EXPORT_COMMAND = "lnk backup key export > backup-key.txt"


def key_dir(machine: Machine) -> Path:
    return machine.config_dir / "backup"


def key_warning(machine: Machine) -> str | None:
    """A warning while this machine holds the private backup key and it was never
    exported; None otherwise."""
    d = key_dir(machine)
    if not (d / "owner.key").exists() or (d / EXPORTED).exists():
        return None
    return (
        "the backup key was never exported: if this machine is lost, no backup can be "
        f"restored; run `{EXPORT_COMMAND}` and keep the file safe"
    )
