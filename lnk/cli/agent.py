"""``lnk agent ...``: thin commands that parse, call the library and print."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.cli.output import emit_json, out, say, table
from lnk.errors import LnkError, UsageError
from lnk.runtime import service

F = TypeVar("F", bound=Callable[..., Any])


def agent_option(f: F) -> F:
    return click.option(
        "--agent",
        "agent_name",
        metavar="NAME",
        default=None,
        help="the agent (may be left out when there is only one)",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")(f)


def _machine() -> Machine:
    return Machine.current()


@click.group()
def agent() -> None:
    """Create, run, talk to, move and back up agents."""


@agent.command()
@click.argument("name")
@click.option(
    "--store",
    type=click.Choice(["files", "sqlite"]),
    default="files",
    help="how the agent's collections are kept",
)
@json_option
def create(name: str, store: str, as_json: bool) -> None:
    """Create an agent NAME and print its ID."""
    a = registry.create(_machine(), name, store=store)
    if as_json:
        emit_json(
            {"name": a.name, "id": a.id, "owner": a.settings.owner, "folder": str(a.folders.root)}
        )
    else:
        out(a.id)


@agent.command("list")
@json_option
def list_(as_json: bool) -> None:
    """List the agents on this machine."""
    from lnk.move.journal import locations

    m = _machine()
    rows = [
        service.status(a, ask=False) | {"folder": str(a.folders.root), "place": "here"}
        for a in registry.list_agents(m)
    ]
    rows += [
        {"name": name, "id": loc["id"], "place": loc["place"], "state": f"on box {loc['place']}"}
        for name, loc in sorted(locations(m).items())
    ]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        say("no agents here yet: lnk agent create NAME")
        return
    table(
        [
            [
                r["name"],
                r["id"],
                r["place"],
                r["state"],
                "-" if "sandboxed" not in r else ("yes" if r["sandboxed"] else "no"),
                str(r["ports"][0]) if "ports" in r else "-",
            ]
            for r in rows
        ],
        ["NAME", "ID", "WHERE", "STATE", "SANDBOXED", "PORT"],
    )


@agent.command()
@agent_option
@click.option(
    "--no-sandbox",
    "sandbox",
    flag_value=False,
    default=None,
    help="run without a sandbox from now on (kept in the agent's settings)",
)
@click.option(
    "--sandbox", "sandbox", flag_value=True, help="run in its sandbox again (the default)"
)
@json_option
def start(agent_name: str | None, sandbox: bool | None, as_json: bool) -> None:
    """Start the agent's harness in the background."""
    m = _machine()
    _finish_moves(m, agent_name)
    a = registry.find(m, agent_name)
    (a.runtime / "paused.json").unlink(missing_ok=True)
    for note in service.prepare_start(a, sandbox):
        say(note)
    st = service.start(a)
    if as_json:
        emit_json(st)
    else:
        say(f"{a.name} is running at {st['endpoint']}{'' if st['sandboxed'] else ' (no sandbox)'}")


def _finish_moves(m: Machine, name: str | None) -> None:
    """A start finishes the agent's unfinished moves first, and refuses one that moved away."""
    from lnk.agents.moved import refuse_if_moved
    from lnk.move import journal
    from lnk.move.move import finish_all, where_is

    if not journal.entries(m) and name is not None and not m.settings_file(name).exists():
        refuse_if_moved(m, name)
        return
    try:
        _, agent_id, _ = where_is(m, name)
    except LnkError:
        if name is not None:
            refuse_if_moved(m, name)
        raise
    finish_all(m, say, agent_id)
    if name is not None and not m.settings_file(name).exists():
        refuse_if_moved(m, name)
        _, _, place = where_is(m, name)
        raise UsageError(
            f"{name} is on the box {place}, not here",
            hint=f"lnk box run {place} -- lnk agent start --agent {name}",
        )


