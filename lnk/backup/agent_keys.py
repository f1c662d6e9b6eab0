"""The owner's backup keys: ``~/.config/lnk/backup/``, outside every sandbox.

    owner.pub       the owner's public key (text); enough to back up
    owner.key       the private seed (hex), mode 0600; needed to restore
    repos.toml      mode 0600: for each repository ID its writer secret and
                    the URL it was last used at

A repository's *writer secret* (its master) is found by the repository's ID,
read from the bucket's plaintext ``config``: first in ``repos.toml``, else,
when the private key is here, by opening the master the config keeps sealed to
the owner (and then it is remembered in ``repos.toml``).

``lnk backup key export`` prints all of it as text (``--public`` leaves the
private seed out: what a box needs to back up but never read);
``lnk backup key import`` installs such a text on another machine.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import tomli_w

from lnk.agents.backup_key import EXPORT_COMMAND, EXPORTED
from lnk.agents.backup_key import key_dir as key_dir
from lnk.agents.layout import Machine
from lnk.errors import InvalidInput, Refused
from lnk.formats.keys import PublicKey, ReceiverKey, parse_public_key

EXPORT_MAGIC = "lnk-backup-key 1"
IMPORT_HINT = (
    "on the machine that made the backups run `lnk backup key export > key`, "
    "then here `lnk backup key import < key`"
)


@dataclass
class RepoSecret:
    repo_id: str
    secret: bytes
    url: str = ""


@dataclass
class BackupKeys:
    """What this machine holds of the owner's backup keys."""

    public: PublicKey
    private: ReceiverKey | None = None
    repos: dict[str, RepoSecret] = field(default_factory=dict)
    created: bool = False  # the pair was made just now, by :func:`ensure`

    def secret_for(self, repo_id: str) -> bytes | None:
        r = self.repos.get(repo_id)
        return r.secret if r else None


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load(machine: Machine) -> BackupKeys | None:
    """The keys here, or None when this machine has none yet."""
    d = key_dir(machine)
    private: ReceiverKey | None = None
    seed_file = d / "owner.key"
    if seed_file.exists():
        try:
            private = ReceiverKey.from_seed(bytes.fromhex(seed_file.read_text().strip()))
        except ValueError as e:
            raise InvalidInput(f"{seed_file} is damaged", hint=IMPORT_HINT) from e
    pub_file = d / "owner.pub"
    if pub_file.exists():
        public = parse_public_key(pub_file.read_text().strip())
    elif private is not None:
        public = private.public
    else:
        return None
    if private is not None and private.public.raw != public.raw:
        raise InvalidInput(f"{seed_file} and {pub_file} are not one key pair", hint=IMPORT_HINT)
    return BackupKeys(public, private, _load_repos(d / "repos.toml"))


