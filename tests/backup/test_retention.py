"""Retention is per agent: two agents in one repository, every --keep form, each backend.

A backup's ``--keep`` (and a schedule's) prunes its own agent's snapshots alone;
``prune`` applies the rules to each agent on its own; ``--dry-run`` removes
nothing and says "would".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bk_helpers import sample_agent

from lnk.agents.layout import Machine
from lnk.backup.agent import backup_agent
from tests.lnkrun import lnk

DAY = datetime(2025, 3, 10, 12, tzinfo=UTC)
# each agent backed up at the same times: two on the first day, one on the second and
# two on the third (one hour apart), then one a week later
TIMES = [
    DAY,
    DAY + timedelta(hours=2),
    DAY + timedelta(days=1),
    DAY + timedelta(days=2),
    DAY + timedelta(days=2, hours=1),
    DAY + timedelta(days=9),
]

# the rule, and of each agent's six the indices it keeps
RULES = [
    ("last=1", {5}),
    ("last=2", {4, 5}),
    ("hourly=2", {4, 5}),
    ("daily=2", {4, 5}),
    ("daily=3", {2, 4, 5}),
    ("weekly=1", {5}),
    ("weekly=2", {4, 5}),
    ("monthly=1", {5}),
    ("yearly=1", {5}),
    ("last=1,daily=3", {2, 4, 5}),
]


def _ids(src: Machine, url: str) -> dict[str, list[str]]:
    a, b = sample_agent(src, "alpha"), sample_agent(src, "beta")
    return {
        name: [backup_agent(src, agent, url, time=t).snapshot for t in TIMES]
        for name, agent in (("alpha", a), ("beta", b))
    }


def _listed(url: str) -> set[str]:
    r = lnk("agent", "backup", "list", "--from", url, "--json")
    assert r.code == 0, r.err
    return {x["id"] for x in r.json()}


def test_every_keep_form_keeps_each_agent_s_own(src: Machine, url: str) -> None:
    ids = _ids(src, url)
    every = set(ids["alpha"] + ids["beta"])
    for rule, keeps in RULES:
        want = {ids[n][i] for n in ids for i in keeps}
        dry = lnk("agent", "backup", "prune", "--from", url, "--keep", rule, "--dry-run", "--json")
        assert dry.code == 0, dry.err
        assert set(dry.json()["kept"]) == want, rule
        assert set(dry.json()["forgotten"]) == every - want, rule
        assert dry.json()["dry_run"] is True and dry.json()["groups"] == 2
    assert _listed(url) == every  # a dry run removes nothing
    words = lnk("agent", "backup", "prune", "--from", url, "--keep", "last=1", "--dry-run")
    assert "would forget 10 snapshot(s) of 2 agent(s)" in words.err, words.err
    rule, keeps = RULES[4]
    r = lnk("agent", "backup", "prune", "--from", url, "--keep", rule)
    assert r.code == 0 and "forgot 6 snapshot(s) of 2 agent(s)" in r.err, r.err
    assert _listed(url) == {ids[n][i] for n in ids for i in keeps}


def test_a_backup_s_keep_prunes_its_own_agent_alone(src: Machine, url: str) -> None:
    """The report's case: `backup --agent alpha --keep last=1` took beta's only snapshot."""
    a = sample_agent(src, "alpha")
    sample_agent(src, "beta")
    old_alpha = backup_agent(src, a, url, time=DAY).snapshot
    beta = lnk("agent", "backup", "--agent", "beta", "--to", url)
    assert beta.code == 0, beta.err
    r = lnk("agent", "backup", "--agent", "alpha", "--to", url, "--keep", "last=1")
    assert r.code == 0, r.err
    assert "pruned 1 of alpha's snapshot(s)" in r.err
    kept = _listed(url)
    assert beta.out.strip() in kept and r.out.strip() in kept and old_alpha not in kept


def test_prune_of_one_agent_keeps_every_other(src: Machine, local_url: str) -> None:
    ids = _ids(src, local_url)
    r = lnk(
        "agent",
        "backup",
        "prune",
        "--from",
        local_url,
        "--keep",
        "last=1",
        "--agent",
        "beta",
        "--json",
    )
    assert r.code == 0, r.err
    assert _listed(local_url) == set(ids["alpha"]) | {ids["beta"][5]}
    q = lnk("agent", "backup", "prune", "--from", local_url, "--keep", "last=1", "--agent", "gamma")
    assert q.code == 3 and "holds no snapshot of gamma" in q.err, q.err
