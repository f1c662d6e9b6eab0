"""The lnk-move-4 manifest: what a stream says an agent is, and the rules a receiver holds it to.

The manifest travels inside the sealed stream as records (see docs/stream-format.md,
"Payload: records of an agent"):

    HEAD        one JSON object: the manifest's name (lnk-move-4.json), the agent's ID,
                owner and name, its settings, its grants, the phase
    FILES       a JSON array of file entries (at most FILES_PER_RECORD)
    DATA        raw bytes of the next file that has data, in entry order
    COLLECTION  collection records (the collection interface's export) as JSON lines,
                cut into records anywhere (a line may span records)
    SUMMARY     the counts the sender saw; must match what arrived

Everything here is pure: it parses and validates, it never touches a disk.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from lnk.agents.grants import MAX_GRANTS_BYTES
from lnk.agents.settings import ID_RE, OWNER_RE, check_name
from lnk.errors import FormatMismatch, InvalidInput, StreamError
from lnk.formats.header import FORMAT

MANIFEST_NAME = f"lnk-move-{FORMAT}.json"

# record types of the payload (the format layer reserves 0x7F)
HEAD, FILES, DATA, COLLECTION, SUMMARY = 0x01, 0x02, 0x03, 0x04, 0x05
RECORD_NAMES = {
    HEAD: "HEAD",
    FILES: "FILES",
    DATA: "DATA",
    COLLECTION: "COLLECTION",
    SUMMARY: "SUMMARY",
}

# limits a receiver enforces before it believes anything
MAX_ENTRIES = 5_000_000
MAX_COLLECTIONS = 100_000
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_LINK_BYTES = 4096  # a symbolic link's target text
MAX_FILE_SIZE = 1 << 40
MAX_JSON_RECORD = 1 << 20
MAX_COLLECTION_LINE = (1 << 20) + (64 << 10)
FILES_PER_RECORD = 2000
MAX_MTIME_NS = (1 << 63) - 1  # what a file system's timestamps hold
MAX_JSON_DEPTH = 512  # nesting of a JSON value (arrays and objects)
BASE_STREAM_RE = re.compile(r"^[0-9a-f]{32}$")
SUMMARY_KEYS = ("entries", "files", "data_bytes", "collections", "records")
PHASES = ("full", "bulk", "final")

# where files may go: Home and the agent's file-kept folders (chats/ travels as collections)
FILE_ROOTS = (
    "Home",
    "Agent/instructions",
    "Agent/skills",
    "Agent/memory",
    "Agent/schedule",
    "Agent/connections",  # the bridge's state: a Telegram offset, the ledgers (never sandboxed)
    "Agent/harness",  # an adapter's harness's home (docs/adapters.md): Hermes's HERMES_HOME
)
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
KINDS = {"f": "file", "d": "folder", "l": "symbolic link"}
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


def file_mode(mode: int) -> int:
    """A file's mode as a receiver writes it: owner read and write, no setuid, setgid
    or sticky bit (what a folder digest covers, and what a backup records)."""
    return (mode & 0o777) | 0o600


def dir_mode(mode: int) -> int:
    """A folder's mode as a receiver makes it."""
    return (mode & 0o777) | 0o700


# the agent never writes these (the sandbox mounts them read-only, or not at all: the
# bridge's connections)
READ_ONLY_ROOTS = ("Agent/instructions", "Agent/skills", "Agent/connections")


def read_only(path: str) -> bool:
    """Whether ``path`` is under a folder the agent may not write: a hard link may not
    join it to one it may write (the sandbox would leave the shared inode writable)."""
    return any(path == r or path.startswith(r + "/") for r in READ_ONLY_ROOTS)


def under(path: str, folders: set[str]) -> bool:
    """Whether ``path`` is strictly inside one of ``folders`` (one look per folder above
    it, whatever the number of folders)."""
    while "/" in path:
        path = path.rpartition("/")[0]
        if path in folders:
            return True
    return False


CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


