"""``lnk box ...`` (and the hidden ``lnk version --json``): parse, call boxes.py, print."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import lnk
from lnk.cli.output import emit_json, out, say, table
from lnk.errors import UsageError
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.places import boxes
from lnk.protocol import Version


@click.group()
def box() -> None:
    """Places an agent can move to: SSH destinations or other HOMEs here."""


@box.command("add")
@click.argument("name")
@click.argument("destination", required=False)
@click.option(
    "--local",
    "local_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="a box that is another HOME on this machine",
)
@click.option(
    "--no-install", is_flag=True, help="fail instead of installing or upgrading lnk on the box"
)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def add(
    name: str, destination: str | None, local_dir: Path | None, no_install: bool, as_json: bool
) -> None:
    """Add box NAME: DESTINATION for ssh ([user@]host or an ~/.ssh/config alias), or --local DIR.

    Checks that the box answers, and installs or upgrades lnk there when it is
    missing, older than this one, or speaks another stream format.
    """
    if (destination is None) == (local_dir is None):
        raise UsageError(
            "give either DESTINATION or --local DIR",
            hint="lnk box add NAME user@host, or lnk box add NAME --local DIR",
        )
    report = boxes.add(name, destination=destination, local_dir=local_dir, install=not no_install)
    if as_json:
        emit_json(
            report.box.as_dict()
            | {
                "action": report.action,
                "before": report.before.to_json() if report.before else None,
                "after": report.after.to_json(),
            }
        )
    else:
        say(report.describe())


@box.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def list_(as_json: bool) -> None:
    """List the boxes."""
    found = boxes.list_boxes()
    if as_json:
        emit_json([b.as_dict() for b in found])
        return
    if not found:
        say("no boxes yet: add one with lnk box add NAME DEST")
        return
    table(
        [[b.name, "local" if b.local else "ssh", b.where] for b in found], ["NAME", "KIND", "WHERE"]
    )


@box.command(
    "run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(name: str, command: tuple[str, ...]) -> None:
    """Run an lnk command on box NAME: lnk box run NAME -- agent list.

    Its stdout, stderr and exit code pass through.
    """
    args = list(command)
    if args and args[0] == "--":
        args = args[1:]
    if args and args[0] == "lnk":
        args = args[1:]
    if not args:
        raise UsageError("no command to run", hint="lnk box run NAME -- agent list")
    leg = boxes.get(name).leg()
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer
    result = leg.run(args, stdin=stdin, capture=False, check=False)
    if result.returncode == 255:
        leg.check(255, "")
    sys.stdout.flush()
    sys.exit(result.returncode)


@box.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """Forget box NAME (nothing on the box is touched)."""
    b = boxes.remove(name)
    say(f"removed box {b.name} ({b.where})")


@click.command("version", hidden=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def version(as_json: bool) -> None:
    """This lnk's version and stream format (what a box is checked against)."""
    if as_json:
        emit_json(Version(lnk.__version__, STREAM_FORMAT).to_json())
    else:
        out(f"lnk {lnk.__version__} (stream format {STREAM_FORMAT})")
