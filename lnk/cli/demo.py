"""``lnk demo``: create an agent, run it in its sandbox, chat, back it up, restore it, move it."""

from __future__ import annotations

from pathlib import Path

import click

from lnk.cli.output import out


@click.command()
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="where the demo's machines live (default: a new temporary folder)",
)
@click.option("--no-sandbox", is_flag=True, help="run the demo agent without bubblewrap")
def demo(folder: Path | None, no_sandbox: bool) -> None:
    """Run the whole product on embedded defaults, on this machine alone."""
    from lnk.demo import run_demo

    run_demo(folder, sandbox=not no_sandbox, say=out)
