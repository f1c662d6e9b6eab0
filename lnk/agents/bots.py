"""An agent's connections as its settings keep them: the ``bots`` map (``[bots.telegram]``).

The map travels with the agent's settings (a stream's HEAD carries them), so it is
checked wherever settings are read: each connection's name, its table's size and
value types, and for Telegram the fields its bridge relies on.  Secrets are never
here: a bot's token is a secret of the agent (``TELEGRAM_BOT_TOKEN``,
:mod:`lnk.agents.secrets`), carried over a move's legs and never in a stream.

    [bots.telegram]
    api = "https://api.telegram.org"   # the Bot API's base URL (a test server's in tests)
    bot_id = 123456                    # from getMe
    username = "my_agent_bot"
    owner = 42                         # the paired owner's user ID (= their private chat)
    owner_name = "Ann"                 # as Telegram said it at pairing (foreign text)
    paired = "2026-12-03T09:00:00+00:00"
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import urllib.parse
from typing import Any

from lnk.errors import InvalidInput

CONNECTION_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
USERNAME_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
MAX_CONNECTIONS = 16
MAX_FIELDS = 32
MAX_VALUE_CHARS = 1024
TELEGRAM = "telegram"
TELEGRAM_TOKEN = "TELEGRAM_BOT_TOKEN"  # the secret's name
TELEGRAM_API = "https://api.telegram.org"
MAX_ID = (1 << 53) - 1  # Telegram's ids fit in 52 bits


def _bad(where: str, what: str) -> InvalidInput:
    return InvalidInput(
        f"the settings {where} have {what}",
        hint="fix the [bots] table by hand, or: lnk agent disconnect telegram",
    )


def check_api_url(url: object, where: str = "given") -> str:
    """A Bot API base URL: https, or http to an address of this machine or of a private
    network alone (a Bot API server of your own, as tdlib/telegram-bot-api runs, or a
    test's); no user, query or fragment (the token goes into its path)."""
    if not isinstance(url, str) or not 0 < len(url) <= 200:
        raise _bad(where, "an api URL that is not a short text")
    try:
        u = urllib.parse.urlsplit(url)
        host = u.hostname or ""
        u.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as e:
        raise _bad(where, f"an api URL that does not parse ({e})") from None
    near = host == "localhost"
    with contextlib.suppress(ValueError):
        near = near or ipaddress.ip_address(host).is_private
    if u.scheme not in ("https", "http") or not host or u.username or u.query or u.fragment:
        raise _bad(where, "an api URL that is not https://HOST[/PATH]")
    if u.scheme == "http" and not near:
        raise _bad(where, "an http:// api URL to a public address (the token would travel bare)")
    return url.rstrip("/")


def _id(section: dict[str, Any], key: str, where: str, *, required: bool) -> int:
    value = section.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise _bad(where, f"a [bots.telegram] {key} that is not a user ID")
    if required and value == 0:
        raise _bad(where, f"no [bots.telegram] {key}")
    return value


def check_telegram(section: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(section)
    out["api"] = check_api_url(section.get("api", TELEGRAM_API), where)
    out["bot_id"] = _id(section, "bot_id", where, required=True)
    out["owner"] = _id(section, "owner", where, required=True)
    username = section.get("username", "")
    if not isinstance(username, str) or (username and not USERNAME_RE.match(username)):
        raise _bad(where, "a [bots.telegram] username that is not a bot's")
    return out


def check_bots(value: object, where: str) -> dict[str, dict[str, Any]]:
    """The ``bots`` map, checked: names, sizes, scalar values, and Telegram's fields."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_CONNECTIONS:
        raise _bad(where, "a [bots] that is not a small table")
    out: dict[str, dict[str, Any]] = {}
    for name, section in value.items():
        if not isinstance(name, str) or not CONNECTION_RE.match(name):
            raise _bad(where, f"a connection named {str(name)[:40]!r}")
        if not isinstance(section, dict) or len(section) > MAX_FIELDS:
            raise _bad(where, f"a [bots.{name}] that is not a small table")
        for k, v in section.items():
            ok = isinstance(v, bool | int) or (isinstance(v, str) and len(v) <= MAX_VALUE_CHARS)
            if not isinstance(k, str) or not CONNECTION_RE.match(k.replace("_", "-")) or not ok:
                raise _bad(where, f"a [bots.{name}] field that is not a short name and value")
        out[name] = check_telegram(section, where) if name == TELEGRAM else dict(section)
    return out


def public(bots: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What ``lnk agent list --json`` shows of each connection (never a secret: none is here)."""
    return {name: dict(section) for name, section in sorted(bots.items())}
