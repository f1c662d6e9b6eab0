"""The bridge's Telegram worker: long polling, each owner's message to the agent once, each
answer back once.

    poll getUpdates(offset)          (the offset from the ledger: what is on disk is confirmed)
      for each update:
        known already?                → the offset past it, nothing else
        not the owner's private chat  → logged, ``ignored`` (never answered as the owner)
        not a text, or too long       → ``ignored`` / ``refused`` (the owner told so)
        ``delivering`` → the harness (thread telegram:<chat>, message ID tg-<update_id>)
        its answer + the offset past it, in one transaction
      send what is answered: ``sending`` on disk before each sendMessage, then ``sent``

409 (another poller, or Telegram still holding the last one's) and a lost connection are
retried with a growing wait; 429 waits its ``retry_after``.  Every line it logs of an
update is bounded and escaped (:func:`lnk.text.one_line`).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from typing import Any

from lnk.connections.fence import Gate
from lnk.connections.ledger import Ledger, LedgerInvalid
from lnk.connections.telegram_api import (
    MAX_TEXT_IN,
    ApiError,
    BotApi,
    TooLarge,
    Unreachable,
    Unsure,
    Update,
    split_text,
)
from lnk.errors import AgentNotRunning, InvalidInput, LnkError, Refused
from lnk.text import one_line

POLL_S = 25
MAX_BACKOFF_S = 30.0
Deliver = Callable[[str, str, str], str]  # (thread, text, message ID) -> the answer's text
_UPDATE_ID = re.compile(rb'"update_id"\s*:\s*(\d{1,18})')


class TelegramWorker:
    def __init__(
        self,
        gate: Gate,
        api: BotApi,
        ledger_path: Any,
        owner: int,
        deliver: Deliver,
        log: logging.Logger,
        poll_s: int = POLL_S,
    ) -> None:
        self.gate, self.api, self.owner, self.deliver, self.log = gate, api, owner, deliver, log
        self.ledger_path, self.poll_s = ledger_path, poll_s
        self.state = "starting"
        self.note = ""
        self._failures = 0

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        try:
            ledger = Ledger(self.ledger_path)
        except LedgerInvalid as e:
            self.state, self.note = "refused", e.message
            self.log.error("telegram: %s (hint: %s)", e.message, e.hint)
            return
        try:
            for out in ledger.recover():
                self.log.warning(
                    "telegram: the answer %s may or may not have reached chat %d (the bridge "
                    "stopped while sending it): unknown, never sent again",
                    out.id,
                    out.chat_id,
                )
            self.gate.check()
            self.state = "polling"
            while True:
                self.flush(ledger)
                updates = self._poll(ledger)
                for u in updates:
                    self.handle(ledger, u)
        finally:
            ledger.close()

    def _poll(self, ledger: Ledger) -> list[Update | None]:
        self.gate.check()
        try:
            updates = self.api.get_updates(ledger.offset, self.poll_s)
        except TooLarge as e:
            self._too_large(ledger, e.head)
            return []
        except ApiError as e:
            self._backoff(e)
            return []
        except (Unreachable, Unsure) as e:
            self._backoff(e)
            return []
        self._failures = 0
        self.state, self.note = "polling", ""
        return updates

    def _backoff(self, e: Exception) -> None:
        self._failures += 1
        if isinstance(e, ApiError) and e.code == 429:
            wait = float(max(1, min(e.retry_after, 300)))
        else:
            wait = min(MAX_BACKOFF_S, 0.5 * 2 ** min(self._failures - 1, 6))
            wait *= random.uniform(0.7, 1.3)  # two bridges on one token don't march in step
        if isinstance(e, ApiError) and e.code in (401, 404):
            self.state, self.note = "refused", "Telegram refuses the bot's token"
            wait = 60.0
        elif isinstance(e, ApiError) and e.code == 409:
            self.note = "another poller holds the bot (409): retrying"
        else:
            self.note = one_line(str(e), 200)
        if self._failures in (1, 5) or self._failures % 50 == 0:
            self.log.warning("telegram: %s; retrying in %.1f s", self.note, wait)
        self.gate.wait(wait)

    def _too_large(self, ledger: Ledger, head: bytes) -> None:
        """An answer over the bound: once more with one update, then that update refused."""
        try:
            self.api.get_updates(ledger.offset, 0, limit=1)
            return  # it fits alone: the next poll takes it
        except TooLarge as e:
            head = e.head
        except (ApiError, Unreachable, Unsure) as e:
            self._backoff(e)
            return
        m = _UPDATE_ID.search(head)
        if m is None:
            self.log.error("telegram: an answer too large to read, with no update ID in sight")
            self.gate.wait(MAX_BACKOFF_S)
            return
        uid = int(m[1])
        self.log.warning("telegram: update %d is too large to read: refused, not delivered", uid)
        with self.gate.acting():
            ledger.settle(uid, 0, "refused", None)

    # -- one update ---------------------------------------------------------------------

    def handle(self, ledger: Ledger, u: Update | None) -> None:
        if u is None:
            self.log.warning("telegram: an entry of getUpdates that is not an update: skipped")
            return
        state = ledger.update_state(u.update_id)
        if state not in (None, "delivering"):
            with self.gate.acting():  # seen before: confirmed once past it, never again
                ledger.set_offset(max(ledger.offset, u.update_id + 1))
            return
        who = f"user {u.sender_id} ({one_line(u.sender_name, 40)}) in {u.chat_type or '?'} chat {u.chat_id}"
        owners = u.chat_type == "private" and u.chat_id == u.sender_id == self.owner
        if u.kind != "message" or not owners:
            self.log.info(
                "telegram: update %d (%s) from %s: not the owner's private chat, not answered",
                u.update_id,
                one_line(u.kind, 40),
                who,
            )
            with self.gate.acting():
                ledger.settle(u.update_id, u.chat_id, "ignored", None)
            return
        if u.text is None:
            why = (
                f"(lnk carries messages of up to {MAX_TEXT_IN} characters; this one has {u.too_long})"
                if u.too_long
                else "(lnk carries text messages only)"
            )
            self.log.info("telegram: update %d from the owner: %s", u.update_id, why)
            with self.gate.acting():
                ledger.settle(u.update_id, u.chat_id, "refused", why)
            return
        with self.gate.acting():
            ledger.delivering(u.update_id, u.chat_id)
        answer = self._deliver(u)
        with self.gate.acting():
            ledger.settle(u.update_id, u.chat_id, "done", answer)
        self.flush(ledger)

    def _deliver(self, u: Update) -> str:
        assert u.text is not None
        tries = 0
        while True:
            self.gate.check()
            try:
                return self.deliver(f"telegram:{u.chat_id}", u.text, f"tg-{u.update_id}")
            except (AgentNotRunning, Refused) as e:  # restarting, or its turn held: again
                tries += 1
                if tries in (1, 10):
                    self.log.warning("telegram: update %d waits: %s", u.update_id, e.message)
                self.gate.wait(min(MAX_BACKOFF_S, 0.2 * tries))
            except InvalidInput as e:
                return f"(the agent refused this message: {e.message})"
            except LnkError as e:
                return f"(the agent could not answer this message: {e.message})"

    # -- sending ----------------------------------------------------------------------------

    def flush(self, ledger: Ledger) -> None:
        for out in ledger.to_send():
            if out.chat_id != self.owner:  # only ever the owner's chat (a ledger edited by hand)
                self.log.error(
                    "telegram: an answer %s for chat %d, not the owner's: never sent",
                    out.id,
                    out.chat_id,
                )
                with self.gate.acting():
                    ledger.mark(out.id, "failed", note="not the owner's chat")
                continue
            pieces = split_text(out.answer)
            k = out.chunks_sent
            while k < len(pieces):
                k = self._send_piece(ledger, out.id, out.chat_id, pieces, k)

    def _send_piece(self, ledger: Ledger, out_id: str, chat: int, pieces: list[str], k: int) -> int:
        """Send piece ``k``; the next piece's index (len(pieces) once done or given up)."""
        last = k + 1 == len(pieces)
        with self.gate.acting():
            ledger.mark(out_id, "sending", k)
            try:
                self.api.send_message(chat, pieces[k])
            except Unreachable as e:
                ledger.mark(out_id, "answered", k)  # never left: sent again
                wait, why = 1.0, str(e)
            except ApiError as e:
                if e.code == 429:
                    ledger.mark(out_id, "answered", k)
                    wait, why = float(max(1, min(e.retry_after, 300))), str(e)
                else:
                    state = "unknown" if e.code >= 500 else "failed"
                    ledger.mark(out_id, state, k, note=one_line(e.description, 300))
                    self.log.warning(
                        "telegram: the answer %s is %s: %s", out_id, state, one_line(str(e), 300)
                    )
                    return len(pieces)
            except Unsure as e:
                ledger.mark(out_id, "unknown", k, note=one_line(str(e), 300))
                self.log.warning(
                    "telegram: the answer %s may or may not have reached chat %d (%s): unknown, "
                    "never sent again",
                    out_id,
                    chat,
                    one_line(str(e), 200),
                )
                return len(pieces)
            else:
                ledger.mark(out_id, "sent" if last else "answered", k + 1)
                return k + 1
        self.log.info("telegram: sending %s waits %.0f s (%s)", out_id, wait, one_line(why, 200))
        self.gate.wait(wait)
        return k