def bad(msg: str) -> StreamError:
    return StreamError(
        f"refused the stream: {msg}",
        hint="nothing was applied; the stream may be damaged or hostile",
    )


# the common path, accepted at once: a file root, then names of printable characters
# that do not begin with a dot, the whole no longer than one name may be; any other
# path gets every check (and the error naming the first that fails)
_ROOTS = "|".join(map(re.escape, FILE_ROOTS))
_PLAIN = re.compile(f"(?:{_ROOTS})(?:/[^\\x00-\\x1f\\x7f/.][^\\x00-\\x1f\\x7f/]*)*")


def check_path(p: Any) -> str:
    """A path in the stream: relative, no '..', no NUL, under one of FILE_ROOTS."""
    if type(p) is str and _PLAIN.fullmatch(p):
        try:
            if len(p.encode("utf-8")) <= MAX_NAME_BYTES:
                return p
        except UnicodeEncodeError:
            pass  # a lone surrogate: refused below
    return _check_path(p)


def _check_path(p: Any) -> str:
    if not isinstance(p, str) or not p:
        raise bad("a file entry has no path")
    try:
        raw = p.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"the path {p[:80]!r} is not valid UTF-8 (it holds a lone surrogate)") from None
    if len(raw) > MAX_PATH_BYTES:
        raise bad(f"a path is longer than {MAX_PATH_BYTES} bytes")
    if "\x00" in p:
        raise bad(f"the path {p[:80]!r} holds a NUL byte")
    if p.startswith("/"):
        raise bad(f"the path {p[:80]!r} is absolute")
    parts = p.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise bad(f"the path {p[:80]!r} has an empty, '.' or '..' component")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise bad(f"a name in {p[:80]!r} is longer than {MAX_NAME_BYTES} bytes")
        if CONTROL_RE.search(part):
            raise bad(f"the path {p[:80]!r} holds a control character")
    if not any(p == r or p.startswith(r + "/") for r in FILE_ROOTS):
        raise bad(f"the path {p[:80]!r} is outside the agent's folders")
    return p


def fold(p: str) -> str:
    """Two paths that fold alike would be one file on a Mac: a stream may not hold both."""
    return unicodedata.normalize("NFC", p).casefold()


_FIELDS = frozenset({"p", "t", "m", "s", "h", "g", "d", "mt", "l", "k"})


