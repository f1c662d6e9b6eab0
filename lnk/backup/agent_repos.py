"""Opening an agent's backup repository, and the bucket's layout label.

To write (a backup: the repository made on first use, its writer secret
remembered), to read (a restore: the owner's private key), to list, verify and
prune (either), or to repair (the strongest key here).  The bucket's label
(docs/backup.md, "The label") says how its backups are laid out.
"""

from __future__ import annotations

from lnk.agents.layout import Machine
from lnk.backup import agent_keys
from lnk.backup.maintenance import RepairReport, repair
from lnk.backup.repository import Repository
from lnk.errors import FormatMismatch, Refused
from lnk.transport.buckets import Bucket, open_bucket

LABEL = "lnk-layout"
LAYOUT = "2"


def open_for_writing(machine: Machine, bucket: Bucket, url: str) -> tuple[Repository, bool]:
    """The repository in ``bucket`` opened to write (made on first use), and whether it
    was made now.  The writer secret is remembered here by the repository's ID."""
    return open_with_keys(machine, bucket, url, agent_keys.ensure(machine))


def open_with_keys(
    machine: Machine, bucket: Bucket, url: str, keys: agent_keys.BackupKeys
) -> tuple[Repository, bool]:
    """:func:`open_for_writing` with the backup keys loaded (or made) already."""
    if not bucket.exists("config"):
        repo = Repository.init(bucket, keys.public)
        agent_keys.remember(machine, repo.id, repo.writer_secret, url)
        return repo, True
    plain = Repository.open(bucket)  # reads the config (once): learns the ID
    secret = keys.secret_for(plain.id)
    if secret is not None:
        repo = plain.unlock(writer_secret=secret)
    elif keys.private is not None:
        repo = plain.unlock(receiver_key=keys.private)
    else:
        raise Refused(
            f"this machine holds no writer secret for the repository in {url}",
            hint=f"install the owner's key with the repository's secret: {agent_keys.IMPORT_HINT}",
        )
    if repo.owner.raw != keys.public.raw:
        raise Refused(
            f"the repository in {url} belongs to another backup key",
            hint="back up to another URL, or import that repository's key",
        )
    agent_keys.remember(machine, repo.id, repo.writer_secret, url)
    return repo, False


def open_for_reading(machine: Machine, bucket: Bucket, url: str) -> Repository:
    private = agent_keys.require_private(agent_keys.load(machine))
    repo = Repository.open(bucket, receiver_key=private)
    agent_keys.remember(machine, repo.id, repo.writer_secret, url)
    return repo


def open_for_listing(
    machine: Machine, bucket: Bucket, url: str, *, prefer_private: bool = False
) -> Repository:
    """Writer secret or private key: enough to list, verify and prune (with
    ``prefer_private``, the private key where it is here: a repair reads data)."""
    keys = agent_keys.load(machine)
    if keys is None:
        raise Refused("this machine has no backup key", hint=agent_keys.IMPORT_HINT)
    plain = Repository.open(bucket)
    secret = keys.secret_for(plain.id)
    if secret is not None and not (prefer_private and keys.private is not None):
        return plain.unlock(writer_secret=secret)
    if keys.private is not None:
        repo = plain.unlock(receiver_key=keys.private)
        agent_keys.remember(machine, repo.id, repo.writer_secret, url)
        return repo
    raise Refused(
        f"this machine holds no writer secret for the repository in {url}",
        hint=agent_keys.IMPORT_HINT,
    )


def repair_repository(machine: Machine, url: str) -> RepairReport:
    """``lnk agent backup repair``: the repository at ``url`` opened with the strongest
    key here (the owner's, to salvage blobs), then :func:`maintenance.repair`."""
    return repair(open_for_listing(machine, open_bucket(url), url, prefer_private=True))


# ---- labels -----------------------------------------------------------------------
def label_bucket(bucket: Bucket) -> None:
    bucket.set_label(LABEL, LAYOUT)


def read_layout(bucket: Bucket) -> int:
    """The layout the bucket's label says: 2, or 1 when it has none."""
    try:
        labels = bucket.labels()
    except Refused as e:
        raise Refused(
            f"could not read the labels of {bucket.describe()}, which say how its "
            f"backups are laid out ({e.message})",
            hint="restore with your own account's credentials, which may read the bucket's labels",
        ) from e
    value = labels.get(LABEL)
    if value is None:
        return 1
    if value != LAYOUT:
        raise FormatMismatch(
            f"{bucket.describe()} is labelled {LABEL}={value}; this lnk "
            f"reads layouts 1 and {LAYOUT}",
            hint="upgrade lnk",
        )
    return 2
