"""``lnk agent backup list / verify / repair / prune``: what a repository holds, checked,
repaired and pruned (the commands of the ``lnk agent backup`` group in ``backup.py`` that
work on a repository, not on one agent)."""

from __future__ import annotations

from typing import Any

import click

from lnk.agents.layout import Machine
from lnk.backup.maintenance import group_of, prune, verify
from lnk.cli.agent import json_option
from lnk.cli.backup import backup
from lnk.cli.output import emit_json, out, say, size_text, table
from lnk.errors import NotFound
from lnk.transport.buckets import open_bucket


def _listing(url: str):  # type: ignore[no-untyped-def,unused-ignore]
    from lnk.backup.agent_repos import open_for_listing

    return open_for_listing(Machine.current(), open_bucket(url), url)


@backup.command("list")
@click.option("--from", "url", metavar="URL", required=True)
@json_option
def list_(url: str, as_json: bool) -> None:
    """List the snapshots in a bucket."""
    from lnk.backup.agent_snapshots import snapshot_row

    rows = [snapshot_row(s) for s in _listing(url).list_snapshots()]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        say(f"no backups in {url} yet")
        return
    table(
        [
            [r["id"][:12], r["time"][:19], str(r["agent"]), str(r["files"]), size_text(r["bytes"])]
            for r in rows
        ],
        ["ID", "TIME", "AGENT", "FILES", "SIZE"],
    )


@backup.command("verify")
@click.option("--from", "url", metavar="URL", required=True)
@click.option("--read-data", is_flag=True, help="download every pack and check its SHA-256")
@json_option
def verify_(url: str, read_data: bool, as_json: bool) -> None:
    """Check that every snapshot's data is there (and intact, with --read-data).

    A damaged or missing pack is recorded: the next backup stores its data again."""
    from lnk.errors import BackupError

    rep = verify(_listing(url), read_data=read_data)
    if as_json:
        emit_json(rep.to_json())
    else:
        for p in rep.problems:
            out(p)
        say(
            f"{rep.snapshots} snapshots, {rep.packs} packs"
            f"{f' ({rep.packs_read} read)' if read_data else ''}: "
            f"{'ok' if rep.ok else f'{len(rep.problems)} problem(s)'}"
            + (f"; {len(rep.healed)} damaged pack(s) healed" if rep.healed else "")
        )
    if not rep.ok:
        raise BackupError(
            f"{url} has {len(rep.problems)} problem(s)",
            hint="the damage is recorded: the next lnk agent backup stores the data "
            f"again (or run lnk agent backup repair --from {url})",
        )


@backup.command("repair")
@click.option("--from", "url", metavar="URL", required=True)
@json_option
def repair_(url: str, as_json: bool) -> None:
    """Read every pack, record the damaged ones, and store again what still opens."""
    from lnk.backup.agent_repos import repair_repository
    from lnk.errors import BackupError

    rep = repair_repository(Machine.current(), url)
    if as_json:
        emit_json(rep.to_json())
    else:
        for p in rep.verify.problems:
            out(p)
        say(
            f"{len(rep.damaged)} damaged pack(s) found; {rep.salvaged} blob(s) stored "
            f"again, {rep.lost} lost"
            + ("; salvaging needs the owner's private key" if rep.needs_key else "")
        )
    if not rep.verify.ok:
        raise BackupError(
            f"{url} still has {len(rep.verify.problems)} problem(s)",
            hint="back up the agents again: what is lost is stored again from their files",
        )


@backup.command("prune")
@click.option("--from", "url", metavar="URL", required=True)
@click.option("--keep", metavar="RULES", required=True, help="e.g. daily=7,weekly=4")
@click.option(
    "--agent",
    "agents",
    metavar="NAME|ID",
    multiple=True,
    help="only this agent's snapshots (by default each agent's, on their own)",
)
@click.option("--dry-run", is_flag=True, help="say what would go, remove nothing")
@json_option
def prune_(url: str, keep: str, agents: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Forget the snapshots the rules do not keep (each agent's on their own), and
    delete data none needs."""
    from lnk.backup.schedule import parse_keep

    repo = _listing(url)
    rep = prune(repo, parse_keep(keep), agents=_agent_ids(repo, agents), dry_run=dry_run)
    if as_json:
        emit_json(rep.to_json())
        return
    for lock in rep.cleared_locks:
        say(f"{'would clear' if dry_run else 'cleared'} {lock}: the backup that held it is gone")
    say(rep.describe())


def _agent_ids(repo: Any, given: tuple[str, ...]) -> set[str] | None:
    """The groups ``--agent`` names: the IDs of the snapshots of that name or ID."""
    if not given:
        return None
    out: set[str] = set()
    for s in repo.list_snapshots():
        if s.meta.get("agent") in given or s.meta.get("id") in given:
            out.add(group_of(s))
    if not out:
        raise NotFound(
            f"{repo.bucket.describe()} holds no snapshot of {', '.join(given)}",
            hint=f"lnk agent backup list --from {repo.bucket.describe()}",
        )
    return out
