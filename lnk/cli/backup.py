"""``lnk agent backup ...``, ``lnk agent restore``, ``lnk bucket label``, ``lnk backup key``.

The commands on a repository (list, verify, repair, prune) are ``backup_repo.py``'s.
"""

from __future__ import annotations

import os
import sys

import click

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup.agent_keys import note_told, pending_note
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, out, progress_bar, say, size_text
from lnk.errors import NotFound, UsageError
from lnk.transport.buckets import open_bucket


def _machine() -> Machine:
    return Machine.current()


@agent.group("backup", invoke_without_command=True)
@agent_option
@click.option("--to", "url", metavar="URL", help="s3://bucket/prefix, gs://... or file:///path")
@click.option(
    "--keep", metavar="RULES", default=None, help="then prune to RULES, e.g. daily=7,weekly=4"
)
@click.option("--scheduled", is_flag=True, hidden=True, help="a run started by the schedule")
@click.option("--agent-id", "agent_id", metavar="ID", hidden=True, help="the agent, by its ID")
@json_option
@click.pass_context
def backup(
    ctx: click.Context,
    agent_name: str | None,
    url: str | None,
    keep: str | None,
    scheduled: bool,
    agent_id: str | None,
    as_json: bool,
) -> None:
    """Back the agent up to a bucket (or list, verify, prune, schedule backups)."""
    if ctx.invoked_subcommand is not None:
        return
    if not url:
        raise UsageError("say where to back up to", hint="lnk agent backup --to URL")
    from lnk.backup.agent import run_backup

    m = _machine()
    if agent_id is not None:  # a scheduled run names its agent by ID
        from lnk.backup.schedule import bucket_env, scheduled_agent

        a = scheduled_agent(m, agent_id, url)
        if scheduled:
            os.environ.update(bucket_env(m, a))  # the agent's own key for its bucket
    else:
        a = registry.find(m, agent_name)
    bar = progress_bar(None, desc=f"backing up {a.name}")
    try:
        rep = run_backup(m, a, url, keep=keep, progress=bar.update)
    finally:
        bar.close()
        note = pending_note(m)  # the key pair this run made, told once, failed run or not
        if note:
            say(note)
            note_told(m)
    if rep.label_problem:
        say(rep.label_problem)
    if as_json:
        emit_json(rep.to_json())
        return
    out(rep.snapshot)
    if not scheduled:
        say(
            f"backed up {a.name}: {rep.files} files ({size_text(rep.bytes)}), {rep.collections} "
            f"collections; {rep.new_blobs} new blobs uploaded"
        )
    if rep.pruned and rep.pruned.forgotten:
        say(f"pruned {len(rep.pruned.forgotten)} of {rep.agent}'s snapshot(s)")


@backup.command("schedule")
@agent_option
@click.option("--to", "url", metavar="URL", default=None)
@click.option("--every", default="6h", show_default=True, help="how often: 30m, 6h, 1d")
@click.option("--keep", metavar="RULES", default=None, help="retention, e.g. daily=7,weekly=4")
@click.option("--show", is_flag=True, help="the agent's schedule here (JSON with --json)")
@click.option("--remove", is_flag=True, help="remove the agent's timer here")
@click.option("--agent-id", "agent_id", metavar="ID", hidden=True, help="the agent, by its ID")
@json_option
def schedule_(
    agent_name: str | None,
    url: str | None,
    every: str,
    keep: str | None,
    show: bool,
    remove: bool,
    agent_id: str | None,
    as_json: bool,
) -> None:
    """Back the agent up on a schedule (systemd user timer, launchd, or a crontab line)."""
    from lnk.backup.schedule import parse_every, parse_keep
    from lnk.backup.timers import install, read_schedule, uninstall

    m = _machine()
    if show or remove:
        aid = agent_id or registry.find(m, agent_name).id
        if remove:
            for f in uninstall(m, aid):
                say(f"removed {f}")
            return
        found = read_schedule(m, aid)
        if as_json:
            emit_json({"schedule": found})
        elif found is None:
            say("no backup schedule here")
        else:
            out(f"every {found['every_s']}s to {found['url']}, keep {found['keep'] or 'all'}")
        return
    if not url:
        raise UsageError("say where to back up to", hint="lnk agent backup schedule --to URL")
    a = registry.find(m, agent_name)
    open_bucket(url)  # a malformed URL fails now, not at 3 am
    sched = install(m, a, url, parse_every(every), parse_keep(keep))
    if as_json:
        emit_json(sched.to_json())
        return
    for f in sched.files:
        say(f"wrote {f}")
    if sched.installed:
        say(f"{a.name} is backed up every {every} to {url}")
    else:
        say(sched.note)
        out(sched.crontab, lines=True)


