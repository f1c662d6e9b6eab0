"""The two proofs: byte-exact, bound to every field, and never mistaken for each other."""

from __future__ import annotations

import hashlib
import hmac
import struct

from hypothesis import given
from hypothesis import strategies as st

from lnk.bridges.proof import (
    BRIDGE_LABEL,
    ENDPOINT_LABEL,
    bridge_message,
    bridge_proof,
    endpoint_proof,
    new_challenge,
    new_key,
    verify_bridge_proof,
    verify_endpoint_proof,
)

KEY = bytes(range(32))
CHALLENGE = bytes(range(100, 132))


def test_endpoint_proof_is_hmac_of_label_and_challenge() -> None:
    expected = hmac.new(KEY, b"lnk endpoint proof v1\x00" + CHALLENGE, hashlib.sha256).digest()
    assert endpoint_proof(KEY, CHALLENGE) == expected
    assert verify_endpoint_proof(KEY, CHALLENGE, expected)


def test_bridge_proof_is_hmac_of_label_and_length_prefixed_fields() -> None:
    msg = (
        b"lnk bridge proof v1\x00"
        + struct.pack(">I", 3)
        + b"a-1"
        + struct.pack(">I", 5)
        + b"alice"
        + struct.pack(">I", 4)
        + b"send"
        + struct.pack(">I", 32)
        + CHALLENGE
    )
    assert bridge_message("a-1", "alice", "send", CHALLENGE) == msg
    expected = hmac.new(KEY, msg, hashlib.sha256).digest()
    assert bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE) == expected
    assert verify_bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE, expected)


def test_known_answer_vectors() -> None:
    # Also written in docs/bridges.md, so another implementation can check itself.
    assert endpoint_proof(KEY, CHALLENGE).hex() == ENDPOINT_VECTOR
    assert bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE).hex() == BRIDGE_VECTOR


ENDPOINT_VECTOR = "27f3fa8159608987bb2c8189870df4182e3ccb598d5d21df348182fa3dcbf3fc"
BRIDGE_VECTOR = "55fcc420deaae2af571320a00a24e842a1d30ebe66de472c7bdcedf1bbe63b79"


def test_labels_differ_and_neither_is_a_prefix_of_the_other() -> None:
    assert not ENDPOINT_LABEL.startswith(BRIDGE_LABEL)
    assert not BRIDGE_LABEL.startswith(ENDPOINT_LABEL)
    assert ENDPOINT_LABEL.endswith(b"\0") and BRIDGE_LABEL.endswith(b"\0")


def test_an_endpoint_proof_never_verifies_as_a_bridge_proof() -> None:
    # Even when the endpoint is asked to sign the bridge message's own bytes.
    msg = bridge_message("a-1", "alice", "send", CHALLENGE)
    for challenge in (CHALLENGE, msg, msg[len(BRIDGE_LABEL) :], msg[len(ENDPOINT_LABEL) :]):
        forged = endpoint_proof(KEY, challenge)
        assert not verify_bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE, forged)


def test_a_bridge_proof_never_verifies_as_an_endpoint_proof() -> None:
    proof = bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE)
    assert not verify_endpoint_proof(KEY, CHALLENGE, proof)
    assert not verify_endpoint_proof(KEY, bridge_message("a-1", "alice", "send", CHALLENGE), proof)


@given(challenge=st.binary(max_size=200), agent=st.text(max_size=20), action=st.text(max_size=20))
def test_cross_proofs_never_match(challenge: bytes, agent: str, action: str) -> None:
    assert endpoint_proof(KEY, challenge) != bridge_proof(KEY, agent, "o", action, challenge)
    assert endpoint_proof(
        KEY, bridge_message(agent, "o", action, challenge)[len(ENDPOINT_LABEL) :]
    ) != bridge_proof(KEY, agent, "o", action, challenge)


def test_endpoint_proof_fails_with_wrong_key_or_challenge() -> None:
    proof = endpoint_proof(KEY, CHALLENGE)
    assert not verify_endpoint_proof(new_key(), CHALLENGE, proof)
    assert not verify_endpoint_proof(KEY, new_challenge(), proof)
    assert not verify_endpoint_proof(KEY, CHALLENGE, proof[:-1])
    assert not verify_endpoint_proof(KEY, CHALLENGE, b"")


def test_bridge_proof_fails_when_any_field_differs() -> None:
    proof = bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE)
    assert verify_bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE, proof)
    assert not verify_bridge_proof(new_key(), "a-1", "alice", "send", CHALLENGE, proof)
    assert not verify_bridge_proof(KEY, "a-2", "alice", "send", CHALLENGE, proof)
    assert not verify_bridge_proof(KEY, "a-1", "bob", "send", CHALLENGE, proof)
    assert not verify_bridge_proof(KEY, "a-1", "alice", "store", CHALLENGE, proof)
    assert not verify_bridge_proof(KEY, "a-1", "alice", "send", new_challenge(), proof)
    assert not verify_bridge_proof(KEY, "a-1", "alice", "send", CHALLENGE, proof[:16])


def test_length_prefixes_keep_fields_apart() -> None:
    # Without them, ("ab", "c") and ("a", "bc") would sign the same bytes.
    assert bridge_proof(KEY, "ab", "c", "x", CHALLENGE) != bridge_proof(
        KEY, "a", "bc", "x", CHALLENGE
    )
    assert bridge_proof(KEY, "a", "b", "cx", b"") != bridge_proof(KEY, "a", "bc", "x", b"")


def test_new_key_and_challenge_are_fresh_32_bytes() -> None:
    keys = {new_key() for _ in range(20)}
    challenges = {new_challenge() for _ in range(20)}
    assert len(keys) == 20 and len(challenges) == 20
    assert all(len(k) == 32 for k in keys | challenges)
