"""The box protocol's answers (``docs/boxes.md``), typed: the one contract between machines.

Every JSON answer a box gives a mover is one frozen dataclass here, and the
only way in is :meth:`Answer.from_json`, where the JSON arrives (a leg's
``ask``): each field is checked against its type once, and an answer that
doesn't fit is refused with one error naming the first field that failed.
Past that point, ``mypy --strict`` holds every use of a field.  The same
classes write the answers on the box's side (:meth:`Answer.to_json`).

Fields a newer lnk adds are ignored by an older one (the protocol is
additive); a field an older lnk leaves out takes its default, or, when it
has none, the answer is refused.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Version(Answer):
    """``lnk version --json``: the release and the stream format it speaks."""

    WHAT: ClassVar[str] = "version"
    version: str
    stream_format: int | None = None


@dataclass(frozen=True)
class Status(Answer):
    """``lnk agent status --json`` (and ``agent start --json`` once it answers)."""

    WHAT: ClassVar[str] = "status"
    OMIT_NONE: ClassVar[bool] = True  # pid, problem, exit ... only when known, as always
    name: str
    id: str
    owner: str = ""
    running: bool = False
    state: str = "stopped"
    endpoint: str = ""
    sandboxed: bool = True
    ports: tuple[int, ...] = ()
    store: str = ""
    harness: str = "builtin"  # Link's own, or an adapter's (docs/adapters.md)
    service: str = ""
    place: str = "here"
    pid: int | None = None
    problem: str | None = None
    warning: str | None = None
    exit: dict[str, Any] | None = None
    refused: dict[str, Any] | None = None
    backup: dict[str, Any] | None = None
    model: str | None = None
    connections: dict[str, Any] | None = None  # the bridge's word (bridge.json): held, telegram


@dataclass(frozen=True)
class AgentRow(Answer):
    """One agent in ``lnk agent list --json``."""

    WHAT: ClassVar[str] = "agent"
    name: str
    id: str
    place: str = "here"
    state: str = ""
    running: bool = False
    owner: str = ""
    folder: str = ""
    sandboxed: bool | None = None
    port: int | None = None
    bots: dict[str, Any] | None = None  # its connections, as its settings keep them

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        ans = super().from_json(doc, where)
        if ans.id and not _word(ans.id):  # (a move's later steps name it: --agent-id ID)
            raise ProtocolError(f"{where or cls.WHAT}.id is not an agent's ID")
        return ans


@dataclass(frozen=True)
class Unanswered(Answer):
    WHAT: ClassVar[str] = "unanswered"
    box: str
    error: str


@dataclass(frozen=True)
class AgentList(Answer):
    """``lnk agent list [--here] --json``."""

    WHAT: ClassVar[str] = "agents"
    agents: tuple[AgentRow, ...] = ()
    unanswered: tuple[Unanswered, ...] = ()

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        if isinstance(doc, list):  # an lnk older than the envelope answered its rows alone
            doc = {"agents": doc}
        return super().from_json(doc, where)


@dataclass(frozen=True)
class Prepared(Answer):
    """``lnk agent state-receive --prepare --json``: a receiver ready for the streams."""

    WHAT: ClassVar[str] = "prepared"
    receiver: str
    public_key: str
    format: int
    holds: int = 0
    has_agent: bool = False
    folders: int = 0  # folders of its base with a digest (then an inventory --against pays)
    # what the agent gets there: the model it will think with, where its key is
    # ("secret", "env", "none" or "not needed"), whether it answers there
    model: str = ""
    model_provider: str = ""
    model_key_env: str = ""
    model_key: str = "not needed"
    model_answers: bool = True
    enforces: tuple[str, ...] | None = None  # grant sections its sandbox holds (None: unsaid)
    harnesses: tuple[str, ...] | None = None  # the harnesses it can run (None: unsaid)

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        ans = super().from_json(doc, where)
        name = where or cls.WHAT
        # both go back to the box on a later step's command line, as one word each
        if not (ans.receiver.startswith("rcv-") and _word(ans.receiver)):
            raise ProtocolError(f"{name}.receiver is not a receiver's name")
        if not _word(ans.public_key):
            raise ProtocolError(f"{name}.public_key is not a key's one word")
        return ans


def _word(text: str) -> bool:
    """A box's word that a later step hands back on a command line: printable ASCII, no
    space (a NUL no command line holds; a space or a control character no name has)."""
    return 0 < len(text) <= MAX_WORD and text.isascii() and text.isprintable() and " " not in text


@dataclass(frozen=True)
class ReceiveReport(Answer):
    """``lnk agent state-receive --receiver R --json``: what a stream did there."""

    WHAT: ClassVar[str] = "report"
    agent: str
    id: str
    phase: str
    committed: bool
    owner: str = ""
    entries: int = 0
    files: int = 0
    data_bytes: int = 0
    collections: int = 0
    unchanged_home_files: int = 0
    dropped_grants: tuple[str, ...] = ()
    kept_here: tuple[dict[str, Any], ...] = ()
    grants_from: str = ""
    skipped: tuple[str, ...] = ()
    stream_id: str = ""
    kept_from_moved: tuple[str, ...] = ()
    conflicts: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        ans = super().from_json(doc, where)
        if ans.stream_id and not _word(ans.stream_id):  # (moved-away --final STREAM)
            raise ProtocolError(f"{where or cls.WHAT}.stream_id is not a stream's ID")
        return ans


@dataclass(frozen=True)
class ChatAnswer(Answer):
    """``lnk agent chat send --json``: the agent's answer, or None while it is held."""

    WHAT: ClassVar[str] = "chat"
    agent: str
    thread: str
    message_id: str
    answer: str | None = None
    held: bool = False
    # answers nobody waited for on this thread (a message held during a move), handed
    # over once, oldest first
    earlier: tuple[EarlierAnswer, ...] = ()


