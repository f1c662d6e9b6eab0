"""The box protocol's answers (``docs/boxes.md``), typed: the one contract between machines.

Every JSON answer a box gives a mover is one frozen dataclass (``answers.py``), and
the only way in is :meth:`Answer.from_json` (``typed.py``), where the JSON arrives (a leg's
``ask``): each field is checked against its type once, and an answer that
doesn't fit is refused with one error naming the first field that failed.
Past that point, ``mypy --strict`` holds every use of a field.  The same
classes write the answers on the box's side (:meth:`Answer.to_json`).

Fields a newer lnk adds are ignored by an older one (the protocol is
additive); a field an older lnk leaves out takes its default, or, when it
has none, the answer is refused.
"""

from lnk.protocol.answers import (
    ANSWERS,
    DIGEST_PREFIX,
    AgentList,
    AgentRow,
    BackupSchedule,
    ChatAnswer,
    EarlierAnswer,
    Left,
    Prepared,
    ReceiveReport,
    ScheduleAnswer,
    SecretNames,
    ServerReady,
    StateDigests,
    Status,
    Unanswered,
    Version,
)
from lnk.protocol.typed import MAX_WORD, A, Answer, ProtocolError, decode

__all__ = [
    "ANSWERS",
    "DIGEST_PREFIX",
    "MAX_WORD",
    "A",
    "AgentList",
    "AgentRow",
    "Answer",
    "BackupSchedule",
    "ChatAnswer",
    "EarlierAnswer",
    "Left",
    "Prepared",
    "ProtocolError",
    "ReceiveReport",
    "ScheduleAnswer",
    "SecretNames",
    "ServerReady",
    "StateDigests",
    "Status",
    "Unanswered",
    "Version",
    "decode",
]
