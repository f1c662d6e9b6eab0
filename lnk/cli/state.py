"""``lnk agent state-send`` / ``state-receive``: the sealed stream, as moves and boxes run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from lnk.agents import policy, registry
from lnk.agents.layout import Machine
from lnk.agents.models import parse_model
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, out, progress_bar, say
from lnk.errors import InvalidInput, UsageError
from lnk.formats.keys import parse_public_key
from lnk.move.faults import armed, fault
from lnk.payload.prepare import prepare_here
from lnk.protocol import DIGEST_PREFIX, ProtocolError, StateDigests


class _DieMidStream:
    """Test fault point (``send:mid-PHASE`` / ``receive:mid-PHASE``): die after some bytes."""

    def __init__(self, f: Any, point: str) -> None:
        self.f, self.point, self.calls = f, point, 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls >= 2:
            fault(self.point)

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        self.f.flush()
        self._tick()
        return int(n or 0)

    def read(self, n: int = -1) -> bytes:
        self._tick()
        return bytes(self.f.read(n))

    def readinto(self, buf: Any) -> int:
        self._tick()
        return int(self.f.readinto(buf) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def _faulty(f: Any, point: str) -> Any:
    return _DieMidStream(f, point) if armed(point) else f


@agent.command("state-send")
@agent_option
@click.option(
    "--to",
    "to",
    required=True,
    metavar="PUBLIC_KEY",
    help="the receiver's public key (from state-receive --prepare)",
)
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="what the receiver holds already (from state-receive --inventory; - for stdin)",
)
@click.option(
    "--phase",
    type=click.Choice(["full", "bulk", "final"]),
    default="full",
    show_default=True,
    help="bulk while the agent runs, final once it is paused",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write what was sent as JSON to this file",
)
def state_send(
    agent_name: str | None, to: str, inventory: Path | None, phase: str, report: Path | None
) -> None:
    """Write the agent as a sealed stream on stdout."""
    from lnk.move.phases import send_phase
    from lnk.payload.inventory import Inventory

    if sys.stdout.isatty():
        raise UsageError(
            "the stream is binary; send it into a pipe or a file",
            hint="lnk agent state-send --to KEY > stream",
        )
    a = registry.find(Machine.current(), agent_name)
    recipient = parse_public_key(to)
    inv: Inventory | None = None
    if inventory is not None and str(inventory) == "-":
        inv = Inventory.from_bytes(sys.stdin.buffer.read())
    else:
        inv = Inventory.load(inventory) if inventory else None
    bar = progress_bar(None, desc=f"sending {a.name}")
    with bar:
        rep = send_phase(
            a, _faulty(sys.stdout.buffer, f"send:mid-{phase}"), recipient, phase, inv, bar.update
        )
    if report:
        report.write_text(json.dumps(rep.to_json(), indent=2))


MAX_DIGESTS = 512 << 20
"""The most ``--against`` reads: far above any agent's folders (about 100 bytes each)."""


@agent.command("state-digests")
@agent_option
@json_option
def state_digests(agent_name: str | None, as_json: bool) -> None:
    """Print the agent's folders' digests, for a receiver's inventory --against."""
    from lnk.payload.folders import clock, sending_digests

    a = registry.find(Machine.current(), agent_name)
    at = clock(a.folders.root)  # before the walk: a file changed since is not vouched for
    dirs = sending_digests(a.folders.root, a.runtime / "hashes.sqlite")
    dirs = {p: d[:DIGEST_PREFIX] for p, d in dirs.items()}  # a receiver picks by these
    if as_json:
        emit_json(StateDigests(agent=a.name, id=a.id, dirs=dirs, at=at).to_json())
    else:
        out(f"{a.name}: {len(dirs)} folders with a digest")


def _against(path: Path) -> StateDigests:
    """The sender's folder digests (``state-digests --json``), checked as they arrive."""
    if str(path) == "-":
        raw = sys.stdin.buffer.read(MAX_DIGESTS + 1)
    else:
        with path.open("rb") as f:
            raw = f.read(MAX_DIGESTS + 1)
    if len(raw) > MAX_DIGESTS:
        raise InvalidInput(
            f"the sender's folder digests are over {MAX_DIGESTS >> 20} MiB",
            hint="give what lnk agent state-digests --json printed at the sending end",
        )
    hint = "give what lnk agent state-digests --json printed at the sending end"
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise InvalidInput(f"the sender's folder digests are not JSON ({e})", hint=hint) from e
    try:
        return StateDigests.from_json(doc, "the sender's folder digests")
    except ProtocolError as e:
        raise InvalidInput(e.message, hint=hint) from e