@dataclass(frozen=True)
class EarlierAnswer(Answer):
    """An answer to an earlier message on the thread that its chat did not wait for."""

    WHAT: ClassVar[str] = "earlier"
    message_id: str
    text: str
    answer: str


@dataclass(frozen=True)
class SecretNames(Answer):
    """``lnk agent secret list --json``: the names of an agent's keys (never a value)."""

    WHAT: ClassVar[str] = "secrets"
    agent: str
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackupSchedule(Answer):
    """An agent's backup schedule on a machine: where, how often, what it keeps."""

    WHAT: ClassVar[str] = "schedule"
    url: str
    every_s: int
    keep: dict[str, Any] | None = None


@dataclass(frozen=True)
class Left(Answer):
    """``lnk agent moved-away --json``: what the machine the agent left did."""

    WHAT: ClassVar[str] = "left"
    kept: str = ""  # where its folders are kept ("": it had left already)
    schedule: BackupSchedule | None = None  # its backup schedule here, now removed


@dataclass(frozen=True)
class ScheduleAnswer(Answer):
    """``lnk agent backup schedule --show --json``."""

    WHAT: ClassVar[str] = "schedules"
    schedule: BackupSchedule | None = None


@dataclass(frozen=True)
class ServerReady(Answer):
    """``lnk box serve --json``: the server a move's later steps at this box go through
    (:mod:`lnk.transport.served`)."""

    WHAT: ClassVar[str] = "server"
    OMIT_NONE: ClassVar[bool] = True
    socket: str
    pid: int
    # the lnk serving (as ``lnk version --json`` says it), so a move needs no version
    # step first (None from an older lnk, which did not say)
    version: str | None = None
    stream_format: int | None = None
    # how a step calls it without importing lnk (lnk.transport.served.caller): the
    # Python serving and its flags, and the caller script (None from an older lnk)
    caller: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        ans = super().from_json(doc, where)
        name = where or cls.WHAT
        # each goes on a later step's command line (a path may hold spaces, not a NUL)
        for i, word in enumerate((ans.socket, *(ans.caller or ()))):
            if not word or "\0" in word:
                what = "socket" if i == 0 else f"caller[{i - 1}]"
                raise ProtocolError(f"{name}.{what} is not a word a command line can hold")
        return ans


MAX_FOLDERS = 4_000_000  # folders in one StateDigests
MAX_PATH = 4096  # characters in one folder's path
_HEX = frozenset("0123456789abcdef")
DIGEST_PREFIX = 24  # hex digits of a folder's digest a StateDigests gives, at least


@dataclass(frozen=True)
class StateDigests(Answer):
    """``lnk agent state-digests --json``: the sending end's folders and their digests
    (docs/stream-format.md 7.3.4 and 7.7), for a receiver's ``--inventory --against``.

    Each path is a folder's path in the stream (``Home/src``): relative, ``/``-separated,
    no empty, ``.`` or ``..`` part; each digest the first :data:`DIGEST_PREFIX` to 64
    lowercase hex digits of the folder's (a sender gives the first 24: a receiver only
    picks by them what to name, and the sender compares whole digests).

    ``at``: the sending machine's file-system clock (nanoseconds) as its walk began, or 0
    (unsaid, an older lnk); a receiver's inventory gives it back, so the sender knows
    which files of a folder named held whole are unchanged since (stream-format.md 7.7)."""

    WHAT: ClassVar[str] = "state digests"
    agent: str
    id: str
    dirs: dict[str, str]
    at: int = 0

    @classmethod
    def from_json(cls, doc: Any, where: str = "") -> Self:
        ans = super().from_json(doc, where)
        name = where or cls.WHAT
        if len(ans.dirs) > MAX_FOLDERS:
            raise ProtocolError(f"{name}.dirs lists more than {MAX_FOLDERS:,} folders")
        if not 0 <= ans.at < 1 << 63:
            raise ProtocolError(f"{name}.at is not a time in nanoseconds")
        for path, digest in ans.dirs.items():
            if not _folder_path(path):
                raise ProtocolError(f"{name}.dirs has a path that is not a folder's: {path[:80]!r}")
            if not (
                isinstance(digest, str)
                and DIGEST_PREFIX <= len(digest) <= 64
                and _HEX.issuperset(digest)
            ):
                raise ProtocolError(f"{name}.dirs[{path[:80]!r}] is not a digest")
        return ans


def _folder_path(path: str) -> bool:
    if not path or len(path) > MAX_PATH or "\0" in path or path.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


A = TypeVar("A", bound=Answer)

ANSWERS: tuple[type[Answer], ...] = (
    Version,
    Status,
    AgentRow,
    Unanswered,
    AgentList,
    Prepared,
    ReceiveReport,
    ChatAnswer,
    EarlierAnswer,
    SecretNames,
    BackupSchedule,
    Left,
    ScheduleAnswer,
    StateDigests,
)
__all__ = [
    "ANSWERS",
    "AgentList",
    "AgentRow",
    "Answer",
    "BackupSchedule",
    "ChatAnswer",
    "EarlierAnswer",
    "Left",
    "Prepared",
    "ProtocolError",
    "ReceiveReport",
    "ScheduleAnswer",
    "SecretNames",
    "StateDigests",
    "Status",
    "Unanswered",
    "Version",
]


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
