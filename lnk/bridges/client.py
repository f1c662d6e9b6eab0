"""Calling a bridge: one call, one connection, proved with the agent's key."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from lnk.bridges import wire
from lnk.bridges.proof import bridge_proof
from lnk.errors import InvalidInput, LnkError, Refused, TransportError

_REFUSED = {wire.UNKNOWN_AGENT, wire.BAD_PROOF, wire.UNKNOWN_ACTION}
_TRANSPORT = {wire.BUSY, wire.TOO_SLOW, wire.REPLACED}


def _error_from(answer: dict[str, Any], path: str, action: str) -> LnkError:
    err = answer.get("error")
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return TransportError(f"the bridge at {path} gave a malformed error")
    code = err["code"]
    message = str(err.get("message", ""))
    text = f"bridge {action!r} at {path}: {message or code} ({code})"
    if code in _REFUSED:
        hint = None
        if code == wire.UNKNOWN_AGENT:
            hint = "is the agent running on this machine?"
        elif code == wire.BAD_PROOF:
            hint = "the key is not this start's key; restart the agent and try again"
        return Refused(text, hint=hint)
    if code in _TRANSPORT:
        hint = "try again in a moment" if code in (wire.BUSY, wire.REPLACED) else None
        return TransportError(text, hint=hint)
    if code == wire.BAD_REQUEST:
        return InvalidInput(text)
    return LnkError(text)


class _Conn:
    """A unix socket with a deadline over everything done on it."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buf = bytearray()

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TransportError(
                f"the bridge at {self.path} did not answer within {self.timeout:g} s"
            )
        self.sock.settimeout(left)

    def connect(self) -> None:
        self._arm()
        try:
            self.sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise TransportError(
                f"no bridge listens at {self.path}",
                hint="is the agent running? (lnk agent start)",
            ) from e
        except PermissionError as e:
            raise Refused(f"not allowed to connect to the bridge at {self.path}") from e

    def send(self, obj: dict[str, Any], action: str) -> None:
        self._arm()
        try:
            self.sock.sendall(wire.encode(obj))
        except (BrokenPipeError, ConnectionResetError):
            # The bridge may have answered (too slow, replaced) before hanging up.
            try:
                answer = self.recv_line()
            except (LnkError, OSError):
                answer = None
            if answer is not None:
                raise _error_from(answer, self.path, action) from None
            raise

    def recv_line(self) -> dict[str, Any]:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[: nl + 1])
                del self.buf[: nl + 1]
                try:
                    return wire.decode(line)
                except wire.WireError as e:
                    raise TransportError(f"the bridge at {self.path} sent {e.message}") from None
            if len(self.buf) >= wire.MAX_LINE:
                raise TransportError(
                    f"the bridge at {self.path} sent a line over {wire.MAX_LINE} bytes"
                )
            self._arm()
            chunk = self.sock.recv(wire.MAX_LINE + 1 - len(self.buf))
            if not chunk:
                raise TransportError(f"the bridge at {self.path} hung up mid-call")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def call(
    socket_path: str | os.PathLike[str],
    agent_id: str,
    owner: str,
    key: bytes,
    action: str,
    body: dict[str, Any] | None = None,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Call ``action`` on the bridge at ``socket_path`` as ``agent_id`` of ``owner``.

    Returns the handler's result.  Raises :class:`~lnk.errors.Refused` for an
    unknown agent, a bad proof or an unknown action; :class:`TransportError`
    when the bridge is busy, says the caller was too slow, or the connection
    fails; :class:`InvalidInput` for a request it could not read; a plain
    :class:`LnkError` when the bridge's handler failed.
    """
    path = os.fspath(socket_path)
    conn = _Conn(path, timeout)
    try:
        conn.connect()
        conn.send({"agent": agent_id, "owner": owner, "action": action}, action)
        answer = conn.recv_line()
        if "challenge" not in answer:
            raise _error_from(answer, path, action)
        try:
            challenge = wire.b64field(answer, "challenge")
        except wire.WireError as e:
            raise TransportError(
                f"the bridge at {path} sent a bad challenge: {e.message}"
            ) from None
        proof = bridge_proof(key, agent_id, owner, action, challenge)
        conn.send(
            {"proof": wire.b64encode(proof), "body": body if body is not None else {}}, action
        )
        answer = conn.recv_line()
        if answer.get("ok") is True:
            result = answer.get("result")
            if not isinstance(result, dict):
                raise TransportError(f"the bridge at {path} answered without a result object")
            return result
        raise _error_from(answer, path, action)
    except TimeoutError as e:
        raise TransportError(f"the bridge at {path} did not answer within {timeout:g} s") from e
    except (BrokenPipeError, ConnectionResetError) as e:
        raise TransportError(f"the bridge at {path} closed the connection: {e}") from e
    except OSError as e:
        raise TransportError(f"talking to the bridge at {path} failed: {e}") from e
    finally:
        conn.close()
