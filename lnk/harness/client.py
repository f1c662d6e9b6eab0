"""Talking to an agent's endpoint as a bridge does: prove first, then the key.

Each call opens one connection to ``127.0.0.1:port``, sends a fresh challenge
to ``/_link/proof`` and checks the answer is the endpoint proof under the
agent's key.  Only then, on that same connection, does it send the key and
the request.  Something else on the port gets a challenge and nothing more.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
from pathlib import Path
from typing import Any

from lnk.errors import AgentNotRunning, InvalidInput, LnkError, Refused, TransportError

MAX_ANSWER = 8 << 20


def read_key(path: Path) -> bytes:
    """The endpoint key the runner wrote (``<runtime>/key``: 32 raw bytes)."""
    try:
        with open(path, "rb") as f:
            key = f.read(1024)
    except FileNotFoundError as e:
        raise AgentNotRunning(
            f"the agent's endpoint key {path} does not exist: it is not running",
            hint="start it: lnk agent start",
        ) from e
    if not key:
        raise AgentNotRunning(
            f"the agent's endpoint key {path} is empty", hint="restart it: lnk agent start"
        )
    return key


def _not_running(port: int, why: object) -> AgentNotRunning:
    return AgentNotRunning(
        f"the agent does not answer on 127.0.0.1:{port} ({why})",
        hint="start it with: lnk agent start",
    )


def _refused(port: int, why: str) -> Refused:
    return Refused(
        f"something else answers on port {port}; it could not prove it holds "
        f"the agent's key ({why})",
        hint="stop the program holding the port, then restart the agent: "
        "lnk agent stop && lnk agent start",
    )


def _read_json(resp: http.client.HTTPResponse) -> Any:
    raw = resp.read(MAX_ANSWER + 1)
    if len(raw) > MAX_ANSWER:
        raise TransportError("the agent's answer is too large")
    if resp.length:  # (a read of so many bytes returns what came: it says nothing itself)
        # fewer bytes than its length said: the connection broke in the middle of the
        # answer (an endpoint stopping as it answered), not something else answering
        raise http.client.IncompleteRead(raw, resp.length)
    return json.loads(raw)


def _request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    hdrs = dict(headers)
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    try:
        parsed = _read_json(resp)
    except ValueError:
        parsed = None
    return resp.status, parsed


def call(
    port: int, key: bytes, method: str, path: str, body: dict[str, Any] | None, timeout: float
) -> Any:
    """One proved request: the proof, then (only if it verifies) the keyed request."""
    # not at the top: lnk.bridges loads its asyncio server too, ~40 ms that every `lnk agent`
    # command would pay (runtime.service imports this module)
    from lnk.bridges.proof import new_challenge, verify_endpoint_proof  # noqa: PLC0415 (start-up)

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        challenge = new_challenge()
        try:
            status, answer = _request(
                conn,
                "POST",
                "/_link/proof",
                {"challenge": base64.b64encode(challenge).decode()},
                {},
            )
        except (ConnectionRefusedError, TimeoutError) as e:
            raise _not_running(port, e) from e
        except (http.client.HTTPException, OSError) as e:
            raise _not_running(port, f"the connection failed: {e}") from e
        if status != 200 or not isinstance(answer, dict):
            raise _refused(port, f"its proof route answered HTTP {status}")
        try:
            proof = base64.b64decode(str(answer.get("proof", "")), validate=True)
        except (binascii.Error, ValueError) as e:
            raise _refused(port, "its proof is not base64") from e
        if not verify_endpoint_proof(key, challenge, proof):
            raise _refused(port, "its proof is wrong")
        auth = {"Authorization": "Bearer " + base64.b64encode(key).decode()}
        try:
            status, answer = _request(conn, method, path, body, auth)
        except TimeoutError as e:
            raise TransportError(
                f"the agent on port {port} took longer than {timeout}s to answer",
                hint="its turn goes on; the next chat on the thread hands its answer over",
            ) from e
        except (http.client.HTTPException, OSError) as e:
            raise _not_running(port, f"the connection broke: {e}") from e
    finally:
        conn.close()
    if status == 200:
        return answer
    message = answer.get("error") if isinstance(answer, dict) else None
    hint = answer.get("hint") if isinstance(answer, dict) else None
    text = f"the agent answered HTTP {status}: {message or 'no reason given'}"
    if status == 401:
        raise Refused(text, hint="the key is stale: restart the agent (lnk agent start)")
    if status in (400, 413):
        raise InvalidInput(text, hint=hint)
    if status == 409:
        raise Refused(text, hint=hint)
    raise LnkError(text, hint=hint)


def send_message(
    port: int,
    key: bytes,
    thread: str,
    text: str,
    timeout: float = 300.0,
    message_id: str | None = None,
) -> str:
    """Send one message to the agent on its endpoint and return its answer's text.

    With ``message_id``, sending the same message again returns the same answer.
    """
    body: dict[str, Any] = {"thread": thread, "text": text}
    if message_id is not None:
        body["message_id"] = message_id
    answer = call(port, key, "POST", "/_link/message", body, timeout)
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        raise TransportError(f"the agent on port {port} sent an answer without text")
    return str(answer["text"])


def status(port: int, key: bytes, timeout: float = 10.0) -> dict[str, Any]:
    """The agent's ``{"id", "owner", "name", "sandboxed"}`` as its harness says."""
    answer = call(port, key, "GET", "/_link/status", None, timeout)
    if not isinstance(answer, dict):
        raise TransportError(f"the agent on port {port} sent a status that is not an object")
    return answer


def claim_unclaimed(
    port: int, key: bytes, thread: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The thread's answers whose caller went (Ctrl-C, a crashed turn), each handed over once."""
    answer = call(port, key, "POST", "/_link/unclaimed", {"thread": thread}, timeout)
    rows = answer.get("answers") if isinstance(answer, dict) else None
    if not isinstance(rows, list):
        return []
    return [r for r in rows[:100] if isinstance(r, dict) and isinstance(r.get("answer"), str)]