@agent.command("state-receive")
@click.option("--prepare", is_flag=True, help="make a one-time receiver and print its key")
@click.option(
    "--agent-id",
    metavar="ID",
    help="with --prepare: the agent expected, so what this machine holds of it is never sent again",
)
@click.option(
    "--name",
    "agent_name",
    metavar="NAME",
    help="with --prepare: the agent's name, refused at once if another agent here has it",
)
@click.option(
    "--grants",
    "grants_file",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="with --prepare: the agent's grants as the computer running the move has them "
    "(- for stdin); applied as they are, since the agent leaves that computer",
)
@click.option(
    "--model",
    "model_name",
    metavar="NAME",
    help="with --prepare: the agent's model as the computer running the move knows it "
    "(offline, PROVIDER:MODEL, or a name with --model-url)",
)
@click.option("--model-url", "model_url", metavar="URL", help="with --model: its base URL")
@click.option(
    "--model-key-env", "model_key_env", metavar="VAR", help="with --model: its key's name"
)
@click.option("--receiver", metavar="RECEIVER", help="the receiver --prepare made")
@click.option(
    "--inventory",
    "inventory",
    is_flag=True,
    help="write what the receiver holds already (binary) on stdout",
)
@click.option(
    "--against",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="with --inventory: the sender's folder digests (state-digests --json; - for stdin); "
    "a folder held with the same digest is listed alone, not its contents",
)
@click.option("--abandon", is_flag=True, help="delete the receiver and all it staged")
@click.option(
    "--store",
    type=click.Choice(["files", "sqlite"]),
    default=None,
    help="keep the agent's collections with this driver here",
)
@json_option
def state_receive(
    prepare: bool,
    agent_id: str | None,
    agent_name: str | None,
    grants_file: Path | None,
    model_name: str | None,
    model_url: str | None,
    model_key_env: str | None,
    receiver: str | None,
    inventory: bool,
    against: Path | None,
    abandon: bool,
    store: str | None,
    as_json: bool,
) -> None:
    """Prepare a receiver, or read a sealed stream on stdin and apply it."""
    from lnk.payload import receivers
    from lnk.payload.receive import receive

    m = Machine.current()
    if prepare:
        mover_grants = None
        if grants_file is not None:
            if str(grants_file) == "-":
                mover_grants = policy.mover_grants(sys.stdin.buffer)
            else:
                with grants_file.open("rb") as f:
                    mover_grants = policy.mover_grants(f)
        word = None
        if model_name is not None:
            word = parse_model(model_name, model_url, model_key_env)
        info = prepare_here(m, agent_id, agent_name, mover_grants, word)
        if as_json:
            emit_json(info.to_json())
        else:
            out(f"receiver: {info.receiver}")
            out(f"public_key: {info.public_key}")
        return
    if not receiver:
        raise UsageError("say which receiver", hint="--receiver RECEIVER (from --prepare)")
    r = receivers.open_receiver(m, receiver)  # refused (and its key deleted) after 24 hours
    receivers.purge_expired(m)
    if abandon:
        r.abandon()
        say(f"abandoned {receiver}")
        return
    if against is not None and not inventory:
        raise UsageError("--against goes with --inventory", hint="add --inventory")
    if inventory:
        if against is None:
            sys.stdout.buffer.write(r.inventory().to_bytes())
        else:
            theirs = _against(against)
            sys.stdout.buffer.write(r.inventory(theirs.dirs, at=theirs.at).to_bytes())
        return
    if sys.stdin.isatty():
        raise UsageError(
            "the stream comes on stdin", hint="lnk agent state-receive --receiver R < stream"
        )
    bar = progress_bar(None, desc="receiving")
    with bar:
        phase = "final" if r.bulk.is_dir() else "bulk"
        rep = receive(
            m,
            r,
            _faulty(sys.stdin.buffer, f"receive:mid-{phase}"),
            store=store,
            progress=bar.update,
        )
    if as_json:
        emit_json(rep.to_json())
    else:
        verb = "received" if rep.committed else "staged (bulk phase)"
        say(
            f"{verb} {rep.agent} ({rep.id}): {rep.files} files, {rep.data_bytes} bytes carried, "
            f"{rep.collections} collections"
        )
    for line in policy.kept_lines(rep.kept_here, rep.dropped_grants, rep.agent):
        say(line)
