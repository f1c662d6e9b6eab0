"""The one bridge server every door out of a sandbox runs on.

A bridge says only what it does with a call (``handlers``) and how to find an
agent's key (``key_for``); this server does the rest, once: the socket and its
mode, the challenge and the proof, the deadline over the whole exchange up to
the proof, the places of unproven connections (a few per peer user), the cap
on proved calls running at once, and the one error shape.  The protocol is
written down in ``docs/bridges.md``.

Run it in a background thread (``start()``/``stop()``, or ``with``), in the
foreground (``serve_forever()``), or inside a running loop (``await serve()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk.bridges import wire
from lnk.bridges.proof import new_challenge, new_key, verify_bridge_proof
from lnk.bridges.sockfile import listening_socket, unlink_if_ours
from lnk.errors import LnkError, TransportError

log = logging.getLogger(__name__)

DEFAULT_DEADLINE = 5.0
DEFAULT_PLACES_PER_USER = 4
DEFAULT_MAX_CALLS = 32


@dataclass(frozen=True)
class Call:
    """One proved call, as a handler sees it."""

    agent_id: str
    owner: str
    action: str
    body: dict[str, Any]
    peer_uid: int
    """The unix user at the other end (SO_PEERCRED), -1 where the system won't say."""


Handler = Callable[[Call], dict[str, Any]]
KeyLookup = Callable[[str, str], "bytes | None"]


