"""The label read first, the older layout, a box's key, schedules and failed runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from bk_helpers import Recording, collections_of, give_keys, sample_agent, write
from lnkrun import lnk, ok
from servers import MotoServer

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup.agent import backup_agent
from lnk.backup.agent_repos import open_for_writing
from lnk.backup.agent_restore import restore_agent
from lnk.collections import CollectionId, FileStore
from lnk.errors import Refused
from lnk.transport.buckets import open_bucket


def test_unlabelled_bucket_restores_the_older_layout(
    src: Machine, dst: Machine, local_url: str
) -> None:
    a = registry.create(src, "old")
    h = a.folders.home
    write(h / "notes.txt", b"mine\n")
    write(h / "instructions" / "main.md", b"be brief\n")
    write(h / "memory" / "facts.md", b"sky is blue\n")
    store = FileStore(h / "chats")
    events = CollectionId("events", "link:main")
    for i in range(3):
        store.append(events, i + 1, {"role": "user", "text": f"hi {i}"})
    store.close()
    backup_agent(src, a, local_url, layout=1)
    assert open_bucket(local_url).labels() == {}
    give_keys(src, dst)
    rec = Recording(open_bucket(local_url))
    rep = restore_agent(dst, "old", local_url, bucket=rec)
    assert rec.calls[0] == "labels"  # before anything the backup folder holds
    assert rep.layout == 1 and rep.collections == 1
    b = registry.find(dst, "old")
    assert (b.folders.agent / "instructions" / "main.md").read_bytes() == b"be brief\n"
    assert (b.folders.agent / "memory" / "facts.md").read_bytes() == b"sky is blue\n"
    assert (b.folders.home / "notes.txt").read_bytes() == b"mine\n"
    assert not (b.folders.home / "instructions").exists()
    assert not (b.folders.home / "chats").exists()
    got = json.dumps(collections_of(b)["events/link:main"])
    assert all(f"hi {i}" in got for i in range(3))


def test_unlabelled_bucket_with_two_folder_backup_is_refused(
    src: Machine, dst: Machine, tmp_path: Path, local_url: str
) -> None:
    a = sample_agent(src)
    backup_agent(src, a, local_url)
    root = Path(local_url[len("file://") :])
    (root.parent / f".{root.name}.lnk-labels.json").unlink()
    give_keys(src, dst)
    with pytest.raises(Refused) as e:
        restore_agent(dst, "work", local_url)
    assert "lnk bucket label" in str(e.value.hint)
    assert not dst.settings_file("work").exists()
    ok("bucket", "label", local_url, home=src.home)
    restore_agent(dst, "work", local_url)
    assert registry.find(dst, "work").id == a.id


# ---- a box's key: objects only, and only the public half -----------------------------
BOX = "lnk-bk-box"
OBJECT_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{BOX}", f"arn:aws:s3:::{BOX}/*"],
        }
    ],
}
ADMIN = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]}],
}


@pytest.fixture(scope="module")
def enforcing(moto: MotoServer) -> Iterator[tuple[MotoServer, dict[str, str], dict[str, str]]]:
    """The session's moto, its IAM enforced for this module's tests alone."""
    server = moto
    try:
        server.client().create_bucket(Bucket=BOX)
        iam = server.client("iam")
        keys = {}
        for user, policy in (("box", OBJECT_ONLY), ("admin", ADMIN)):
            user = f"labels-{user}"  # one moto for the run: names of this module's own
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(policy))
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {
                "AWS_ACCESS_KEY_ID": k["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": k["SecretAccessKey"],
            }
        server.set_auth(True)
        yield server, keys["labels-box"], keys["labels-admin"]
    finally:
        server.set_auth(False)


class Split(Recording):
    """Objects in one real bucket, labels on another real bucket.

    moto 5.2 with IAM enforcement miscomputes the signature of every listing whose
    prefix holds a '/', and a repository lists index/, data/ and snapshots/; so the
    objects live in a local folder while the labels are asked of the enforcing S3
    bucket with the box's (or the owner's) real key."""

    def __init__(self, objects: str, labels_url: str) -> None:
        super().__init__(open_bucket(objects))
        self.label_bucket = open_bucket(labels_url)

    def labels(self) -> dict[str, str]:
        return self.label_bucket.labels()

    def set_label(self, name: str, value: str) -> None:
        self.label_bucket.set_label(name, value)


def test_box_key_backs_up_but_cannot_label_or_read(
    enforcing: tuple[MotoServer, dict[str, str], dict[str, str]],
    tmp_path: Path,
    local_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, box, admin = enforcing
    s3 = f"s3://{BOX}"
    owner, boxm, other = (
        Machine(tmp_path / "owner"),
        Machine(tmp_path / "box"),
        Machine(tmp_path / "other"),
    )
    open_for_writing(owner, open_bucket(local_url), local_url)  # the owner makes the repo
    box_key = ok("backup", "key", "export", "--public", home=owner.home).out
    assert "private " not in box_key and "repo " in box_key
    ok("backup", "key", "import", input=box_key, home=boxm.home)
    assert not (boxm.config_dir / "backup" / "owner.key").exists()
    a = sample_agent(boxm)
    server.env(monkeypatch, box["AWS_ACCESS_KEY_ID"], box["AWS_SECRET_ACCESS_KEY"])
    rep = backup_agent(boxm, a, local_url, bucket=Split(local_url, s3))
    assert rep.snapshot and not rep.labelled
    assert rep.label_problem and f"lnk bucket label {local_url}" in rep.label_problem
    with pytest.raises(Refused) as e:
        restore_agent(boxm, "work", local_url, force=True, bucket=Split(local_url, s3))
    assert "lnk backup key import" in str(e.value.hint)
    r = lnk("agent", "restore", "work", "--from", local_url, "--force", home=boxm.home)
    assert r.code == 6 and "lnk backup key import" in r.err
    # the owner labels with their account, and restores the box's backup
    server.env(monkeypatch, admin["AWS_ACCESS_KEY_ID"], admin["AWS_SECRET_ACCESS_KEY"])
    ok("bucket", "label", s3, home=owner.home)
    give_keys(owner, other)
    out = restore_agent(other, "work", local_url, bucket=Split(local_url, s3))
    assert out.layout == 2 and registry.find(other, "work").id == a.id


# ---- schedule and its failed runs -----------------------------------------------------
def test_schedule_writes_units_and_prints_the_crontab_line(src: Machine, local_url: str) -> None:
    a = sample_agent(src)
    r = ok(
        "agent",
        "backup",
        "schedule",
        "--to",
        local_url,
        "--every",
        "6h",
        "--keep",
        "daily=7,weekly=4",
        "--json",
    ).json()
    unit = src.home / ".config" / "systemd" / "user" / f"lnk-backup-{a.id}"
    assert sorted(r["files"]) == [f"{unit}.service", f"{unit}.timer"]
    service = Path(f"{unit}.service").read_text()
    assert f"--agent-id {a.id} --to {local_url} --scheduled --keep daily=7,weekly=4" in service
    timer = Path(f"{unit}.timer").read_text()
    assert "OnCalendar=*-*-* 00/6:00:00" in timer and "Persistent=true" in timer
    assert r["installed"] is False  # no systemd user manager runs here
    assert r["crontab"].startswith("0 */6 * * * ") and "--scheduled" in r["crontab"]
    text = ok(
        "agent",
        "backup",
        "schedule",
        "--to",
        local_url,
        "--every",
        "6h",
        "--keep",
        "daily=7,weekly=4",
    )
    assert "crontab" in text.err and text.out.strip() == r["crontab"]


def test_a_failed_scheduled_run_shows_in_status_and_logs(src: Machine, tmp_path: Path) -> None:
    sample_agent(src)
    gone = f"file://{tmp_path / 'nowhere'}"
    assert lnk("agent", "backup", "--to", gone, "--scheduled").code != 0
    st = ok("agent", "status", "--json").json()
    assert st["backup"]["ok"] is False and "nowhere" in st["backup"]["error"]
    assert "backup failed" in ok("agent", "status").out
    assert "FAILED" in ok("agent", "logs").out
    good = tmp_path / "good"
    good.mkdir()
    ok("agent", "backup", "--to", f"file://{good}", "--scheduled", "--keep", "last=3")
    assert ok("agent", "status", "--json").json()["backup"]["ok"] is True
