"""Before the bulk: what the agent needs where it goes, settled or refused.

The destination's prepare said what it will give the agent (``Prepared``);
here the mover settles the rest while nothing has been sent yet, so a move
that can't leave the agent whole is refused before its bulk, never found out
after its pause:

* the grants: every section the agent's grants name must be one the
  destination's sandbox enforces, else the move is refused with the
  ``lnk agent deny`` line that runs where the agent lives;
* the harness: the destination must have an adapter for it (``lnk-<harness>``);
* the model: one that doesn't answer there needs ``--offline-model`` (or a
  hosted ``--model``), said before anything moves;
* the secrets: every key of the agent goes to the destination over the legs
  (piped, never in the stream), and is deleted where it was once it answers
  there (``moved-away``);
* the model's key: when the destination still has none, ``--key-from-env
  VAR``, the mover's own variable (when the agent leaves this computer), or a
  question on the terminal gives it; without any, the move is refused, naming
  the flags.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from lnk.agents import grants, policy, registry
from lnk.agents.layout import Machine
from lnk.agents.models import OFFLINE
from lnk.agents.settings import ModelSettings
from lnk.errors import Refused
from lnk.move.journal import Entry
from lnk.move.steps import Ends
from lnk.places.where import Whereabouts
from lnk.protocol import BackupSchedule, Prepared, ScheduleAnswer, SecretNames
from lnk.transport.pipes import pipe

Ask = Callable[[str], str | None]  # a question on the terminal; None: there is none


@dataclass(frozen=True)
class ModelChoice:
    """What the person said of the model with the move's flags."""

    model: ModelSettings | None = None  # --model (+ --model-url, --key-env)
    offline: bool = False  # --offline-model
    key_from_env: str | None = None  # --key-from-env VAR


def mover_model(machine: Machine, where: Whereabouts, choice: ModelChoice) -> ModelSettings | None:
    """The mover's word for the model: the flags, else the agent's model here, else the one
    it ran with when it left here (None: a box-born agent the mover never held)."""
    if choice.offline:
        return OFFLINE
    if choice.model is not None:
        return choice.model
    if where.here:
        return registry.find(machine, where.name).settings.model
    return policy.remembered_model(machine, where.id)


def model_args(m: ModelSettings | None) -> list[str]:
    """The prepare's arguments that carry the mover's word for the model."""
    if m is None:
        return []
    if m.provider != "openai":
        return ["--model", "offline"]
    return ["--model", m.name, "--model-url", m.base_url, "--model-key-env", m.key_env]


def _deny_hint(where: Whereabouts, flags: list[str]) -> str:
    line = f"agent deny --agent {where.name} {' '.join(flags)}"
    return f"lnk {line}" if where.here else f"lnk box run {where.place} -- {line}"


@dataclass
class Asked:
    """What the checks before the bulk ask where the agent is (its grants, unless it is
    here; its keys' names; its backup schedule): asked at once, beside the destination's
    prepare, so no small step waits for another.  Each answer, or its error, is taken
    where it is needed, in the order the checks always ran."""

    grants: Future[bytes] | None
    secrets: Future[SecretNames]
    schedule: Future[ScheduleAnswer]


def ask_source(pool: Executor, ends: Ends, where: Whereabouts) -> Asked:
    """Start the three questions (``pool`` has a thread for each)."""
    name = where.name
    shown = ["agent", "show", "--agent", name, "--grants"]
    return Asked(
        None if where.here else pool.submit(lambda: ends.src.run(shown).stdout),
        pool.submit(
            ends.src.ask, ["agent", "secret", "list", "--agent", name, "--json"], SecretNames
        ),
        pool.submit(
            ends.src.ask,
            ["agent", "backup", "schedule", "--agent", name, "--show", "--json"],
            ScheduleAnswer,
        ),
    )


def check_grants(
    machine: Machine,
    ends: Ends,
    where: Whereabouts,
    prep: Prepared,
    say: Callable[[str], None],
    asked: Asked,
) -> None:
    """Refuse a move whose grants the destination's sandbox can't hold."""
    if prep.enforces is None:
        return  # an lnk that doesn't say: its start refuses what it can't hold, as before
    if asked.grants is None:
        spec = grants.read_spec(machine.folders(where.name).sandbox_toml)
    else:
        text = asked.grants.result()
        spec = grants.spec_from_data(
            policy.filter_from_stream(text.decode("utf-8", "replace")).grants, "the grants"
        )
    held = set(prep.enforces)
    bad = [
        f
        for f in grants.TABLE
        if f.section not in held and getattr(spec, f.attr) not in ("", [], 0)
    ]
    if not bad:
        return
    flags = [
        flag for flag in grants.as_flags(spec) if any(flag.startswith(f"--{f.flag} ") for f in bad)
    ]
    raise Refused(
        f"{where.name}'s grants name {', '.join(sorted({f'[{f.section}]' for f in bad}))}, which "
        f"{ends.dst.name}'s sandbox can't hold; nothing was sent",
        hint=_deny_hint(where, flags or [f"--{bad[0].flag} ..."]),
    )


