"""``lnk agent connect telegram`` and ``disconnect telegram``: the bot, its owner, its token.

Connect checks the token with getMe, prints a one-time code, and long-polls until the
first message in a private chat that carries the code (within ten minutes): its
sender is the owner, the only one the agent answers as its owner.  Everything else
that comes meanwhile is confirmed and answered with nothing.  Then the token becomes a
secret of the agent (``TELEGRAM_BOT_TOKEN``), the ledger starts past the pairing
message, and ``[bots.telegram]`` goes into its settings: its running bridge sees
them and starts polling.  Disconnect removes all three.
"""

from __future__ import annotations

import re
import secrets as random_secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from lnk.agents import registry, secrets
from lnk.agents.bots import TELEGRAM, TELEGRAM_API, TELEGRAM_TOKEN, check_api_url
from lnk.agents.layout import Machine
from lnk.agents.running import read_json
from lnk.connections.bridge import telegram_dir
from lnk.connections.ledger import Ledger, tx
from lnk.connections.telegram_api import ApiError, BotApi, Unreachable, Unsure, Update
from lnk.errors import AlreadyExists, InvalidInput, NotFound, Refused, TransportError
from lnk.fsutil import rmtree
from lnk.text import one_line

PAIR_S = 600.0
TOKEN_RE = re.compile(r"^[0-9]{1,20}:[A-Za-z0-9_-]{1,128}$")
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
Say = Callable[[str], None]


@dataclass(frozen=True)
class Paired:
    agent: str
    bot: str
    owner: int
    owner_name: str


def check_token(token: str) -> str:
    token = token.strip()
    if not TOKEN_RE.match(token):
        raise InvalidInput(
            "that is not a Telegram bot token (digits, ':' and letters, from @BotFather)",
            hint="lnk agent connect telegram --token-from-env TELEGRAM_BOT_TOKEN",
        )
    return token


def new_code() -> str:
    raw = "".join(random_secrets.choice(CODE_ALPHABET) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"


def _carries(u: Update, code: str) -> bool:
    if u.kind != "message" or u.chat_type != "private" or u.text is None:
        return False
    if u.sender_id == 0 or u.sender_id != u.chat_id:
        return False
    words = u.text.replace("/start", " ").upper().split()
    return code in words or code.replace("-", "") in words


def _bot(api: str, token: str, name: str) -> tuple[BotApi, dict[str, object]]:
    bot = BotApi(api, token)
    try:
        return bot, bot.get_me()
    except ApiError as e:
        if e.code in (401, 404):
            raise Refused(
                "Telegram refuses this bot token",
                hint=f"copy it again from @BotFather: lnk agent connect telegram --agent {name}",
            ) from None
        raise TransportError(str(e), hint=f"lnk agent connect telegram --agent {name}") from None
    except (Unreachable, Unsure) as e:
        raise TransportError(
            f"the Bot API at {api} does not answer ({e})",
            hint=f"check this machine reaches it, then: lnk agent connect telegram --agent {name}",
        ) from None


def connect_telegram(
    machine: Machine,
    name: str | None,
    token: str,
    api: str | None,
    show_code: Callable[[str, str], None],
    say: Say,
    wait_s: float = PAIR_S,
) -> Paired:
    agent = registry.find(machine, name)
    if TELEGRAM in agent.settings.bots:
        raise AlreadyExists(
            f"{agent.name} is connected to Telegram already",
            hint=f"lnk agent disconnect telegram --agent {agent.name}",
        )
    base = check_api_url(api or TELEGRAM_API)
    bot, me = _bot(base, check_token(token), agent.name)
    username = str(me.get("username", ""))[:64]
    try:
        last = bot.get_updates(-1, 0, limit=1)  # what waits already: not the pairing
    except (ApiError, Unreachable, Unsure) as e:
        raise TransportError(
            f"Telegram: {e}", hint=f"lnk agent connect telegram --agent {agent.name}"
        ) from None
    offset = max((u.update_id + 1 for u in last if u is not None), default=0)
    code = new_code()
    show_code(code, username)
    deadline = time.monotonic() + wait_s
    owner: Update | None = None
    failures = 0
    while owner is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused(
                f"no one sent the code to @{username} within {wait_s / 60:.0f} minutes",
                hint=f"lnk agent connect telegram --agent {agent.name} (a new code)",
            )
        try:
            updates = bot.get_updates(offset, int(min(25, max(1, left))))
            failures = 0
        except (ApiError, Unreachable, Unsure) as e:
            failures += 1
            if failures > 20:
                raise TransportError(
                    f"Telegram: {e}", hint=f"lnk agent connect telegram --agent {agent.name}"
                ) from None
            time.sleep(min(5.0, 0.5 * failures))
            continue
        for u in updates:
            if u is None:
                continue
            offset = max(offset, u.update_id + 1)
            if owner is None and _carries(u, code):
                owner = u
            elif u.kind == "message":
                say(
                    f"not the code: a message from {one_line(u.sender_name, 40)} "
                    f"({u.sender_id}) in a {one_line(u.chat_type, 20)} chat: ignored"
                )
    return _keep(machine, agent, bot, base, token, username, me, owner, offset, say)


def _keep(
    machine: Machine,
    agent: registry.Agent,
    bot: BotApi,
    base: str,
    token: str,
    username: str,
    me: dict[str, object],
    owner: Update,
    offset: int,
    say: Say,
) -> Paired:
    folder = telegram_dir(agent)
    rmtree(folder)  # a connection before this one: its ledger goes with it
    ledger = Ledger(folder / "ledger.sqlite")
    try:
        with tx(ledger.db):
            ledger.set_offset(offset)
    finally:
        ledger.close()
    secrets.set_secret(machine, agent.id, TELEGRAM_TOKEN, token)
    bot_id = me.get("id")
    agent.settings.bots[TELEGRAM] = {
        "api": base,
        "bot_id": bot_id if isinstance(bot_id, int) else 0,
        "username": username,
        "owner": owner.sender_id,
        "owner_name": owner.sender_name[:64],
        "paired": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    agent.save()
    try:  # the pairing message confirmed, and its sender told
        bot.get_updates(offset, 0, limit=1)
        bot.send_message(owner.chat_id, f"Paired: {agent.name} answers you here.")
    except (ApiError, Unreachable, Unsure) as e:
        say(f"paired, but telling the owner on Telegram failed ({one_line(str(e), 200)})")
    return Paired(agent.name, username, owner.sender_id, owner.sender_name)


def disconnect_telegram(machine: Machine, name: str | None, wait_s: float = 30.0) -> None:
    agent = registry.find(machine, name)
    if TELEGRAM not in agent.settings.bots:
        raise NotFound(
            f"{agent.name} is not connected to Telegram",
            hint=f"lnk agent connect telegram --agent {agent.name}",
        )
    del agent.settings.bots[TELEGRAM]
    agent.save()
    secrets.remove(machine, agent.id, TELEGRAM_TOKEN)
    # its bridge lets go of the connection before its ledger goes
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        st = read_json(agent.runtime / "bridge.json")
        pid = st.get("pid") if st else None
        if not st or TELEGRAM not in st or not isinstance(pid, int) or not _alive(pid):
            break
        time.sleep(0.05)
    rmtree(telegram_dir(agent))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"lnk.connections.bridge" in f.read()
    except OSError:
        return False
