"""The two HMAC proofs, each under a label of its own.

An *endpoint proof* is the harness proving to a client (a bridge handing it
a message) that it holds the agent's key::

    HMAC-SHA256(key, b"lnk endpoint proof v1\\0" || challenge)

A *bridge proof* is a caller proving to a bridge which agent it is::

    HMAC-SHA256(key, b"lnk bridge proof v1\\0"
                     || lp(agent_id) || lp(owner) || lp(action) || lp(challenge))

where ``lp(x)`` is the 4-byte big-endian length of ``x`` followed by ``x``
(strings as UTF-8).  The labels differ in their first bytes after ``lnk ``,
so an endpoint, which signs any challenge it is sent, can never be made to
sign a bridge proof, and the other way round.  See ``docs/bridges.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

ENDPOINT_LABEL = b"lnk endpoint proof v1\0"
BRIDGE_LABEL = b"lnk bridge proof v1\0"

KEY_SIZE = 32
CHALLENGE_SIZE = 32
PROOF_SIZE = 32  # SHA-256


def new_key() -> bytes:
    """A fresh random key (32 bytes)."""
    return secrets.token_bytes(KEY_SIZE)


def new_challenge() -> bytes:
    """A fresh random challenge (32 bytes)."""
    return secrets.token_bytes(CHALLENGE_SIZE)


def _lp(data: bytes) -> bytes:
    if len(data) > 0xFFFFFFFF:
        raise ValueError("field too long for a proof")
    return struct.pack(">I", len(data)) + data


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes | bytearray) or not key:
        raise ValueError("a proof needs a non-empty key")


def endpoint_proof(key: bytes, challenge: bytes) -> bytes:
    """The endpoint's answer to ``challenge``: HMAC-SHA256 under the endpoint label."""
    _check_key(key)
    return hmac.new(bytes(key), ENDPOINT_LABEL + bytes(challenge), hashlib.sha256).digest()


def verify_endpoint_proof(key: bytes, challenge: bytes, proof: bytes) -> bool:
    """Whether ``proof`` is the endpoint proof of ``challenge`` (constant time)."""
    return hmac.compare_digest(endpoint_proof(key, challenge), bytes(proof))


def bridge_message(agent_id: str, owner: str, action: str, challenge: bytes) -> bytes:
    """The exact bytes a bridge proof is an HMAC of."""
    return (
        BRIDGE_LABEL
        + _lp(agent_id.encode("utf-8"))
        + _lp(owner.encode("utf-8"))
        + _lp(action.encode("utf-8"))
        + _lp(bytes(challenge))
    )


def bridge_proof(key: bytes, agent_id: str, owner: str, action: str, challenge: bytes) -> bytes:
    """A caller's proof that it is ``agent_id`` of ``owner`` asking for ``action``."""
    _check_key(key)
    msg = bridge_message(agent_id, owner, action, challenge)
    return hmac.new(bytes(key), msg, hashlib.sha256).digest()


def verify_bridge_proof(
    key: bytes, agent_id: str, owner: str, action: str, challenge: bytes, proof: bytes
) -> bool:
    """Whether ``proof`` is the bridge proof for these fields (constant time)."""
    expected = bridge_proof(key, agent_id, owner, action, challenge)
    return hmac.compare_digest(expected, bytes(proof))