@agent.command()
@agent_option
def stop(agent_name: str | None) -> None:
    """Stop the agent's harness."""
    a = registry.find(_machine(), agent_name)
    if service.stop(a):
        say(f"{a.name} stopped")
    else:
        say(f"{a.name} was not running")


@agent.command()
@agent_option
@json_option
def status(agent_name: str | None, as_json: bool) -> None:
    """Whether the agent runs, its ID, owner, endpoint and sandbox."""
    m = _machine()
    st = _status_anywhere(m, agent_name)
    if as_json:
        emit_json(st)
        return
    for key in ("name", "id", "owner", "state", "endpoint", "sandboxed", "store"):
        out(f"{key}: {st[key]}")
    if st.get("exit"):
        out(
            f"exit: code {st['exit'].get('code')} at {st['exit'].get('at')} "
            f"({st['exit'].get('reason', '')})"
        )
    if st.get("problem"):
        out(f"problem: {st['problem']}")
    if st.get("refused"):  # the agent's proxy's last refusal
        r = st["refused"]
        out(f"refused: {r.get('host')}:{r.get('port')} at {r.get('at')} ({r.get('why')})")


def _status_anywhere(m: Machine, name: str | None) -> dict[str, Any]:
    """Status here, or through the box the agent moved to (its own lnk answers)."""
    import json as _json

    from lnk.move.journal import locations

    locs = locations(m)
    if name is not None and name in locs and not m.settings_file(name).exists():
        from lnk.move.move import place_leg

        leg = place_leg(m, locs[name]["place"])
        st = _json.loads(leg.run(["agent", "status", "--agent", name, "--json"]).stdout)
        return dict(st) | {"place": locs[name]["place"]}
    return service.status(registry.find(m, name)) | {"place": "here"}


@agent.command()
@agent_option
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
def logs(agent_name: str | None, lines: int) -> None:
    """Print the end of the agent's log."""
    a = registry.find(_machine(), agent_name)
    path = a.runtime / "harness.log"
    if not path.exists():
        say(f"{a.name} has no log yet (it has not been started here)")
        return
    text = path.read_text(errors="replace").splitlines()
    for line in text[-lines:]:
        out(line)


@agent.command()
@click.argument("name")
@click.option(
    "--files",
    type=click.Choice(["keep", "delete"]),
    default=None,
    help="keep the agent's folders aside (default) or delete them",
)
@click.option("--yes", is_flag=True, help="don't ask")
def remove(name: str, files: str | None, yes: bool) -> None:
    """Remove the agent NAME: its settings, state and keys."""
    m = _machine()
    a = registry.find(m, name)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"removing {name} needs a yes", hint="add --yes in a script")
        if not click.confirm(f"remove agent {name} ({a.id})?", default=False, err=True):
            raise UsageError("nothing removed")
        if files is None:
            files = (
                "delete"
                if click.confirm("delete its files too?", default=False, err=True)
                else "keep"
            )
    service.stop(a)
    kept = registry.remove(m, a, keep_files=(files or "keep") == "keep")
    say(f"removed {name}" + (f"; its files are kept in {kept}" if kept else ""))


@agent.group()
def chat() -> None:
    """Talk to the agent over Link's own connection."""


@chat.command()
@agent_option
@click.option("--thread", default="main", show_default=True, help="the conversation (link:NAME)")
@click.option(
    "--message-id",
    metavar="ID",
    default=None,
    hidden=True,
    help="the message's ID: sending it again gets the same answer",
)
@click.argument("text")
@json_option
def send(
    agent_name: str | None, thread: str, message_id: str | None, text: str, as_json: bool
) -> None:
    """Send TEXT to the agent and print its answer (held while the agent moves)."""
    from lnk.move.held import chat as chat_send

    m = _machine()
    full = thread if thread.startswith("link:") else f"link:{thread}"
    answer = chat_send(m, agent_name, full, text, message_id, say)
    if as_json:
        emit_json({"agent": agent_name, "thread": full, "answer": answer})
    else:
        out(answer)
