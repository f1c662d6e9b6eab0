"""``lnk agent move`` and ``deliver``, and the hidden steps a move runs at each end."""

from __future__ import annotations

import click

from lnk.agents.layout import Machine
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import ask_secret, emit_json, say
from lnk.errors import UsageError


@agent.command()
@agent_option
@click.option("--from", "from_box", metavar="BOX", help="the box the agent is on now")
@click.option("--to", "to", metavar="BOX", help="the box to move the agent to")
@click.option("--here", is_flag=True, help="move the agent back to this computer")
@click.option("--no-start", is_flag=True, help="don't start it where it goes")
@click.option(
    "--key-from-env",
    "key_from_env",
    metavar="VAR",
    help="the model's key for where it goes, from this variable here",
)
@click.option("--offline-model", is_flag=True, help="think with the offline model where it goes")
@click.option("--model", "model_name", metavar="NAME", help="another model where it goes")
@click.option("--model-url", metavar="URL", help="with --model: its base URL")
@click.option("--key-env", metavar="VAR", help="with --model: its key's name")
@click.option(
    "--backup-schedule",
    is_flag=True,
    help="install its backup schedule where it goes (with its own key for the bucket)",
)
@json_option
def move(
    agent_name: str | None,
    from_box: str | None,
    to: str | None,
    here: bool,
    no_start: bool,
    key_from_env: str | None,
    offline_model: bool,
    model_name: str | None,
    model_url: str | None,
    key_env: str | None,
    backup_schedule: bool,
    as_json: bool,
) -> None:
    """Move the agent to a box (--to BOX) or here (--here), in two phases."""
    from lnk.agents.models import parse_model
    from lnk.move.move import HERE
    from lnk.move.move import move as do_move
    from lnk.move.ready import ModelChoice

    if bool(to) == here:
        raise UsageError("say where the agent goes", hint="--to BOX or --here")
    if offline_model and model_name:
        raise UsageError("--offline-model or --model, not both", hint="drop one of them")
    choice = ModelChoice(
        parse_model(model_name, model_url, key_env) if model_name else None,
        offline_model,
        key_from_env,
    )
    result = do_move(
        Machine.current(),
        agent_name,
        HERE if here else str(to),
        from_box=from_box,
        no_start=no_start,
        say=say,
        choice=choice,
        ask=ask_secret,
        backup_schedule=backup_schedule,
    )
    from lnk.agents.policy import kept_lines

    final = result.get("final") or {}
    for line in kept_lines(
        final.get("kept_here", []), final.get("dropped_grants", []), result["agent"]
    ):
        say(line)
    if as_json:
        emit_json(result)


@agent.command()
@agent_option
@json_option
def deliver(agent_name: str | None, as_json: bool) -> None:
    """Hand the agent the messages held for it while it moved."""
    from lnk.move.held import deliver as deliver_held

    results = deliver_held(Machine.current(), agent_name, say)
    if as_json:
        emit_json(results)


@agent.command(hidden=True)
@agent_option
@click.option("--move", "move_id", required=True)
def pause(agent_name: str | None, move_id: str) -> None:
    """(a move's step) Stop the agent here for the switch; its turn ends first."""
    from lnk.move.moved import pause as pause_agent

    pause_agent(Machine.current(), agent_name)


@agent.command(hidden=True)
@agent_option
def resume(agent_name: str | None) -> None:
    """(a move's step, kept for older movers) Nothing to undo: a pause only stops the agent."""


@agent.command("moved-in", hidden=True)
@agent_option
@click.option("--id", "agent_id", required=True)
def moved_in(agent_name: str | None, agent_id: str) -> None:
    """(a move's step) The copy where the agent was is gone: its connections here go on."""
    from lnk.move.moved import moved_in as settle

    if settle(Machine.current(), agent_name, agent_id):
        say("its connections and schedules go on here")


@agent.command("moved-away", hidden=True)
@agent_option
@click.option("--id", "agent_id", required=True)
@click.option("--to", "to", required=True)
@click.option("--final", "final", default=None, help="the move's final stream, as committed")
@json_option
def moved_away(
    agent_name: str | None, agent_id: str, to: str, final: str | None, as_json: bool
) -> None:
    """(a move's step) The agent answers elsewhere: remove what runs it here."""
    from lnk.move.moved import moved_away as leave

    left = leave(Machine.current(), agent_name, agent_id, to, final)
    if as_json:
        emit_json(left.to_json())
    elif left.kept:
        say(f"{agent_name or agent_id} left for {to}; its files are kept in {left.kept}")
