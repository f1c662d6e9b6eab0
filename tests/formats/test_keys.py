"""Receiver keys and their text form."""

from __future__ import annotations

import hashlib

import pytest

from lnk.errors import InvalidInput
from lnk.formats import ReceiverKey, key_id, parse_public_key
from lnk.formats.keys import PUBLIC_LEN, PublicKey


def test_seed_determines_the_key() -> None:
    a = ReceiverKey.from_seed(b"\x01" * 32)
    b = ReceiverKey.from_seed(a.seed)
    assert a.public.raw == b.public.raw
    assert len(a.public.raw) == PUBLIC_LEN == 1216
    assert a.public.raw != ReceiverKey.from_seed(b"\x02" * 32).public.raw
    assert key_id(a.public) == hashlib.sha256(a.public.raw).digest() == a.key_id


def test_generate_makes_distinct_keys() -> None:
    a, b = ReceiverKey.generate(), ReceiverKey.generate()
    assert len(a.seed) == 32 and a.seed != b.seed and a.key_id != b.key_id
    assert "seed" not in repr(a) and a.seed.hex() not in repr(a)


def test_text_form_round_trips() -> None:
    k = ReceiverKey.generate()
    text = k.public_key_text()
    assert text.startswith("lnkpk1") and text.isascii() and " " not in text
    assert parse_public_key(text).raw == k.public.raw
    assert parse_public_key(f"  {text[:800]}\n{text[800:]}\n").raw == k.public.raw


@pytest.mark.parametrize(
    ("mangle", "words"),
    [
        (lambda t: "", "start with lnkpk1"),
        (lambda t: "ssh-ed25519 AAAA", "start with lnkpk1"),
        (lambda t: t[:-10], "cut off"),
        (lambda t: t + "A", "cut off"),
        (lambda t: t[:50] + "!" + t[51:], "base64url"),
        (lambda t: t[:50] + ("B" if t[50] != "B" else "C") + t[51:], "typo"),
        (lambda t: t[:-1] + ("B" if t[-1] != "B" else "C"), "typo"),
    ],
)
def test_bad_text_is_refused_with_a_hint(mangle: object, words: str) -> None:
    text = ReceiverKey.from_seed(b"\x03" * 32).public_key_text()
    with pytest.raises(InvalidInput) as info:
        parse_public_key(mangle(text))  # type: ignore[operator]
    assert words in info.value.message
    assert info.value.hint and info.value.exit_code == 5


def test_bad_seed_and_bad_bytes_are_refused() -> None:
    with pytest.raises(InvalidInput):
        ReceiverKey.from_seed(b"short")
    with pytest.raises(InvalidInput):
        PublicKey.from_bytes(b"\x00" * 10)


def test_hpke_seal_and_open() -> None:
    from lnk.errors import StreamError
    from lnk.formats.keys import hpke_open, hpke_seal

    k = ReceiverKey.generate()
    sealed = hpke_seal(k.public, b"secret", b"info")
    assert hpke_open(k, sealed, b"info") == b"secret"
    with pytest.raises(StreamError):
        hpke_open(k, sealed, b"other info")
    with pytest.raises(StreamError):
        hpke_open(ReceiverKey.generate(), sealed, b"info")
