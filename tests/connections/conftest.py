"""Fixtures for the connections' tests: the Bot API server on loopback (``telegram``)."""

from __future__ import annotations

from telegram_api import telegram

__all__ = ["telegram"]
