"""The bridge server, running for real on a unix socket: calls, refusals, errors."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import AGENT, OWNER, Raw, Recorder, ServerFactory, hello

from lnk.bridges import wire
from lnk.bridges.client import call
from lnk.bridges.proof import new_key
from lnk.bridges.server import BridgeServer, Call
from lnk.errors import AlreadyExists, InvalidInput, LnkError, NotFound, Refused, TransportError


def test_a_good_call_reaches_the_handler(
    make_server: ServerFactory, key: bytes, recorder: Recorder
) -> None:
    server = make_server()
    result = call(server.socket_path, AGENT, OWNER, key, "echo", {"text": "hi\nthere", "n": [1, 2]})
    assert result == {
        "echo": {"text": "hi\nthere", "n": [1, 2]},
        "agent": AGENT,
        "uid": os.getuid(),
    }
    [seen] = recorder.calls
    assert (seen.agent_id, seen.owner, seen.action, seen.peer_uid) == (
        AGENT,
        OWNER,
        "echo",
        os.getuid(),
    )


def test_the_raw_exchange_is_as_documented(make_server: ServerFactory, key: bytes) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello())
    answer = raw.prove(key, body={"a": 1})
    assert answer == {"ok": True, "result": {"echo": {"a": 1}, "agent": AGENT, "uid": os.getuid()}}
    assert raw.closed()  # one call, one connection


def test_socket_is_0600_in_a_0700_directory_and_removed_at_stop(make_server: ServerFactory) -> None:
    server = make_server()
    path = server.socket_path
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert os.listdir(path.parent) == [path.name]
    server.stop()
    assert not path.exists()
    with pytest.raises(TransportError, match="no bridge listens"):
        call(path, AGENT, OWNER, new_key(), "echo", {})


def test_mode_argument(make_server: ServerFactory, tmp_path: Path) -> None:
    server = make_server(socket_path=tmp_path / "open" / "b.sock", mode=0o666)
    assert stat.S_IMODE(os.stat(server.socket_path).st_mode) == 0o666


def test_a_wrong_proof_never_reaches_the_handler(
    make_server: ServerFactory, recorder: Recorder
) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello())
    answer = raw.prove(new_key())
    assert answer["error"]["code"] == wire.BAD_PROOF
    with pytest.raises(Refused, match="bad-proof"):
        call(server.socket_path, AGENT, OWNER, new_key(), "echo", {})
    assert recorder.calls == []


def test_a_proof_for_another_action_or_owner_is_refused(
    make_server: ServerFactory, key: bytes, recorder: Recorder
) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello(action="echo"))
    assert raw.prove(key, action="other")["error"]["code"] == wire.BAD_PROOF
    raw = Raw(server.socket_path)
    raw.send(hello())
    assert raw.prove(key, owner="mallory")["error"]["code"] == wire.BAD_PROOF
    assert recorder.calls == []


def test_an_unknown_agent(make_server: ServerFactory, key: bytes, recorder: Recorder) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello(agent="agent-2"))
    # It is challenged like any other caller: nothing tells it apart before the proof.
    assert raw.prove(key, agent="agent-2")["error"]["code"] == wire.UNKNOWN_AGENT
    with pytest.raises(Refused, match="unknown-agent"):
        call(server.socket_path, AGENT, "bob", key, "echo", {})
    assert recorder.calls == []


def test_an_unknown_action(make_server: ServerFactory, key: bytes) -> None:
    server = make_server()
    with pytest.raises(Refused, match="unknown-action") as e:
        call(server.socket_path, AGENT, OWNER, key, "launch", {})
    assert "launch" in str(e.value)


@pytest.mark.parametrize(
    "first",
    [
        b"not json\n",
        b"[1, 2]\n",
        b"\xff\xfe\n",
        b'{"agent": "a", "agent": "b", "owner": "o", "action": "echo"}\n',
        b'{"agent": "", "owner": "o", "action": "echo"}\n',
        b'{"agent": 1, "owner": "o", "action": "echo"}\n',
        b'{"owner": "o", "action": "echo"}\n',
        b'{"agent": "a", "owner": "o", "action": NaN}\n',
        b'{"agent": "' + b"a" * 300 + b'", "owner": "o", "action": "echo"}\n',
    ],
)
def test_a_malformed_hello(make_server: ServerFactory, first: bytes) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send_bytes(first)
    assert raw.error_code() == wire.BAD_REQUEST
    assert raw.closed()


@pytest.mark.parametrize(
    "second",
    [
        b"{oops\n",
        b'{"body": {}}\n',
        b'{"proof": "***", "body": {}}\n',
        b'{"proof": 5}\n',
        b'{"proof": "AAAA", "body": [1]}\n',
    ],
)
def test_a_malformed_proof_line(
    make_server: ServerFactory, recorder: Recorder, second: bytes
) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.send(hello())
    assert "challenge" in raw.line()
    raw.send_bytes(second)
    assert raw.error_code() == wire.BAD_REQUEST
    assert recorder.calls == []


def test_a_line_of_exactly_the_limit_is_read(make_server: ServerFactory) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    start = b'{"agent":"agent-1","owner":"alice","action":"echo"'
    raw.send_bytes(start + b" " * (wire.MAX_LINE - len(start) - 2) + b"}\n")
    assert "challenge" in raw.line()


def test_a_line_over_the_limit(make_server: ServerFactory) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    start = b'{"agent":"agent-1","owner":"alice","action":"echo"'
    raw.send_bytes(start + b" " * (wire.MAX_LINE - len(start) - 1) + b"}\n")
    assert raw.error_code() == wire.BAD_REQUEST
    assert raw.closed()


def test_an_endless_line_is_cut(make_server: ServerFactory) -> None:
    server = make_server()
    raw = Raw(server.socket_path)
    raw.sock.settimeout(10)
    sent = 0
    try:
        while sent < 4 * wire.MAX_LINE:
            raw.send_bytes(b"x" * 8192)
            sent += 8192
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert raw.error_code() == wire.BAD_REQUEST


def _boom(call: Call) -> dict[str, Any]:
    raise RuntimeError("secret internals /etc/shadow")


def _refuses(call: Call) -> dict[str, Any]:
    raise NotFound(f"no chat {call.body.get('chat')!r}", hint="list the chats")


def _not_a_dict(call: Call) -> dict[str, Any]:
    return [1, 2]  # type: ignore[return-value]


def _not_json(call: Call) -> dict[str, Any]:
    return {"x": object()}


def _too_big(call: Call) -> dict[str, Any]:
    return {"x": "y" * wire.MAX_LINE}


def test_handlers_that_fail(make_server: ServerFactory, key: bytes, recorder: Recorder) -> None:
    server = make_server(
        handlers={
            "boom": _boom,
            "refuses": _refuses,
            "list": _not_a_dict,
            "odd": _not_json,
            "big": _too_big,
            "echo": recorder.echo,
        }
    )
    path = server.socket_path
    with pytest.raises(LnkError, match=r"could not carry out 'boom' \(failed\)") as e:
        call(path, AGENT, OWNER, key, "boom", {})
    assert "secret" not in str(e.value)
    with pytest.raises(LnkError, match=r"no chat 'c9' \(failed\)"):
        call(path, AGENT, OWNER, key, "refuses", {"chat": "c9"})
    for action in ("list", "odd", "big"):
        with pytest.raises(LnkError, match=r"\(failed\)"):
            call(path, AGENT, OWNER, key, action, {})
    # The server is still up and serving.
    assert call(path, AGENT, OWNER, key, "echo", {"after": True})["echo"] == {"after": True}


def test_a_key_lookup_that_raises(make_server: ServerFactory, key: bytes) -> None:
    def key_for(agent: str, owner: str) -> bytes | None:
        raise OSError("keyring unreadable")

    server = make_server(key_for=key_for)
    with pytest.raises(LnkError, match="could not look up"):
        call(server.socket_path, AGENT, OWNER, key, "echo", {})


def test_a_second_server_on_the_same_path_is_refused(
    make_server: ServerFactory, key: bytes
) -> None:
    server = make_server()
    other = BridgeServer(server.socket_path, lambda a, o: None, {})
    with pytest.raises(AlreadyExists, match="already listens"):
        other.start()
    assert call(server.socket_path, AGENT, OWNER, key, "echo", {})["agent"] == AGENT


def test_a_stale_socket_is_replaced(make_server: ServerFactory, tmp_path: Path, key: bytes) -> None:
    path = tmp_path / "stale" / "b.sock"
    path.parent.mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    make_server(socket_path=path)
    assert call(path, AGENT, OWNER, key, "echo", {})["agent"] == AGENT


def test_a_file_in_the_way_is_not_clobbered(tmp_path: Path) -> None:
    path = tmp_path / "b.sock"
    path.write_text("precious")
    with pytest.raises(AlreadyExists, match="not a socket"):
        BridgeServer(path, lambda a, o: None, {}).start()
    assert path.read_text() == "precious"


def test_a_path_too_long_for_a_socket(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="too long"):
        BridgeServer(tmp_path / ("x" * 120) / "b.sock", lambda a, o: None, {}).start()


def test_the_client_reports_nothing_listening(tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="no bridge listens") as e:
        call(tmp_path / "none.sock", AGENT, OWNER, new_key(), "echo", {})
    assert e.value.hint