def _load_repos(path: Path) -> dict[str, RepoSecret]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
        return {
            rid: RepoSecret(rid, bytes.fromhex(v["secret"]), str(v.get("url", "")))
            for rid, v in data.get("repos", {}).items()
        }
    except (tomllib.TOMLDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidInput(
            f"{path} is damaged ({e})", hint="fix or remove it, then import the key again"
        ) from e


def _save_repos(machine: Machine, repos: dict[str, RepoSecret]) -> None:
    doc = {"repos": {r.repo_id: {"secret": r.secret.hex(), "url": r.url} for r in repos.values()}}
    _write_private(key_dir(machine) / "repos.toml", tomli_w.dumps(doc))


def ensure(machine: Machine) -> BackupKeys:
    """The keys here, making the owner's pair on first use."""
    keys = load(machine)
    if keys is not None:
        return keys
    key = ReceiverKey.generate()
    _write_private(key_dir(machine) / "owner.key", key.seed.hex() + "\n")
    _write_private(key_dir(machine) / "owner.pub", key.public.text() + "\n")
    os.chmod(key_dir(machine) / "owner.pub", 0o644)
    return BackupKeys(key.public, key, {}, created=True)


def pending_note(machine: Machine) -> str | None:
    """The note about the key pair made here, until it has been told once (a run that made
    it and then failed tells it too: the pair stays)."""
    d = key_dir(machine)
    if (d / ".note-told").exists() or (d / EXPORTED).exists() or not (d / "owner.key").exists():
        return None
    return created_note(machine)


def note_told(machine: Machine) -> None:
    (key_dir(machine) / ".note-told").touch()


def created_note(machine: Machine) -> str:
    """What a run that made the owner's key pair says, once."""
    return (
        f"made your backup key pair in {key_dir(machine)}; restoring anywhere else "
        f"(a new machine, after this one is lost) needs its private half: run "
        f"`{EXPORT_COMMAND}` now and keep that file safe"
    )


def export(machine: Machine, include_private: bool = True) -> str:
    """The key as text (see :func:`export_text`); an export with the private key is
    remembered (``exported``), which stops ``lnk agent status`` warning."""
    keys = ensure(machine)
    text = export_text(keys, include_private)
    if include_private and keys.private is not None:
        (key_dir(machine) / EXPORTED).write_text(datetime.now(UTC).isoformat() + "\n")
    return text


def remember(machine: Machine, repo_id: str, secret: bytes, url: str) -> None:
    keys = load(machine)
    repos = keys.repos if keys else {}
    old = repos.get(repo_id)
    if old is not None and old.secret == secret and old.url == url:
        return
    repos[repo_id] = RepoSecret(repo_id, secret, url)
    _save_repos(machine, repos)


def require_private(keys: BackupKeys | None) -> ReceiverKey:
    if keys is None or keys.private is None:
        raise Refused(
            "reading a backup needs the owner's private backup key, and this machine "
            "holds only the public half"
            if keys
            else "reading a backup needs the owner's private backup key, and this machine "
            "has no backup key",
            hint=f"import it: {IMPORT_HINT}",
        )
    return keys.private


# ---- the text form --------------------------------------------------------------
def export_text(keys: BackupKeys, include_private: bool = True) -> str:
    lines = [EXPORT_MAGIC]
    if include_private and keys.private is not None:
        lines.append("# SECRET: this text reads every backup made to this key. Keep it like a")
        lines.append("# password; `lnk backup key import` installs it on another machine.")
    else:
        lines.append("# SECRET: the writer secrets below let a machine add backups (never read")
        lines.append("# them). `lnk backup key import` installs this on a box.")
    lines.append(f"public {keys.public.text()}")
    if include_private and keys.private is not None:
        lines.append(f"private {keys.private.seed.hex()}")
    for r in sorted(keys.repos.values(), key=lambda x: x.repo_id):
        lines.append(f"repo {r.repo_id} {r.secret.hex()} {r.url}".rstrip())
    return "\n".join(lines) + "\n"


def parse_text(text: str) -> BackupKeys:
    rows = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not rows or rows[0] != EXPORT_MAGIC:
        raise InvalidInput(
            f"this is not an lnk backup key (its first line is not {EXPORT_MAGIC!r})",
            hint="import what `lnk backup key export` printed",
        )
    public: PublicKey | None = None
    private: ReceiverKey | None = None
    repos: dict[str, RepoSecret] = {}
    try:
        for row in rows[1:]:
            word, _, rest = row.partition(" ")
            if word == "public":
                public = parse_public_key(rest.strip())
            elif word == "private":
                private = ReceiverKey.from_seed(bytes.fromhex(rest.strip()))
            elif word == "repo":
                parts = rest.split(" ", 2)
                repos[parts[0]] = RepoSecret(
                    parts[0], bytes.fromhex(parts[1]), parts[2] if len(parts) > 2 else ""
                )
            else:
                raise InvalidInput(f"unknown line {word!r} in the backup key")
    except (ValueError, IndexError) as e:
        raise InvalidInput(
            f"the backup key text is damaged ({e})", hint="export it again and import all of it"
        ) from e
    if public is None:
        public = private.public if private is not None else None
    if public is None:
        raise InvalidInput("the backup key text holds no key", hint="export it again")
    if private is not None and private.public.raw != public.raw:
        raise InvalidInput("the backup key's public and private halves do not match")
    return BackupKeys(public, private, repos)


def import_keys(machine: Machine, new: BackupKeys) -> BackupKeys:
    """Install ``new`` here; refuses to replace a different owner key."""
    have = load(machine)
    if have is not None and have.public.raw != new.public.raw:
        raise Refused(
            f"this machine already holds another backup key ({key_dir(machine)})",
            hint="move that folder aside first if you mean to replace it",
        )
    d = key_dir(machine)
    if new.private is not None:
        _write_private(d / "owner.key", new.private.seed.hex() + "\n")
        # imported from an export: a copy exists elsewhere, no warning here
        (d / EXPORTED).write_text(datetime.now(UTC).isoformat() + "\n")
    _write_private(d / "owner.pub", new.public.text() + "\n")
    os.chmod(d / "owner.pub", 0o644)
    repos = (have.repos if have else {}) | new.repos
    _save_repos(machine, repos)
    out = load(machine)
    assert out is not None
    return out
