"""A second process that reads a snapshot for a restore.

A restore has two halves of about equal weight: reading the snapshot (ranged
fetches, AES-GCM, zstd, the file list's JSON checked) and receiving it (every
check of a stream, each file staged, hashed and written).  In one process they
share one core (the GIL); ``ReaderProcess`` runs the reading half in a child
(``python -c 'from lnk.backup.restore_reader import serve; serve()'``) and this
process receives what it sends.

The child is told on stdin, in one JSON line, the HOME, the bucket's URL, the
repository's ID (checked again at use) and the snapshot's ID; it loads the
owner's private key from that HOME itself (the key never crosses the pipe).  It
answers on stdout with frames (big-endian) ``u8 type ‖ u32 n ‖ body(n)``: the
records of a stream (HEAD first), then ``END``; or, when it fails, ``FAILED``
with ``{"kind", "message", "hint"}``.
A data chunk the backup stored compressed comes as ``DATA_ZSTD``, still in its
zstd frame: the parent decompresses it (the zstd work, about a fifth of the
child's, is shared between the two cores; the pipe carries a third of the bytes).
The parent trusts nothing it did not check: a frame longer than ``FRAME_MAX``,
an unknown type, a compressed chunk that is not one frame of the size it declares
(at most ``FRAME_MAX``) or an end before ``END`` stops the restore with nothing
applied (the records go through the same checks and atomic apply as a received
stream, the SHA-256 of every file's bytes among them).

The child ends when its stdin closes (the restore ended, or its process was
killed) and ignores Ctrl-C: the restore decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import zstandard

from lnk import errors
from lnk.agents.layout import Machine
from lnk.backup import agent_keys
from lnk.backup.agent_snapshots import DATA_ZSTD, read_parts, records_layout2
from lnk.backup.reader import SnapshotReader
from lnk.backup.repository import Repository
from lnk.formats.header import read_exact
from lnk.formats.records import ZstdFrameError, decompress_exact
from lnk.payload import manifest as M
from lnk.transport.buckets import open_bucket

MIN_FILES = 2000  # a smaller snapshot is read here: the child's start (~0.2 s) would cost more
FRAME_MAX = 64 << 20  # past any record a snapshot yields (chunks of 1 MiB, lists of 2,000)
FAILED_MAX = 64 << 10  # an error's kind, message and hint: one line's worth
END, FAILED = 0xFE, 0xFF
RECORD_TYPES = frozenset((M.HEAD, M.FILES, M.DATA, M.COLLECTION, M.SUMMARY))
_KINDS: dict[str, type[errors.LnkError]] = {
    c.__name__: c
    for c in (
        errors.BackupError,
        errors.Refused,
        errors.NotFound,
        errors.FormatMismatch,
        errors.StreamError,
        errors.InvalidInput,
        errors.TransportError,
    )
}
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding lnk/
_FRAME = struct.Struct(">BI")


def _ended() -> errors.BackupError:
    return errors.BackupError(
        "the process reading the backup ended before the snapshot did; nothing was restored",
        hint="run the restore again",
    )


class ReaderProcess:
    """The snapshot ``snapshot_id`` of the repository at ``url``, read by a child."""

    def __init__(self, machine: Machine, url: str, repo_id: str, snapshot_id: str) -> None:
        code = (
            f"import sys; sys.path.insert(0, {_ROOT!r}); "
            "from lnk.backup.restore_reader import serve; serve()"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=1 << 16,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._dctx = zstandard.ZstdDecompressor()  # the child's DATA_ZSTD chunks
        self._to: IO[bytes] = self._proc.stdin
        self._from: IO[bytes] = self._proc.stdout
        ask = {"home": str(machine.home), "url": url, "repo": repo_id, "snapshot": snapshot_id}
        try:
            self._to.write(json.dumps(ask).encode() + b"\n")
            self._to.flush()  # stdin stays open: its end tells the child to stop
        except OSError:
            pass  # it is gone: the first frame says so

    @property
    def pid(self) -> int:
        return self._proc.pid

    def head(self) -> dict[str, Any]:
        """The snapshot's HEAD record (the manifest), parsed; the first thing it sends."""
        kind, body = self._frame()
        if kind != M.HEAD:
            raise M.bad("the snapshot's first record is not its manifest")
        d = M.load_json(body, "manifest")
        if not isinstance(d, dict):
            raise M.bad("the snapshot's manifest is not an object")
        return d

    def records(
        self, head: dict[str, Any], progress: Callable[[int], None] | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """The records after :meth:`head`, the HEAD given (maybe changed: restored under
        a new name) first; the data's bytes counted by ``progress``."""
        yield M.HEAD, M.dump(head)
        while True:
            kind, body = self._frame()
            if kind == END:
                return
            if kind == DATA_ZSTD:
                kind, body = M.DATA, self._unzstd(body)
            if kind == M.DATA and progress:
                progress(len(body))
            yield kind, body

    def _frame(self) -> tuple[int, bytes]:
        head = read_exact(self._from, _FRAME.size)
        if len(head) != _FRAME.size:
            raise _ended()
        kind, n = _FRAME.unpack(head)
        limit = FAILED_MAX if kind == FAILED else FRAME_MAX
        if n > limit or (kind not in RECORD_TYPES and kind not in (END, FAILED, DATA_ZSTD)):
            raise errors.BackupError(
                "the process reading the backup sent what is not one of its frames; "
                "nothing was restored",
                hint="run the restore again",
            )
        body = read_exact(self._from, n)
        if len(body) != n:
            raise _ended()
        if kind == FAILED:
            raise _failure(body)
        return kind, body

    def _unzstd(self, frame: bytes) -> bytes:
        """A chunk the child left in its zstd frame (``DATA_ZSTD``), decompressed here:
        exactly the size the frame declares, and no more than a frame may carry."""
        try:
            return decompress_exact(frame, FRAME_MAX, self._dctx)
        except ZstdFrameError:
            raise errors.BackupError(
                "a chunk of the snapshot is not one zstd frame of the size it declares "
                f"(at most {FRAME_MAX} bytes); nothing was restored",
                hint="the snapshot is damaged; pick another (lnk agent backup list)",
            ) from None

    def close(self) -> None:
        """Stop the child (done or not) and reap it."""
        with contextlib.suppress(OSError):
            self._to.close()
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._proc.wait()
        with contextlib.suppress(OSError):
            self._from.close()


def _failure(body: bytes) -> errors.LnkError:
    try:
        d = json.loads(body)
        cls = _KINDS.get(str(d.get("kind")), errors.BackupError)
        hint = d.get("hint")
        return cls(str(d["message"]), hint=str(hint) if hint else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return _ended()


# ---- the child --------------------------------------------------------------------
def serve() -> None:
    """The child: read the snapshot asked on stdin, send its records on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the restore decides; stdin's end stops this
    inp = os.fdopen(0, "rb", buffering=0)
    out = os.fdopen(1, "wb", buffering=1 << 20)
    with contextlib.suppress(OSError):
        fcntl.fcntl(1, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)  # fewer wake-ups
    line = inp.readline()
    threading.Thread(target=_stop_at_eof, args=(inp,), daemon=True).start()

    def send(kind: int, body: bytes) -> None:
        out.write(_FRAME.pack(kind, len(body)))
        out.write(body)

    try:
        try:
            for i, (kind, body) in enumerate(_records(json.loads(line))):
                send(kind, body)
                if i == 0:
                    out.flush()  # the manifest at once: the parent checks it meanwhile
            send(END, b"")
        except errors.LnkError as e:
            send(FAILED, _failed(type(e).__name__, e.message, e.hint))
        except Exception as e:  # told to the parent as one line
            send(FAILED, _failed("BackupError", f"reading the backup failed: {e}", None))
        out.flush()
    except OSError:
        pass  # the parent is gone
    os._exit(0)  # not waiting for the read-ahead's threads


def _failed(kind: str, message: str, hint: str | None) -> bytes:
    return json.dumps({"kind": kind, "message": message, "hint": hint}).encode()


def _records(ask: dict[str, Any]) -> Iterator[tuple[int, bytes]]:
    private = agent_keys.require_private(agent_keys.load(Machine(Path(ask["home"]))))
    repo = Repository.open(open_bucket(str(ask["url"])), receiver_key=private)
    if repo.id != ask["repo"]:  # another repository there since the restore opened it
        raise errors.BackupError(
            f"the repository at {ask['url']} is not the one this restore opened "
            f"({repo.id[:12]}, not {str(ask['repo'])[:12]}); nothing was restored",
            hint="check that nothing else writes to that bucket, then restore again",
        )
    reader = SnapshotReader(repo, str(ask["snapshot"]))
    parts = read_parts(reader)
    try:
        yield from records_layout2(reader, parts, compressed=True)
    finally:
        parts.entries.close()


def _stop_at_eof(inp: IO[bytes]) -> None:
    with contextlib.suppress(OSError):
        while inp.read(4096):
            pass
    os._exit(0)