class _Place:
    """An unproven connection's place among its user's few."""

    __slots__ = ("task", "uid", "writer")

    def __init__(self, uid: int, writer: asyncio.StreamWriter, task: asyncio.Task[Any] | None):
        self.uid = uid
        self.writer = writer
        self.task = task

    def evict(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(
                wire.error_line(
                    wire.REPLACED, "a newer connection from the same user took this place"
                )
            )
            self.writer.close()
        if self.task is not None:
            self.task.cancel()


def _peer_uid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    opt = getattr(socket, "SO_PEERCRED", None)
    if sock is None or opt is None:
        return -1
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    except OSError:
        return -1
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def _run_handler(handler: Handler, call: Call) -> tuple[str | None, Any]:
    """Run a handler in a worker thread; never raise: (error code or None, result/message)."""
    try:
        result = handler(call)
    except LnkError as e:
        return wire.FAILED, e.message
    except BaseException:
        log.debug("bridge handler for %r raised", call.action, exc_info=True)
        return wire.FAILED, f"the bridge could not carry out {call.action!r}"
    if not isinstance(result, dict):
        return wire.FAILED, f"the bridge's {call.action!r} gave no result object"
    return None, result


class BridgeServer:
    """A unix-socket server running bridge handlers for proved callers."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        key_for: KeyLookup,
        handlers: Mapping[str, Handler],
        *,
        deadline: float = DEFAULT_DEADLINE,
        places_per_user: int = DEFAULT_PLACES_PER_USER,
        max_calls: int = DEFAULT_MAX_CALLS,
        mode: int = 0o600,
    ) -> None:
        if deadline <= 0 or places_per_user < 1 or max_calls < 1:
            raise ValueError("deadline, places_per_user and max_calls must be positive")
        self.socket_path = Path(socket_path)
        self._key_for = key_for
        self._handlers = dict(handlers)
        self._deadline = float(deadline)
        self._places_per_user = places_per_user
        self._max_calls = max_calls
        self._mode = mode
        self._places: dict[int, deque[_Place]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._inode: int | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- running ---------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Listen in a background thread; return once the socket is in place."""
        if self._thread is not None:
            raise RuntimeError("this bridge server is already running")
        ready = threading.Event()
        self._thread_error = None
        self._stop_requested = False

        def run() -> None:
            try:
                asyncio.run(self.serve(ready=ready.set))
            except BaseException as e:
                self._thread_error = e
            finally:
                ready.set()

        self._thread = threading.Thread(
            target=run, name=f"lnk-bridge:{self.socket_path.name}", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            self.stop()
            raise TransportError(f"the bridge server at {self.socket_path} did not start")
        if self._thread_error is not None:
            self._thread.join()
            self._thread = None
            raise self._thread_error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, close every connection and remove the socket file."""
        self._stop_requested = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            self._thread = None

    def __enter__(self) -> BridgeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve in the foreground until ``stop()``, SIGTERM or SIGINT."""

        self._stop_requested = False

        async def main() -> None:
            loop = asyncio.get_running_loop()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.add_signal_handler(sig, self.stop)
            await self.serve()

        asyncio.run(main())

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve on the running loop until ``stop()`` is called (from any thread)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=self._max_calls, thread_name_prefix="lnk-bridge-call"
        )
        try:
            server = await self._listen()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        try:
            if ready is not None:
                ready()
            if not self._stop_requested:
                await self._stopping.wait()
        finally:
            server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await server.wait_closed()
            self._unlink()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._places.clear()

    # -- the socket ------------------------------------------------------

    async def _listen(self) -> asyncio.AbstractServer:
        sock, self._inode = listening_socket(self.socket_path, self._mode)
        try:
            return await asyncio.start_unix_server(
                self._on_connect, sock=sock, limit=wire.MAX_LINE - 1
            )
        except BaseException:
            sock.close()
            unlink_if_ours(self.socket_path, self._inode)
            raise

    def _unlink(self) -> None:
        if self._inode is not None:
            unlink_if_ours(self.socket_path, self._inode)
        self._inode = None

    # -- places of unproven connections -----------------------------------

    def _take_place(self, place: _Place) -> None:
        queue = self._places.setdefault(place.uid, deque())
        while len(queue) >= self._places_per_user:
            queue.popleft().evict()
        queue.append(place)

    def _free_place(self, place: _Place) -> None:
        queue = self._places.get(place.uid)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(place)
        if not queue:
            del self._places[place.uid]

    # -- one connection --------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            answer = await self._converse(reader, writer, task)
            if answer is not None:
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), self._deadline)
        except (asyncio.CancelledError, OSError, TimeoutError, ConnectionError):
            pass
        except Exception:
            log.debug("bridge connection failed", exc_info=True)
        finally:
            if task is not None:
                self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_line(self, reader: asyncio.StreamReader) -> bytes | None:
        """A line, or None when the caller hung up before finishing one."""
        try:
            return await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            raise wire.WireError(
                wire.BAD_REQUEST, f"a line is over {wire.MAX_LINE} bytes"
            ) from None

    async def _converse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        task: asyncio.Task[Any] | None,
    ) -> bytes | None:
        """Run one exchange; return the answer line to send (None: send nothing)."""
        place = _Place(_peer_uid(writer), writer, task)
        self._take_place(place)
        try:
            async with asyncio.timeout(self._deadline):
                line = await self._read_line(reader)
                if line is None:
                    return None
                hello = wire.decode(line)
                agent = wire.name_field(hello, "agent")
                owner = wire.name_field(hello, "owner")
                action = wire.name_field(hello, "action")
                challenge = new_challenge()
                writer.write(wire.encode({"challenge": wire.b64encode(challenge)}))
                await writer.drain()
                line = await self._read_line(reader)
                if line is None:
                    return None
                msg = wire.decode(line)
        except TimeoutError:
            return wire.error_line(
                wire.TOO_SLOW, f"no proof within {self._deadline:g} s of connecting"
            )
        except wire.WireError as e:
            return wire.error_line(e.code, e.message)
        finally:
            self._free_place(place)

        try:
            proof = wire.b64field(msg, "proof")
            body = msg.get("body", {})
            if not isinstance(body, dict):
                raise wire.WireError(wire.BAD_REQUEST, "'body' must be a JSON object")
        except wire.WireError as e:
            return wire.error_line(e.code, e.message)
        return await self._after_proof(
            Call(agent, owner, action, body, place.uid), challenge, proof
        )

    async def _after_proof(self, call: Call, challenge: bytes, proof: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        try:
            key = await loop.run_in_executor(None, self._key_for, call.agent_id, call.owner)
        except Exception:
            log.debug("key lookup failed", exc_info=True)
            return wire.error_line(wire.FAILED, "the bridge could not look up the agent's key")
        known = isinstance(key, bytes | bytearray) and len(key) > 0
        # An unknown agent is checked against a throwaway key: the same work as a bad proof.
        check_key = bytes(key) if known and key is not None else new_key()
        good = verify_bridge_proof(
            check_key, call.agent_id, call.owner, call.action, challenge, proof
        )
        if not known:
            return wire.error_line(
                wire.UNKNOWN_AGENT, f"no agent {call.agent_id!r} of {call.owner!r} here"
            )
        if not good:
            return wire.error_line(wire.BAD_PROOF, "the proof does not match the agent's key")
        handler = self._handlers.get(call.action)
        if handler is None:
            return wire.error_line(
                wire.UNKNOWN_ACTION, f"this bridge has no action {call.action!r}"
            )
        if self._running >= self._max_calls:
            return wire.error_line(
                wire.BUSY, f"the bridge is running {self._max_calls} calls already"
            )
        self._running += 1
        try:
            code, value = await loop.run_in_executor(self._executor, _run_handler, handler, call)
        finally:
            self._running -= 1
        if code is not None:
            return wire.error_line(code, str(value))
        try:
            line = wire.encode({"ok": True, "result": value})
        except (TypeError, ValueError):
            return wire.error_line(
                wire.FAILED, f"the bridge's {call.action!r} gave a result that is not JSON"
            )
        if len(line) > wire.MAX_LINE:
            return wire.error_line(
                wire.FAILED,
                f"the bridge's {call.action!r} gave a result over {wire.MAX_LINE} bytes",
            )
        return line