@backup.command("status")
@agent_option
@click.option("--max-age", metavar="AGE", default=None, help="fail when older, e.g. 2d, 12h")
@json_option
def status_(agent_name: str | None, max_age: str | None, as_json: bool) -> None:
    """The last backup run and success; with --max-age, exit 13 when too old (monitoring)."""
    from lnk.backup.schedule import absent_runs, backup_status, check_status

    m = _machine()
    if agent_name is not None and not m.settings_file(agent_name).exists():
        for run in absent_runs(m, agent_name):  # a timer left for an agent gone from here
            raise NotFound(
                f"the scheduled backup at {run['time']} failed: {run['error']}",
                hint=f"lnk agent backup schedule --agent-id {run['id']} --remove",
            )
    st = backup_status(registry.find(m, agent_name), max_age)
    if as_json:
        emit_json(st)
    else:
        out(
            f"last run: {st['last_run'] or 'never'}"
            + ("" if st["last_run_ok"] is not False else f" FAILED: {st['error']}")
        )
        out(f"last success: {st['last_ok'] or 'never'}" + (f" ({st['url']})" if st["url"] else ""))
    check_status(st)


@agent.command("restore")
@click.argument("name")
@click.option("--from", "url", metavar="URL", required=True)
@click.option("--snapshot", metavar="ID", default=None, help="default: the newest of NAME")
@click.option("--force", is_flag=True, help="overwrite the agent if it lives here")
@click.option(
    "--as",
    "as_name",
    metavar="NEWNAME",
    default=None,
    help="restore it as a separate agent NEWNAME, with a new ID",
)
@json_option
def restore(
    name: str, url: str, snapshot: str | None, force: bool, as_name: str | None, as_json: bool
) -> None:
    """Put the agent NAME back from a backup (refused if it lives elsewhere)."""
    from lnk.backup.agent_restore import restore_agent

    bar = progress_bar(None, desc=f"restoring {name}")
    try:
        rep = restore_agent(
            _machine(),
            name,
            url,
            snapshot=snapshot,
            force=force,
            as_name=as_name,
            progress=bar.update,
        )
    finally:
        bar.close()
    if as_json:
        emit_json(rep.to_json())
        return
    out(rep.id)
    say(
        f"restored {rep.agent} from snapshot {rep.snapshot[:12]}: {rep.files} files, "
        f"{rep.collections} collections" + (" (older layout)" if rep.layout == 1 else "")
    )
    if rep.kept_aside:
        say(f"the agent that was here is kept in {rep.kept_aside}")
    for box in rep.unanswered_boxes:
        say(f"box {box} did not answer, so it was not asked whether {rep.agent} lives there")
    from lnk.agents.policy import kept_lines

    for line in kept_lines(rep.kept_here, rep.dropped_grants, rep.agent):
        say(line)


# ---- top-level: lnk bucket, lnk backup ------------------------------------------------
@click.group()
def bucket() -> None:
    """Buckets that hold backups."""


@bucket.command("label")
@click.argument("url")
@json_option
def label(url: str, as_json: bool) -> None:
    """Label the bucket lnk-layout=2 (with your own account's credentials)."""
    from lnk.backup.agent_repos import LABEL, LAYOUT, label_bucket

    b = open_bucket(url)
    label_bucket(b)
    if as_json:
        emit_json({"url": url, "labels": {LABEL: LAYOUT}})
    else:
        say(f"labelled {b.describe()} {LABEL}={LAYOUT}")


@click.group("backup")
def backup_top() -> None:
    """The owner's backup key."""


@backup_top.group()
def key() -> None:
    """Export or import the owner's backup key."""


@key.command("export")
@click.option(
    "--public",
    "public_only",
    is_flag=True,
    help="leave the private key out: for a box that backs up but never reads",
)
def export(public_only: bool) -> None:
    """Print the backup key (SECRET: it reads every backup) and the repositories' secrets."""
    from lnk.backup import agent_keys

    sys.stdout.write(agent_keys.export(_machine(), include_private=not public_only))
    if sys.stdout.isatty():
        say("this is a secret: redirect it to a file, e.g. lnk backup key export > key")


@key.command("import")
@json_option
def import_(as_json: bool) -> None:
    """Install a backup key read from stdin (what lnk backup key export printed)."""
    from lnk.backup import agent_keys

    keys = agent_keys.import_keys(_machine(), agent_keys.parse_text(sys.stdin.read()))
    if as_json:
        emit_json({"private": keys.private is not None, "repositories": sorted(keys.repos)})
    else:
        say(
            f"imported the backup key ({'with' if keys.private else 'without'} its private "
            f"half) and {len(keys.repos)} repository secret(s)"
        )
