"""``state-receive --prepare``: a receiver, and what this machine will give the agent.

The answer (``lnk.protocol.Prepared``) tells the mover, before anything is
sent, what the agent gets here: the model it will think with (decided now,
``policy.model_for_arrival``: the machine's own for it if it answers, else the
mover's word) and whether that model's key is here; the grant sections this
machine's sandbox enforces.  So a move that can't be whole where it goes is
refused before its bulk, never after its pause.
"""

from __future__ import annotations

from dataclasses import asdict

from lnk.agents import grants, models, policy
from lnk.agents.layout import Machine
from lnk.agents.registry import find_by_id
from lnk.agents.settings import ModelSettings
from lnk.formats import FORMAT as STREAM_FORMAT
from lnk.harnesses import adapter
from lnk.payload import receivers
from lnk.protocol import Prepared


def enforced_sections() -> tuple[str, ...]:
    """The grant sections this machine's sandbox holds."""
    return tuple(dict.fromkeys(f.section for f in grants.TABLE if f.enforced))


def prepare_here(
    machine: Machine,
    agent_id: str | None,
    name: str | None,
    mover_grants: str | None,
    mover_model: ModelSettings | None,
) -> Prepared:
    receivers.purge_expired(machine)
    has_agent = receivers.check_prepare(machine, agent_id, name)
    existing = find_by_id(machine, agent_id) if agent_id else None
    model = policy.model_for_arrival(
        machine,
        agent_id,
        existing.settings.model if existing else None,
        mover_model,
        models.answers,
    )
    # the model, decided now; a mover that named one was told it, so the stream's is not
    # reported as "kept" at the commit
    r = receivers.prepare(
        machine, agent_id, mover_grants, model=asdict(model) | {"told": mover_model is not None}
    )
    key = models.key_place(machine, agent_id, model) if agent_id else "none"
    return Prepared(
        receiver=r.rid,
        public_key=r.key().public.text(),
        format=STREAM_FORMAT,
        holds=r.holds(),
        has_agent=has_agent,
        folders=r.inventory_dirs(),
        model=models.describe(model),
        model_provider=model.provider,
        model_key_env=model.key_env if model.provider == "openai" else "",
        model_key=key,
        model_answers=models.answers(model),
        enforces=enforced_sections(),
        harnesses=adapter.available(),
    )
