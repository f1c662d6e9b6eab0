"""The box protocol's answers (``docs/boxes.md``): one frozen dataclass each, and the
checks a field's type alone does not say (a word a later step hands back on a command
line, a folder's path, a digest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from lnk.protocol.typed import MAX_WORD, Answer, ProtocolError


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
    ServerReady,
)
