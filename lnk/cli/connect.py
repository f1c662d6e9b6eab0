"""``lnk agent connect telegram`` and ``lnk agent disconnect telegram``."""

from __future__ import annotations

import os
import sys

import click

from lnk.agents.layout import Machine
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, out, say
from lnk.errors import UsageError

CONNECTIONS = click.Choice(["telegram"])


def _token(from_env: str | None) -> str:
    if from_env:
        value = os.environ.get(from_env)
        if not value:
            raise UsageError(
                f"the variable {from_env} is empty or not set",
                hint=f"export {from_env}=<the token from @BotFather>, then run this again",
            )
        return value
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass("lnk: the bot's token (from @BotFather): ", stream=sys.stderr)
    return sys.stdin.read(4096)


@agent.command()
@agent_option
@click.argument("connection", type=CONNECTIONS)
@click.option(
    "--token-from-env",
    metavar="VAR",
    help="read the bot's token from this variable (otherwise from stdin, or asked)",
)
@click.option("--api", metavar="URL", help="the Bot API's base URL (default api.telegram.org)")
@json_option
def connect(
    agent_name: str | None,
    connection: str,
    token_from_env: str | None,
    api: str | None,
    as_json: bool,
) -> None:
    """Connect the agent to CONNECTION: its owner pairs by sending a one-time code."""
    from lnk.connections.connect import connect_telegram

    def show(code: str, username: str) -> None:
        say(f"send this code to @{username} on Telegram, in a private chat, within 10 minutes:")
        out(code)

    paired = connect_telegram(Machine.current(), agent_name, _token(token_from_env), api, show, say)
    if as_json:
        emit_json({"agent": paired.agent, "bot": paired.bot, "owner": paired.owner})
        return
    say(
        f"{paired.agent} answers {paired.owner_name} ({paired.owner}) as its owner on "
        f"Telegram, as @{paired.bot}"
    )


@agent.command()
@agent_option
@click.argument("connection", type=CONNECTIONS)
def disconnect(agent_name: str | None, connection: str) -> None:
    """Remove the agent's CONNECTION: its settings, its token and its state."""
    from lnk.connections.connect import disconnect_telegram

    disconnect_telegram(Machine.current(), agent_name)
    say(f"the agent is no longer connected to {connection}")