@dataclass(frozen=True)
class FileEntry:
    path: str
    kind: str  # "f" file, "d" folder, "l" symbolic link (its target is text, never followed)
    mode: int
    size: int = 0
    sha256: str = ""
    group: int | None = None  # hard-link group: entries sharing it are one inode
    data: bool = False  # its bytes follow in DATA records
    mtime_ns: int = 0
    target: str = ""  # a link's target
    kept: str = ""  # a folder the receiver holds whole at this path: its digest

    def to_json(self) -> dict[str, Any]:
        if self.kind == "l":
            return {"p": self.path, "t": "l", "l": self.target}
        d: dict[str, Any] = {"p": self.path, "t": self.kind, "m": self.mode}
        if self.kept:
            d["k"] = self.kept
        if self.kind == "f":
            d.update(s=self.size, h=self.sha256, d=self.data, mt=self.mtime_ns)
            if self.group is not None:
                d["g"] = self.group
        return d

    @classmethod
    def from_json(cls, d: Any) -> FileEntry:
        if not isinstance(d, dict):
            raise bad("a file entry is not an object")
        if not d.keys() <= _FIELDS:
            raise bad(f"a file entry has unknown fields {sorted(set(d) - _FIELDS)}")
        path = check_path(d.get("p"))
        kind = d.get("t")
        if kind not in ("f", "d", "l"):
            raise bad(
                f"{path!r} is a {kind!r}: only files, folders and symbolic links travel "
                "(devices, fifos and sockets never do)"
            )
        if path in FILE_ROOTS and kind != "d":
            raise bad(
                f"{path!r} is one of the agent's folders, and the stream makes it a {KINDS[kind]}"
            )
        if kind == "l":
            return cls._link(path, d)
        if "l" in d:
            raise bad(f"{path!r} carries a link target but is not a link")
        mode = d.get("m")
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise bad(f"{path!r} has an invalid mode")
        mode &= 0o777  # never setuid, setgid or sticky
        if kind == "d":
            extra = set(d) - {"p", "t", "m", "k"}
            if extra:
                raise bad(
                    f"the folder {path!r} carries {sorted(extra)}: a folder has only p, t, m, k"
                )
            kept = d.get("k", "")
            if "k" in d and (not isinstance(kept, str) or not SHA_RE.match(kept)):
                raise bad(f"the folder {path!r} has an invalid digest")
            return cls(path, "d", dir_mode(mode), kept=kept)
        if "k" in d:
            raise bad(f"{path!r} carries a folder digest but is not a folder")
        size, sha, group, data, mtime = (
            d.get("s"),
            d.get("h"),
            d.get("g"),
            d.get("d"),
            d.get("mt", 0),
        )
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_SIZE:
            raise bad(f"{path!r} declares an invalid size")
        if not isinstance(sha, str) or not SHA_RE.match(sha):
            raise bad(f"{path!r} has an invalid SHA-256")
        if group is not None and (
            not isinstance(group, int) or isinstance(group, bool) or not 0 <= group < MAX_ENTRIES
        ):
            raise bad(f"{path!r} has an invalid hard-link group")
        if not isinstance(data, bool):
            raise bad(f"{path!r} has an invalid data flag")
        if not isinstance(mtime, int) or isinstance(mtime, bool) or not 0 <= mtime <= MAX_MTIME_NS:
            raise bad(f"{path!r} has an invalid mtime")
        return cls(path, "f", file_mode(mode), size, sha, group, data, mtime)

    @classmethod
    def _link(cls, path: str, d: dict[str, Any]) -> FileEntry:
        """A symbolic link: its target is carried as text; nothing is ever read or
        written through it (a target outside the agent is carried all the same)."""
        if set(d) != {"p", "t", "l"}:
            raise bad(f"{path!r} is a link: it carries only p, t and l")
        target = d["l"]
        if not isinstance(target, str) or not target:
            raise bad(f"{path!r} is a link without a target")
        if "\x00" in target or len(target.encode("utf-8", "surrogateescape")) > MAX_LINK_BYTES:
            raise bad(f"{path!r} has an invalid link target (NUL, or over {MAX_LINK_BYTES} bytes)")
        try:
            target.encode("utf-8")
        except UnicodeEncodeError:
            raise bad(f"{path!r} has a link target that is not UTF-8") from None
        return cls(path, "l", 0o777, target=target)


@dataclass
class Head:
    agent_id: str
    owner: str
    name: str
    settings: dict[str, Any]
    grants: str
    phase: str
    base_stream: str | None = None  # the bulk stream a final phase builds on

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": MANIFEST_NAME,
            "format": FORMAT,
            "agent": {"id": self.agent_id, "owner": self.owner, "name": self.name},
            "settings": self.settings,
            "grants": self.grants,
            "phase": self.phase,
            "base_stream": self.base_stream,
        }

    @classmethod
    def from_json(cls, d: Any) -> Head:
        if not isinstance(d, dict):
            raise bad("the manifest is not an object")
        name = d.get("manifest")
        if name != MANIFEST_NAME:
            raise FormatMismatch(
                f"the stream's manifest is {str(name)[:60]!r}; this lnk reads {MANIFEST_NAME}",
                hint="the two ends speak different stream formats: upgrade the older lnk",
            )
        agent = d.get("agent")
        if not isinstance(agent, dict):
            raise bad("the manifest names no agent")
        aid, owner, aname = agent.get("id"), agent.get("owner"), agent.get("name")
        if not isinstance(aid, str) or not ID_RE.match(aid):
            raise bad("the manifest's agent ID is invalid")
        if not isinstance(owner, str) or not OWNER_RE.match(owner):
            raise bad("the manifest's owner is invalid")
        try:
            check_name(aname)  # type: ignore[arg-type]
        except InvalidInput as e:
            raise bad(f"the manifest's agent name is invalid ({e})") from e
        settings, grants, phase = d.get("settings"), d.get("grants", ""), d.get("phase")
        if not isinstance(settings, dict):
            raise bad("the manifest carries no settings")
        if not isinstance(grants, str):
            raise bad("the manifest's grants are not text")
        if len(grants.encode()) > MAX_GRANTS_BYTES:
            raise bad(f"the manifest's grants are larger than {MAX_GRANTS_BYTES} bytes")
        for part in ("ports", "turns"):  # numbers, never booleans (True would read as 1)
            section = settings.get(part)
            if isinstance(section, dict) and any(
                isinstance(v, bool) or not isinstance(v, int) for v in section.values()
            ):
                raise bad(f"the manifest's settings [{part}] holds something other than numbers")
        if phase not in PHASES:
            raise bad(f"unknown phase {phase!r}")
        base = d.get("base_stream")
        if base is not None and (not isinstance(base, str) or not BASE_STREAM_RE.match(base)):
            raise bad("the manifest's base stream is invalid")
        return cls(aid, owner, aname, settings, grants, phase, base)  # type: ignore[arg-type]


