"""The box protocol's answers (lnk/protocol/): checked where they arrive, typed past it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lnk.protocol import (
    ANSWERS,
    AgentList,
    AgentRow,
    BackupSchedule,
    ChatAnswer,
    EarlierAnswer,
    Left,
    Prepared,
    ProtocolError,
    ReceiveReport,
    ScheduleAnswer,
    SecretNames,
    ServerReady,
    StateDigests,
    Status,
    Unanswered,
    Version,
    decode,
)


def test_every_answer_round_trips_through_json() -> None:
    samples = [
        Version("0.1.0", 4),
        Status(name="work", id="ag-x", ports=(20000, 20001), refused={"host": "h"}),
        AgentList.from_json({"agents": [{"name": "a", "id": "ag-1", "port": 3}]}),
        Prepared("rcv-1", "lnkpk1...", 4, 12, True),
        ReceiveReport("a", "ag-1", "final", True, kept_here=({"path": "x"},)),
        SecretNames("work", ("OPENAI_API_KEY",)),
        Left("/home/me/Link/Moved/work-1", BackupSchedule("s3://b/p", 3600, {"daily": 7})),
        ScheduleAnswer(None),
        StateDigests("work", "ag-1", {"Home": "0" * 64, "Home/src": "ab" * 32}),
        ServerReady("/run/user/1/lnk/s", 4242, "0.1.0", 4, ("/usr/bin/python3", "-I", "-S", "x")),
        ChatAnswer.from_json(
            {
                "agent": "a",
                "thread": "t",
                "message_id": "m",
                "earlier": [{"message_id": "n", "text": "hi", "answer": "yo"}],
            }
        ),
    ]
    nested = {AgentRow, Unanswered, EarlierAnswer, BackupSchedule}  # inside the others
    assert {type(s) for s in samples} == set(ANSWERS) - nested
    for s in samples:
        raw = json.dumps(s.to_json()).encode()
        assert decode(raw, type(s), "box b") == s


@pytest.mark.parametrize(
    "raw,why",
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "status is not a JSON object"),
        (b'{"id": "ag-x"}', "status has no name"),
        (b'{"name": 3, "id": "ag-x"}', "status.name is not a text"),
        (b'{"name": "a", "id": "ag-x", "running": "yes"}', "status.running is not true or false"),
        (b'{"name": "a", "id": "ag-x", "running": 1}', "status.running is not true or false"),
        (b'{"name": "a", "id": "ag-x", "pid": true}', "status.pid is not a whole number"),
        (b'{"name": "a", "id": "ag-x", "ports": [1, "2"]}', "status.ports[1] is not a whole"),
        (b'{"name": "a", "id": "ag-x", "ports": {"a": 1}}', "status.ports is not a list"),
        (b'{"name": "a", "id": "ag-x", "exit": [1]}', "status.exit is not an object"),
        (b'{"name": "' + b"x" * 70_000 + b'", "id": "i"}', "status.name is not a text"),
    ],
)
def test_a_hostile_status_is_refused_with_one_error(raw: bytes, why: str) -> None:
    with pytest.raises(ProtocolError) as ei:
        decode(raw, Status, "box evil")
    assert ei.value.message.startswith("box evil answered") and why in ei.value.message
    assert "\n" not in ei.value.message and ei.value.exit_code == 12


def test_a_list_too_long_is_refused() -> None:
    rows = [{"name": "a", "id": "i"}] * 100_001
    with pytest.raises(ProtocolError, match=r"agents\.agents is not a list"):
        decode(json.dumps({"agents": rows}).encode(), AgentList, "box big")


def test_fields_a_newer_lnk_adds_are_ignored_and_an_older_one_s_default() -> None:
    st = decode(b'{"name": "a", "id": "i", "tomorrow": {"x": 1}}', Status, "b")
    assert st.running is False and st.place == "here" and st.ports == ()


@pytest.mark.slow
def test_mypy_holds_every_use_of_an_answer_s_field(tmp_path: Path) -> None:
    """Rename one field of one answer in a copy of lnk: the type check fails where the
    mover, the places and the CLI use it (the contract that spans two machines is checked
    end to end)."""
    repo = Path(__file__).resolve().parents[1]  # the clone: its lnk and its mypy settings
    src = repo / "lnk"
    copy = tmp_path / "lnk"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    proto = copy / "protocol" / "answers.py"
    text = proto.read_text()
    assert "    running: bool = False\n" in text
    proto.write_text(text.replace("    running: bool = False\n", "    runs: bool = False\n", 1))
    config = repo / "pyproject.toml"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "lnk",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1, p.stdout
    wrong = [
        line
        for line in p.stdout.splitlines()
        if '"Status" has no attribute "running"' in line
        or 'Unexpected keyword argument "running"' in line
    ]
    where = {line.split(":")[0] for line in wrong}
    assert {"lnk/move/finish.py", "lnk/runtime/service.py"} <= where, p.stdout


def test_state_digests_take_a_digest_or_its_first_24_hex_digits() -> None:
    dirs = {"Home": "0" * 24, "Home/a": "f" * 64, "Home/b": "1" * 40}
    assert StateDigests.from_json({"agent": "a", "id": "i", "dirs": dirs}).dirs == dirs


@pytest.mark.parametrize(
    "dirs",
    [
        {"Home": "0" * 23},
        {"Home": "0" * 64 + "0"},
        {"Home": "A" * 64},
        {"Home": 7},
        {"": "0" * 64},
        {"/Home": "0" * 64},
        {"Home/../x": "0" * 64},
        {"Home/./x": "0" * 64},
        {"Home//x": "0" * 64},
        {"Home/x/": "0" * 64},
        {"Home\0x": "0" * 64},
        {"H" * 5000: "0" * 64},
    ],
)
def test_state_digests_refuse_what_is_not_a_folder_and_its_digest(dirs: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="dirs"):
        StateDigests.from_json({"agent": "a", "id": "ag-1", "dirs": dirs})


@pytest.mark.parametrize(
    "raw,why",
    [
        (b'{"socket": "/s", "pid": 1, "version": 4}', "server.version is not a text"),
        (b'{"socket": "/s", "pid": 1, "version": "' + b"9" * 70_000 + b'"}', "not a text"),
        (b'{"socket": "/s", "pid": 1, "stream_format": true}', "server.stream_format is not"),
        (b'{"socket": "/s", "pid": 1, "stream_format": "4"}', "server.stream_format is not"),
    ],
)
def test_a_box_servers_hostile_version_is_refused(raw: bytes, why: str) -> None:
    """A box's server says which lnk it is; an answer that is not a version is refused
    (the move then starts no server there and asks the version, as before)."""
    with pytest.raises(ProtocolError) as ei:
        decode(raw, ServerReady, "box evil")
    assert why in ei.value.message and "\n" not in ei.value.message


def test_only_this_very_lnk_skips_the_version_check() -> None:
    import lnk
    from lnk.formats import FORMAT
    from lnk.places.boxes import serves_this_lnk

    assert serves_this_lnk(ServerReady("/s", 1, lnk.__version__, FORMAT))
    for version, fmt in (
        (None, None),
        (lnk.__version__, None),
        ("99.0", FORMAT),
        (lnk.__version__, FORMAT + 1),
        (lnk.__version__ + " ", FORMAT),
    ):
        assert not serves_this_lnk(ServerReady("/s", 1, version, fmt)), (version, fmt)


@pytest.mark.parametrize(
    "receiver,key,why",
    [
        ("rcv-1\u0000x", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("rcv-1 --json", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("rcv-\u00e91", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("rcv-1\u001b[2J", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("../rcv-1", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("", "lnkpk1abc", "prepared.receiver is not a receiver's name"),
        ("rcv-1", "lnkpk1\u0000", "prepared.public_key is not a key's one word"),
        ("rcv-1", "lnkpk1 x", "prepared.public_key is not a key's one word"),
        ("rcv-1", "", "prepared.public_key is not a key's one word"),
    ],
)
def test_a_receiver_whose_name_or_key_no_command_line_holds_is_refused(
    receiver: str, key: str, why: str
) -> None:
    """Both go back to the box as words of later steps: a NUL (no command line holds it:
    a traceback, not a refusal, before), a space or a control character is refused in
    one line, before any step is built from it."""
    raw = json.dumps({"receiver": receiver, "public_key": key, "format": 4}).encode()
    with pytest.raises(ProtocolError) as ei:
        decode(raw, Prepared, "prepared")
    assert why in ei.value.message and "\n" not in ei.value.message


@pytest.mark.parametrize(
    "doc,why",
    [
        ({"socket": "/s\u0000x", "pid": 1}, "server.socket is not a word"),
        ({"socket": "", "pid": 1}, "server.socket is not a word"),
        ({"socket": "/s", "pid": 1, "caller": ["/py", "-I\u0000"]}, "server.caller[1] is not"),
        ({"socket": "/s", "pid": 1, "caller": [""]}, "server.caller[0] is not"),
    ],
)
def test_a_box_server_whose_socket_or_caller_no_command_line_holds_is_refused(
    doc: dict[str, object], why: str
) -> None:
    with pytest.raises(ProtocolError) as ei:
        decode(json.dumps(doc).encode(), ServerReady, "box evil")
    assert why in ei.value.message.replace("box evil", "server")


@pytest.mark.parametrize(
    "cls,doc,why",
    [
        (AgentList, {"agents": [{"name": "a", "id": "ag-1\u0000"}]}, "id is not an agent's ID"),
        (AgentList, {"agents": [{"name": "a", "id": "ag-1 x"}]}, "id is not an agent's ID"),
        (
            ReceiveReport,
            {"agent": "a", "id": "ag-1", "phase": "final", "committed": True, "stream_id": "s\n"},
            "report.stream_id is not a stream's ID",
        ),
    ],
)
def test_an_agents_id_or_a_streams_id_no_command_line_holds_is_refused(
    cls: type[AgentList] | type[ReceiveReport], doc: dict[str, object], why: str
) -> None:
    with pytest.raises(ProtocolError) as ei:
        decode(json.dumps(doc).encode(), cls, "report")
    assert why in ei.value.message
