"""The one exit point: errors and signals become ``lnk: error: ...`` and an exit code."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import NoReturn

import click

from lnk import __version__
from lnk.errors import Interrupted, LnkError, UsageError

_ERRORS = {"mode": "text"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lnk")
@click.option(
    "--errors",
    type=click.Choice(["text", "json"]),
    default="text",
    help="how a failure is told on stderr: words, or one JSON line for a program (a mover)",
)
def cli(errors: str) -> None:
    """lnk: carry AI agents' state between machines and into and out of buckets."""
    _ERRORS["mode"] = errors


def _register() -> None:
    # Imported here, not at the top, so `lnk --version` and the exit point load little.
    from lnk.cli import (  # noqa: F401 - backup_repo adds to backup; connect, move, permissions, state to agent
        agent,
        backup,
        backup_repo,
        box,
        connect,
        demo,
        move,
        permissions,
        state,
    )

    cli.add_command(agent.agent)
    cli.add_command(backup.bucket)
    cli.add_command(backup.backup_top)
    cli.add_command(box.box)
    box.box.add_command(serve)
    cli.add_command(box.version)
    cli.add_command(demo.demo)


@click.command("serve", hidden=True)
@click.option("--stop", is_flag=True, help="stop the server this step runs in")
@click.option("--idle", type=float, default=None, help="end after this many seconds idle")
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def serve(stop: bool, idle: float | None, as_json: bool) -> None:
    """Start this machine's lnk server for a move's steps (docs/boxes.md): here, as the
    exit point, since each step it forks runs :func:`main`."""
    import lnk
    from lnk.cli.output import emit_json, out
    from lnk.formats import FORMAT as STREAM_FORMAT
    from lnk.protocol import ServerReady
    from lnk.transport import served, server

    if stop:
        pid = server.server_pid()
        if pid is None:
            raise UsageError(
                "lnk box serve --stop stops the server it runs through; this is no "
                "server's step (a server with no step ends by itself)"
            )
        os.kill(pid, signal.SIGTERM)
        return
    path, pid = server.start(_run_step, server.IDLE_S if idle is None else idle)
    ready = ServerReady(path, pid, lnk.__version__, STREAM_FORMAT, served.caller())
    if as_json:
        emit_json(ready.to_json())
    else:
        out(f"lnk server {pid} at {path}")


def _run_step(argv: list[str]) -> None:
    main(argv)


def _on_signal(signum: int, _frame: object) -> NoReturn:
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}", signum=signum)


def fail(err: LnkError) -> NoReturn:
    if _ERRORS["mode"] == "json":  # json.dumps escapes every control character
        sys.stderr.write(json.dumps({"error": error_json(err)}) + "\n")
    else:
        # an error may name what a stream or a bucket holds: never raw to the terminal
        from lnk.cli.output import safe

        sys.stderr.write(f"lnk: error: {safe(err.message)}\n")
        if err.hint:
            sys.stderr.write(f"lnk: hint: {safe(err.hint)}\n")
    sys.exit(err.exit_code)


def error_json(err: LnkError) -> dict[str, object]:
    """The error as the box protocol carries it (docs/boxes.md)."""
    return {
        "exit": err.exit_code,
        "class": type(err).__name__,
        "message": err.message,
        "hint": err.hint,
    }


def _errors_mode(argv: list[str]) -> str:
    """``--errors`` read before click parses, so a usage error is told the same way."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a.startswith("--errors="):
            return a.split("=", 1)[1]
        if a == "--errors" and i + 1 < len(argv):
            return argv[i + 1]
    return "text"


def main(argv: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--served-by"] and len(argv) >= 2:
        # a step of a move, run by this machine's `lnk box serve` when it answers
        # (lnk.transport.served): this process then only waits, and imported little
        from lnk.transport import served

        served.call(argv[1], argv[2:])
        argv = argv[2:]  # no server answered: run the step here
    _register()
    _ERRORS["mode"] = _errors_mode(argv)
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
        fail(UsageError(e.format_message(), hint="see lnk --help, or add --help after the command"))
    except BrokenPipeError:
        sys.exit(1)
    except OSError as e:
        # a system call failed where no step said why: still one line, never a traceback
        # (fail() escapes the file's name)
        where = f": {e.filename}" if e.filename else ""
        fail(LnkError(f"{e.strerror or e}{where}"))
    sys.exit(0)


if __name__ == "__main__":
    main()