# json.dumps with any option builds an encoder per call: one, kept (a line per file)
_DUMP = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dump(obj: Any) -> bytes:
    return _DUMP.encode(obj).encode()


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _parse(body: bytes, what: str) -> tuple[Any, str]:
    """A JSON record body parsed (and its text): at most MAX_JSON_RECORD bytes, strict
    UTF-8, within the parser's own depth; anything else refused as the record it came in."""
    if len(body) > MAX_JSON_RECORD:
        raise bad(f"a {what} record is larger than {MAX_JSON_RECORD} bytes")
    try:
        text = body.decode("utf-8")  # strict: json.loads(bytes) would pass surrogates
        return json.loads(text), text
    except UnicodeDecodeError as e:
        raise bad(f"a {what} record is not UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise bad(f"a {what} record is nested too deeply") from None
    except ValueError as e:
        raise bad(f"a {what} record is not valid JSON ({e})") from e


def load_json(body: bytes, what: str) -> Any:
    """Parse a JSON record body: strict UTF-8, no lone surrogate in any string, nested at
    most MAX_JSON_DEPTH deep.  Anything else is refused as the record it came in."""
    value, text = _parse(body, what)
    if isinstance(value, (dict, list)):
        surrogates = _SURROGATE_ESCAPE.search(text) is not None
        if surrogates or text.count("[") + text.count("{") > MAX_JSON_DEPTH:
            _check_value(value, what, surrogates)  # rare: most bodies cannot be that deep
    return value


def load_file_list(body: bytes) -> list[Any]:
    """A FILES record's body: a JSON list (of entries, each for :meth:`FileEntry.from_json`).

    Its entries are not walked for depth or lone surrogates here (a list of 2,000 objects
    passes load_json's cheap test of 512 brackets, and the walk cost a receive 6 us an
    entry): every field an entry may hold is then checked to be a number, a bool or a
    string matched or encoded as UTF-8, so a nested value or a lone surrogate is refused
    there, and nothing walks a value before."""
    value, _text = _parse(body, "file list")
    if not isinstance(value, list):
        raise bad("a file list is not a list")
    return value


def _check_value(value: Any, what: str, surrogates: bool) -> None:
    """Depth, and (when an escape could have made one) lone surrogates; iteratively."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise bad(f"a {what} record is nested deeper than {MAX_JSON_DEPTH} levels")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            for t in (k, x):
                if surrogates and isinstance(t, str) and not _utf8(t):
                    raise bad(f"a {what} record holds text with a lone surrogate ({t[:40]!r})")
            if isinstance(x, (dict, list)):
                stack.append((x, depth + 1))


def _utf8(t: str) -> bool:
    try:
        t.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