def check_harness(where: Whereabouts, ends: Ends, prep: Prepared, harness: str, to: str) -> None:
    """Refuse a move to a machine with no adapter for the agent's harness: after the
    commit nothing could start it there, and it would answer nowhere."""
    if prep.harnesses is None or harness in prep.harnesses:
        return
    raise Refused(
        f"{where.name} runs the harness {harness}, and {ends.dst.name} has no adapter for it "
        f"(lnk-{harness} is not on its PATH); nothing was sent",
        hint=f"install lnk-{harness} on {ends.dst.name} (docs/adapters.md), then "
        f"lnk agent move --agent {where.name} --to {to}",
    )


def check_model(where: Whereabouts, ends: Ends, prep: Prepared, choice: ModelChoice) -> None:
    if prep.model_answers or choice.offline:
        return
    raise Refused(
        f"{where.name}'s model ({prep.model}) does not answer on {ends.dst.name}; nothing was sent",
        hint=f"lnk agent move --agent {where.name} --to {ends.dst.name} --offline-model "
        "(or --model PROVIDER:MODEL --key-from-env VAR for a hosted one)",
    )


def carry_secrets(ends: Ends, where: Whereabouts, asked: Asked) -> list[str]:
    """Every key of the agent, piped from where it is to where it goes (fd to fd)."""
    held = asked.secrets.result()
    if held.secrets:
        pipe(
            ends.src,
            ["agent", "secret", "export", "--agent-id", where.id],
            ends.dst,
            ["agent", "secret", "import", "--agent-id", where.id],
        )
    return list(held.secrets)


def settle_key(
    e: Entry,
    ends: Ends,
    where: Whereabouts,
    prep: Prepared,
    choice: ModelChoice,
    carried: list[str],
    ask: Ask,
) -> str | None:
    """Give the destination the model's key when it has none; what gave it (or None)."""
    name = prep.model_key_env
    if prep.model_provider != "openai" or name in carried or prep.model_key == "secret":
        return None
    if prep.model_key == "env" and not choice.key_from_env:
        return None  # the variable there (a key given now is kept as a secret instead)
    value, source = None, ""
    if choice.key_from_env:
        value = os.environ.get(choice.key_from_env)
        if not value:
            raise Refused(
                f"--key-from-env {choice.key_from_env}: the variable is not set here",
                hint=f"export {choice.key_from_env}=... first, then move again",
            )
        source = f"${choice.key_from_env}"
    elif where.here and os.environ.get(name):
        value, source = os.environ[name], f"${name} here"
    else:
        value = ask(f"the key {name} for {where.name}'s model ({prep.model}) on {ends.dst.name}: ")
        source = "asked"
    if not value:
        raise Refused(
            f"{where.name}'s model ({prep.model}) needs its key {name} on {ends.dst.name}, and "
            "none was found; nothing was sent",
            hint=f"lnk agent move --agent {where.name} --to {ends.dst.name} --key-from-env {name} "
            "(or --offline-model to think with the offline model there)",
        )
    args = ["agent", "secret", "set", name, "--agent-id", e.agent_id]
    ends.dst.run(args, stdin=value.strip().encode() + b"\n")
    return source


def forget_there(ends: Ends, e: Entry) -> None:
    """A move undone: the keys carried for an agent the destination didn't hold go."""
    if not e.dst_had_agent:
        ends.dst.run(["agent", "secret", "forget", "--agent-id", e.agent_id], check=False)


def every_text(seconds: int) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{max(5, seconds // 60)}m"


def schedule_args(name: str, sched: BackupSchedule) -> list[str]:
    """``lnk agent backup schedule`` of the same schedule, for where the agent went."""
    args = ["agent", "backup", "schedule", "--agent", name, "--to", sched.url]
    args += ["--every", every_text(sched.every_s)]
    keep = ",".join(f"{k}={v}" for k, v in (sched.keep or {}).items())
    return args + (["--keep", keep] if keep else [])


def check_schedule(
    ends: Ends, where: Whereabouts, carried: list[str], install: bool, asked: Asked
) -> BackupSchedule | None:
    """The agent's backup schedule where it is; with ``install``, refused before the bulk
    when the bucket needs a key of the agent's own (one that reaches its objects only,
    docs/buckets.md) and the agent has none."""
    sched = asked.schedule.result().schedule
    if sched is None or not install:
        return sched
    if sched.url.startswith("s3://") and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(
        carried
    ):
        line = f"agent secret set AWS_ACCESS_KEY_ID --agent {where.name}"
        raise Refused(
            f"{where.name} is backed up to {sched.url}, and {ends.dst.name} needs a key of the "
            "agent's own for that bucket (one that reaches its objects only, docs/buckets.md); "
            "nothing was sent",
            hint=(f"lnk {line}" if where.here else f"lnk box run {where.place} -- {line}")
            + " (and AWS_SECRET_ACCESS_KEY), then move again",
        )
    return sched
