"""``lnk agent move`` and ``deliver``, and the hidden steps a move runs at each end."""

from __future__ import annotations

import json

import click

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, say
from lnk.errors import NotFound, UsageError
from lnk.runtime import service


@agent.command()
@agent_option
@click.option("--to", "to", metavar="BOX", help="the box to move the agent to")
@click.option("--here", is_flag=True, help="move the agent back to this computer")
@click.option("--no-start", is_flag=True, help="don't start it where it goes")
@json_option
def move(agent_name: str | None, to: str | None, here: bool, no_start: bool, as_json: bool) -> None:
    """Move the agent to a box (--to BOX) or back here (--here), in two phases."""
    from lnk.move.move import HERE
    from lnk.move.move import move as do_move

    if bool(to) == here:
        raise UsageError("say where the agent goes", hint="--to BOX or --here")
    from lnk.payload.receivers import purge_expired

    purge_expired(Machine.current())  # nothing secret lingers: old receivers, kept folders
    result = do_move(
        Machine.current(), agent_name, HERE if here else str(to), no_start=no_start, say=say
    )
    from lnk.agents.policy import kept_lines
    from lnk.move.held import deliver_all

    final = result.get("final") or {}
    for line in kept_lines(
        final.get("kept_here", []), final.get("dropped_grants", []), result["agent"]
    ):
        say(line)
    deliver_all(Machine.current(), result["id"], say)
    if as_json:
        emit_json(result)


@agent.command()
@agent_option
@json_option
def deliver(agent_name: str | None, as_json: bool) -> None:
    """Hand the agent the messages held for it while it moved."""
    from lnk.move.held import deliver_all
    from lnk.move.move import where_is

    m = Machine.current()
    _, agent_id, _ = where_is(m, agent_name)
    results = deliver_all(m, agent_id, say)
    if as_json:
        emit_json(results)


@agent.command(hidden=True)
@agent_option
@click.option("--move", "move_id", required=True)
def pause(agent_name: str | None, move_id: str) -> None:
    """(a move's step) Stop the agent here for the switch; its turn ends first."""
    a = registry.find(Machine.current(), agent_name)
    service.stop(a)
    a.runtime.mkdir(parents=True, exist_ok=True)
    (a.runtime / "paused.json").write_text(json.dumps({"move": move_id}))


@agent.command(hidden=True)
@agent_option
def resume(agent_name: str | None) -> None:
    """(a move's step) The move failed: the agent is no longer paused here."""
    a = registry.find(Machine.current(), agent_name)
    (a.runtime / "paused.json").unlink(missing_ok=True)


@agent.command("moved-away", hidden=True)
@agent_option
@click.option("--id", "agent_id", required=True)
@click.option("--to", "to", required=True)
def moved_away(agent_name: str | None, agent_id: str, to: str) -> None:
    """(a move's step) The agent answers elsewhere: remove what runs it here."""
    from lnk.agents.moved import purge_expired
    from lnk.move.moved import leave

    m = Machine.current()
    try:
        a = registry.find(m, agent_name)
    except NotFound:
        return  # already done (a journal finishing a move runs this again)
    if a.id != agent_id:
        raise UsageError(f"{a.name} here is {a.id}, not {agent_id}", hint="nothing was removed")
    note = leave(m, a, to)
    purge_expired(m)
    say(f"{a.name} left for {to}; its files are kept in {note['kept']}")
