"""``lnk agent ...``: thin commands that parse, call the library and print."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.models import default_model, key_place, parse_model
from lnk.agents.models import describe as describe_model
from lnk.cli.output import emit_json, out, say, table
from lnk.errors import UsageError
from lnk.logs import tail_lines
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
@click.option(
    "--model",
    "model_name",
    metavar="NAME",
    help="offline, PROVIDER:MODEL (openai, gemini, openrouter) or, with --model-url, any "
    "OpenAI-compatible model (default: the cheap hosted one a key is here for, else offline)",
)
@click.option("--model-url", metavar="URL", help="with --model: its base URL")
@click.option("--key-env", metavar="VAR", help="with --model: the name of its key")
@click.option(
    "--harness",
    default="builtin",
    metavar="NAME",
    help="the harness that runs it: builtin (Link's own) or an adapter's, lnk-NAME on PATH "
    "(hermes)",
)
@json_option
def create(
    name: str,
    store: str,
    model_name: str | None,
    model_url: str | None,
    key_env: str | None,
    harness: str,
    as_json: bool,
) -> None:
    """Create an agent NAME and print its ID."""
    if harness != "builtin":
        from lnk.harnesses.adapter import Adapter

        d = Adapter.find(harness).describe()  # refused here, not at its first start
        say(f"{name} runs {d.name} {d.harness} (adapter lnk-{d.name} {d.adapter})")
    if model_name is not None:
        model, why = parse_model(model_name, model_url, key_env), ""
    elif model_url or key_env:
        raise UsageError("--model-url and --key-env go with --model", hint="add --model NAME")
    else:
        model, why = default_model()
    a = registry.create(_machine(), name, store=store, model=model, harness=harness)
    say(f"{a.name}: {why}" if why else f"{a.name} thinks with {describe_model(model)}")
    if as_json:
        emit_json(
            {"name": a.name, "id": a.id, "owner": a.settings.owner, "folder": str(a.folders.root)}
        )
    else:
        out(a.id)


@agent.command("model")
@agent_option
@click.argument("model_name", metavar="NAME", required=False)
@click.option("--model-url", metavar="URL", help="with NAME: its base URL")
@click.option("--key-env", metavar="VAR", help="with NAME: the name of its key")
def model_(
    agent_name: str | None, model_name: str | None, model_url: str | None, key_env: str | None
) -> None:
    """Show the agent's model here, or set it to NAME (at its next start)."""
    a = registry.find(_machine(), agent_name)
    if model_name is not None:
        a.settings.model = parse_model(model_name, model_url, key_env)
        a.save()
    m = a.settings.model
    out(describe_model(m, key_place(a.machine, a.id, m)))


@agent.command("list")
@click.option("--here", "here_only", is_flag=True, help="only this machine's agents: ask no box")
@json_option
def list_(here_only: bool, as_json: bool) -> None:
    """List the agents here and on every box (naming the boxes that did not answer)."""
    from lnk.places.where import list_everywhere

    found = list_everywhere(_machine(), ask_boxes=not here_only)
    if as_json:
        emit_json(found.to_json())
        return
    for b in found.unanswered:
        say(f"box {b.box} did not answer: {b.error}")
    if not found.agents:
        say("no agents here yet: lnk agent create NAME")
        return
    table(
        [
            [
                r.name,
                r.id,
                r.place,
                r.state,
                "-" if r.sandboxed is None else ("yes" if r.sandboxed else "no"),
                "-" if r.port is None else str(r.port),
            ]
            for r in found.agents
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
    """Start the agent's harness in the background (finishing a move it is in first)."""
    from lnk.move.start import start_agent

    st = start_agent(_machine(), agent_name, sandbox, say)
    if as_json:
        emit_json(st.to_json())
    else:
        say(f"{st.name} is running at {st.endpoint}{'' if st.sandboxed else ' (no sandbox)'}")


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
    from lnk.places.where import status_anywhere

    st = status_anywhere(_machine(), agent_name)
    if as_json:
        emit_json(st.to_json())
        return
    out(f"name: {st.name}")
    out(f"id: {st.id}")
    out(f"owner: {st.owner}")
    out(f"state: {st.state}" + ("" if st.place == "here" else f" (on box {st.place})"))
    out(f"where: {'this computer' if st.place == 'here' else 'box ' + st.place}")
    out(f"endpoint: {st.endpoint}")
    out(f"sandboxed: {st.sandboxed}")
    out(f"store: {st.store}")
    out(f"harness: {st.harness}")
    if st.model:
        out(f"model: {st.model}")
    if st.exit:
        out(
            f"exit: code {st.exit.get('code')} at {st.exit.get('at')} ({st.exit.get('reason', '')})"
        )
    if st.problem:
        out(f"problem: {st.problem}")
    if st.warning:
        out(f"warning: {st.warning}")
    for name, part in (st.connections or {}).items():  # the bridge's word: foreign, escaped
        if isinstance(part, dict):
            note = f" ({part['note']})" if part.get("note") else ""
            out(f"{name}: {part.get('state', '?')}{note}")
        else:
            out(f"connections: held {part}")
    if st.refused:  # the agent's proxy's last refusal
        r = st.refused
        out(f"refused: {r.get('host')}:{r.get('port')} at {r.get('at')} ({r.get('why')})")


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
    for line in tail_lines(path, lines):
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

    full = thread if thread.startswith("link:") else f"link:{thread}"
    r = chat_send(_machine(), agent_name, full, text, message_id, say)
    if as_json:
        emit_json(r.to_json())
        return
    for e in r.earlier:  # answers to messages sent while it moved, which nobody waited for
        say(f"the answer to your earlier message {e.message_id} ({e.text[:60]!r}) came:")
        out(e.answer, lines=True)
    if r.answer is not None:
        if r.earlier:
            say("and the answer to this one:")
        out(r.answer, lines=True)
