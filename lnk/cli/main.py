"""The one exit point: errors and signals become ``lnk: error: ...`` and an exit code."""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

import click

from lnk import __version__
from lnk.errors import Interrupted, LnkError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lnk")
def cli() -> None:
    """lnk: carry AI agents' state between machines and into and out of buckets."""


def _register() -> None:
    # Imported here, not at the top, so `lnk --version` and the exit point load little.
    from lnk.cli import agent, backup, box, demo, move, permissions, state  # noqa: F401 - move, permissions and state add to agent

    cli.add_command(agent.agent)
    cli.add_command(backup.bucket)
    cli.add_command(backup.backup_top)
    cli.add_command(box.box)
    cli.add_command(box.version)
    cli.add_command(demo.demo)


def _on_signal(signum: int, _frame: object) -> NoReturn:
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}", signum=signum)


def fail(err: LnkError) -> NoReturn:
    sys.stderr.write(f"lnk: error: {err.message}\n")
    if err.hint:
        sys.stderr.write(f"lnk: hint: {err.hint}\n")
    sys.exit(err.exit_code)


def main(argv: list[str] | None = None) -> NoReturn:
    _register()
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        cli.main(args=argv, prog_name="lnk", standalone_mode=False)
    except LnkError as e:
        fail(e)
    except KeyboardInterrupt:
        fail(Interrupted("interrupted", signum=signal.SIGINT))
    except click.exceptions.Abort:
        fail(Interrupted("interrupted", signum=signal.SIGINT))
    except click.ClickException as e:
        sys.stderr.write(f"lnk: error: {e.format_message()}\n")
        sys.stderr.write("lnk: hint: see lnk --help, or add --help after the command\n")
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
