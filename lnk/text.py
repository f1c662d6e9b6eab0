"""Text from outside lnk's own process, made fit for a person's terminal.

Whatever a sandbox, a box, a stream, a bucket or a connection wrote can hold
control characters: ESC sequences (OSC 52 writes the clipboard, CSI moves
the cursor), ``\\r`` overwriting a line, C1 controls (0x9b is a CSI of its
own), lone surrogates, bidirectional overrides that reorder what is shown.
:func:`escape` shows each escaped (``\\x1b``, ``\\u202e``), never as it is;
every line lnk prints of foreign text goes through it (``lnk.cli.output``).
"""

from __future__ import annotations

# bidirectional overrides, embeddings, marks and isolates: they reorder what the terminal shows
_BIDI = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})


def escape(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character, lone surrogate and bidirectional control
    escaped.  With ``lines``, newlines and tabs are kept (a log, an answer); otherwise
    the text stays one line."""
    if text.isprintable() and text.isascii():
        return text
    out: list[str] = []
    for ch in text:
        o = ord(ch)
        if lines and ch in "\n\t":
            out.append(ch)
        elif o < 0x20 or 0x7F <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF or o in _BIDI:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def one_line(text: str, limit: int) -> str:
    """Foreign words as one escaped line of at most ``limit`` characters (and a count of
    what was cut)."""
    flat = escape(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[:limit] + f"... ({len(flat) - limit} more)"
