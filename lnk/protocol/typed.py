"""How a box's answer is typed: each field checked once, where the JSON arrives.

An answer is a frozen dataclass deriving :class:`Answer`; :meth:`Answer.from_json`
checks every field against its type hint (bounded lists and texts, no bool for a
number) and refuses, in one :class:`ProtocolError`, the first that does not fit.
The answers themselves are in :mod:`lnk.protocol.answers`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, ClassVar, Self, TypeVar

from lnk.errors import TransportError

MAX_LIST = 100_000  # rows in one answer
MAX_TEXT = 64 * 1024  # characters in one text field
MAX_WORD = 4096  # characters in one word a later step hands back (a name, an ID, a key)


class ProtocolError(TransportError):
    """A box's answer that is not what the protocol says (docs/boxes.md)."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _check(tp: Any, value: Any, path: str) -> Any:
    """``value`` as type ``tp``, or ProtocolError naming ``path``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors: list[str] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(arg, value, path)
            except ProtocolError as e:
                errors.append(e.message)
        raise ProtocolError(errors[0] if errors else f"{path} is missing")
    if origin is tuple:
        (item,) = (a for a in typing.get_args(tp) if a is not Ellipsis)
        if not isinstance(value, list) or len(value) > MAX_LIST:
            raise ProtocolError(f"{path} is not a list")
        return tuple(_check(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ProtocolError(f"{path} is not an object")
        return value
    if isinstance(tp, type) and issubclass(tp, Answer):
        return tp.from_json(value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{path} is not true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{path} is not a whole number")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{path} is not a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ProtocolError(f"{path} is not a text (of at most {MAX_TEXT} characters)")
        return value
    raise TypeError(f"lnk.protocol cannot check {tp!r}")  # a field type this module lacks


class Answer:
    """One answer of the protocol (a frozen dataclass): read from and written to JSON."""

    WHAT: ClassVar[str] = "answer"
    OMIT_NONE: ClassVar[bool] = False  # leave out fields that are None (unknown)

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        """The answer, each field checked; ProtocolError naming the first that failed."""
        name = where or cls.WHAT
        if not isinstance(doc, dict):
            raise ProtocolError(f"{name} is not a JSON object")
        hints = _hints(cls)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in doc:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ProtocolError(f"{name} has no {f.name}")
                continue
            kw[f.name] = _check(hints[f.name], doc[f.name], f"{name}.{f.name}")
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        """The answer as JSON (with ``OMIT_NONE``, a field left unknown is left out)."""
        out: dict[str, Any] = _lists(dataclasses.asdict(self))  # type: ignore[call-overload]
        if self.OMIT_NONE:
            out = {k: v for k, v in out.items() if v is not None}
        return out


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


A = TypeVar("A", bound=Answer)


def decode(raw: bytes, answer: type[A], where: str) -> A:
    """A box's answer (the bytes it wrote) as ``answer``; ProtocolError if it isn't one."""
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = f"{e.msg} at byte {e.pos}" if isinstance(e, json.JSONDecodeError) else e.reason
        raise ProtocolError(
            f"{where} answered what is not JSON ({why})",
            hint=f"check the lnk installed on {where} (lnk box add installs this one)",
        ) from e
    try:
        return answer.from_json(doc)
    except ProtocolError as e:
        raise ProtocolError(
            f"{where} answered what lnk can't take: {e.message}",
            hint=f"check the lnk installed on {where} (lnk box add installs this one)",
        ) from e
