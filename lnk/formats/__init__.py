"""The sealed stream format (docs/stream-format.md): keys, header, records, writer, reader."""

from lnk.formats.header import FORMAT, RECORD_MAX, StreamFault
from lnk.formats.keys import PublicKey, ReceiverKey, key_id, parse_public_key
from lnk.formats.reader import StreamReader, peek_format
from lnk.formats.stream import StreamSummary, StreamWriter, split_body

__all__ = [
    "FORMAT",
    "RECORD_MAX",
    "PublicKey",
    "ReceiverKey",
    "StreamFault",
    "StreamReader",
    "StreamSummary",
    "StreamWriter",
    "key_id",
    "parse_public_key",
    "peek_format",
    "split_body",
]
