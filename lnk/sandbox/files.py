"""The sandbox's ``[files]`` grants: folders of the agent's Home or of yours shown
in the sandbox, read-only or writable, and never what the layout hides.

What the layout hides of HOME (:data:`HIDDEN_IN_HOME`: lnk's and other
programs' keys and credentials, the agents' folders) no grant shows, nor a
system folder the sandbox makes (:data:`SYSTEM_ONLY`); what a wider grant
would show of the hidden is covered.  ``bwrap.py`` puts the result in the
sandbox's command line; ``lnk agent allow`` checks a grant with it first.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from lnk.errors import Refused

if TYPE_CHECKING:
    from lnk.agents.registry import Agent

# what the layout hides of HOME, whatever a [files] grant says: lnk's and other programs'
# keys and credentials
HIDDEN_IN_HOME = (
    ".config",
    ".ssh",
    ".lnk",
    ".gnupg",
    ".aws",
    ".azure",
    ".docker",
    ".kube",
    ".password-store",
    ".local/share/keyrings",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".my.cnf",
    "Link/Agents",
)
SYSTEM_ONLY = ("/proc", "/sys", "/dev", "/run", "/etc")


def under(path: str, roots: list[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _hidden(agent: Agent) -> list[str]:
    home = agent.machine.home
    return [os.path.realpath(home / h) for h in HIDDEN_IN_HOME]


def _refuse_path(agent: Agent, flag: str, given: str, why: str, hint: str | None = None) -> Refused:
    return Refused(
        f"the agent {agent.name}'s grant --{flag} {given} {why}",
        hint=hint
        or "a grant never shows what the sandbox hides; if the agent's file holds it, "
        f"take it out: lnk agent deny --agent {agent.name} --{flag} {shlex.quote(given)}",
    )


def file_grants(
    agent: Agent, read: list[str], write: list[str], *, strict: bool = True
) -> tuple[list[str], list[str], list[str]]:
    """``[files]`` grants as bwrap arguments: (outside the agent's folders, covers, inside Home).

    A path is one of the agent's Home (``work``, ``.``), or yours (``~/x``,
    ``/x``).  Never widened: a grant at or under what the layout hides
    (``~/.config``, ``~/.ssh``, ``~/.lnk``, the agents' folders, ...) or a
    system mount is refused, and what a wider grant holds of the hidden
    paths is covered with an empty tmpfs.  A later grant of a path wins (a
    ``--write`` over a ``--read``).

    ``strict`` (``lnk agent allow``) refuses a path that doesn't exist; at a
    start a missing folder of the agent's Home is made, and a missing one of
    yours shows nothing (there is nothing to show, so nothing is widened).
    """
    home = os.path.realpath(agent.folders.home)
    hidden = _hidden(agent)
    outside_binds: list[tuple[str, str, str]] = []
    inside_binds: list[tuple[str, str, str]] = []
    covers: list[str] = []
    for flag, paths in (("read", read), ("write", write)):
        opt = "--ro-bind" if flag == "read" else "--bind"
        for given in paths:
            if given.startswith("~"):
                path = str(agent.machine.home) + given[1:]
            elif given.startswith("/"):
                path = given
            else:
                path = os.path.join(agent.folders.home, given)
            real = os.path.realpath(path)
            in_home = under(real, [home])
            if not given.startswith(("~", "/")) and not in_home:
                raise _refuse_path(agent, flag, given, "leads out of the agent's Home")
            if real == "/" or under(real, list(SYSTEM_ONLY)):
                raise _refuse_path(agent, flag, given, "names a system folder the sandbox makes")
            if not in_home and under(real, hidden):
                raise _refuse_path(
                    agent, flag, given, "is under what the sandbox hides (~/.ssh, ~/.config, ...)"
                )
            if not os.path.exists(real):
                if strict:
                    raise _refuse_path(
                        agent,
                        flag,
                        given,
                        f"names {real}, which does not exist",
                        hint=f"make the folder first, then grant it: mkdir -p {shlex.quote(real)}",
                    )
                if not in_home:
                    continue
                os.makedirs(real, exist_ok=True)  # the agent's own folder, as granted
            dest = path if given.startswith(("~", "/")) else real
            (inside_binds if in_home else outside_binds).append((opt, real, dest))
            for h in hidden:
                if under(h, [real]) and h != real and os.path.lexists(h) and h not in covers:
                    covers.append(h)
    cover_args: list[str] = []
    for h in covers:
        # a folder is covered by an empty one, anything else by an empty file
        cover_args += ["--tmpfs", h] if os.path.isdir(h) else ["--ro-bind", "/dev/null", h]
    # a folder before what's in it, so a grant inside a wider one holds (sorted is stable:
    # of one path, the --write, given after the --read, wins)
    outside: list[str] = []
    inside: list[str] = []
    for binds, args in ((outside_binds, outside), (inside_binds, inside)):
        for opt, real, dest in sorted(binds, key=lambda b: len(Path(b[2]).parts)):
            args += [opt, real, dest]
    return outside, cover_args, inside
