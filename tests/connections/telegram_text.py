"""What Telegram makes of a message text: parse_mode markup, trimming, the 4096 limit.

Used by tests/telegram_api.py for sendMessage and editMessageText. What was found, and where:

* The limit ("sendMessage": text of "1-4096 characters after entities parsing") counts Unicode
  code points, not UTF-16 units: tdlib/td td/telegram/MessageContent.cpp refuses a bot's text
  with "Message is too long" when ``utf8_length`` of it (code points, td/utils/utf8.h) exceeds the
  option message_text_length_max, 4096 (the Bot API server, tdlib/telegram-bot-api, sends
  through TDLib). So 4096 emoji (8192 UTF-16 units) pass and 4097 ASCII letters fail. Offsets and
  lengths of entities, on the other hand, are in UTF-16 code units ("MessageEntity").
* It is counted after the markup is removed and the text trimmed: td/telegram/MessageEntity.cpp
  ``fix_formatted_text`` cuts trailing whitespace, and leading spaces and newlines before the
  first entity; a text with nothing left is "text must be non-empty". The raw parameter is
  checked first: empty is "message text is empty", over 32768 bytes "text is too long"
  (telegram-bot-api/Client.cpp ``get_input_message_text``, ``get_formatted_text``).
* An edit over the limit is refused by Telegram's servers, not by TDLib, with the raw
  "Bad Request: MESSAGE_TOO_LONG" (teloxide issue #430).
* Markup errors are "can't parse entities: ..." with TDLib's texts (MessageEntity.cpp
  ``parse_html``, ``parse_markdown_v2``, ``parse_markdown``), of which the common ones are kept.
  Simplified: MarkdownV2 ``>`` quotes are accepted without a blockquote entity, HTML ``<pre>``
  with a ``<code class="language-x">`` inside gives two entities, and no entity is found in
  plain text (URLs, mentions, ...).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_TEXT = 4096
Json = dict[str, Any]


class BadRequest(ValueError):
    """A 400 answer; the text follows "Bad Request: "."""


def utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def json_param(p: dict[str, str], name: str, kind: type, what: str) -> Any:
    """A JSON-serialized parameter ("Making requests") of the given type, empty if absent."""
    try:
        value = json.loads(p.get(name) or "null") or kind()
    except ValueError:
        value = None
    if not isinstance(value, kind):
        raise BadRequest(f"can't parse {what} JSON object")
    return value


def entity(kind: str, offset: int, length: int, url: str = "", language: str = "") -> Json:
    e: Json = {"type": kind, "offset": offset, "length": length}
    return e | ({"url": url} if kind == "text_link" else {"language": language} if language else {})


def _fail(why: str) -> BadRequest:
    return BadRequest("can't parse entities: " + why)


def _sorted(ents: list[Json]) -> list[Json]:
    return sorted(ents, key=lambda e: (e["offset"], -e["length"]))


_TAGS = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline",
         "ins": "underline", "s": "strikethrough", "strike": "strikethrough",
         "del": "strikethrough", "tg-spoiler": "spoiler", "span": "spoiler", "code": "code",
         "pre": "pre", "a": "text_link", "blockquote": "blockquote", "tg-emoji": "custom_emoji"}  # fmt: skip
_CHAR = re.compile(r"&(?:(lt|gt|amp|quot)(?![A-Za-z])|#x([0-9a-fA-F]*)|#(\d*));?")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_NAME = re.compile(r"[^\s>]*")


def _char(m: re.Match[str] | None) -> str:
    """The character of an HTML entity TDLib decodes (``decode_html_entity``), or "" if none."""
    if m is None or m[1]:
        return _NAMED[m[1]] if m else ""
    code = int(m[2] or "0", 16) if m[2] is not None else int(m[3] or "0")
    too_long = len(m[0].rstrip(";")) >= 10
    return chr(code) if 0 < code < 0x10FFFF and not too_long else ""


def parse_html(src: str) -> tuple[str, list[Json]]:
    """parse_mode HTML ("HTML style"): Telegram's tags; &lt; &gt; &amp; &quot; and &#N;."""
    out: list[str] = []
    ents: list[Json] = []
    stack: list[tuple[str, int, str]] = []  # tag, UTF-16 start, href
    u = i = 0
    while i < len(src):
        m = _CHAR.match(src, i)
        if (ch := _char(m)) or src[i] != "<":
            out.append(ch or src[i])
            u, i = u + utf16(ch or src[i]), m.end() if ch and m else i + 1
            continue
        at, end = len(src[:i].encode()), src.find(">", i)
        if src.startswith("</", i):
            if not stack:
                raise _fail(f"Unexpected end tag at byte offset {at}")
            if end < 0:
                raise _fail(f"Unclosed end tag at byte offset {at}")
            name, (tag, start, url) = src[i + 2 : end].strip().lower(), stack.pop()
            if name and name != tag:
                why = (
                    f'Unmatched end tag at byte offset {at}, expected "</{tag}>", found "</{name}>"'
                )
                raise _fail(why)
            if u > start:
                ents.append(entity(_TAGS[tag], start, u - start, url))
        else:
            name = _NAME.match(src, i + 1)[0].lower()  # type: ignore[index]
            if i + 1 + len(name) == len(src):
                raise _fail(f"Unclosed start tag at byte offset {at}")
            if name not in _TAGS:
                raise _fail(f'Unsupported start tag "{name}" at byte offset {at}')
            if end < 0:
                raise _fail(f"Unclosed start tag at byte offset {at}")
            inner = src[i + 1 : end]
            if name == "span" and not re.search(r"class\s*=\s*[\"']?tg-spoiler", inner):
                raise _fail(f'Tag "span" must have class "tg-spoiler" at byte offset {at}')
            href = re.search(r"href\s*=\s*[\"']([^\"']*)", inner)
            stack.append((name, u, href[1] if href else ""))
        i = end + 1
    if stack:
        raise _fail(f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"')
    return "".join(out), _sorted(ents)


_MARKS = (("```", "pre"), ("__", "underline"), ("||", "spoiler"), ("*", "bold"), ("_", "italic"),
          ("~", "strikethrough"), ("`", "code"), ("[", "text_link"))  # fmt: skip
_V1 = ("```", "*", "_", "`", "[")
_NAMES = {"strikethrough": "Strikethrough", "text_link": "TextUrl"}
_RESERVED = "_*[]()~`>#+-=|{}.!"
_LANGUAGE = re.compile(r"[^\s`]*")
_BREAK = re.compile(r"\r\n|\n\r|\n|\r|")


def parse_markdown(src: str, v2: bool) -> tuple[str, list[Json]]:
    """parse_mode MarkdownV2 (``v2``) or the legacy Markdown ("Formatting options")."""
    marks = _MARKS if v2 else tuple(m for m in _MARKS if m[0] in _V1)
    out: list[str] = []
    ents: list[Json] = []
    stack: list[tuple[str, int, int, str, int, str]] = []  # kind, UTF-16 start, byte, end mark,
    # len(out), language
    u = i = 0
    while i < len(src):
        c, nxt, top = src[i], src[i + 1 : i + 2], stack[-1] if stack else None
        if c == "\\" and nxt and (0 < ord(nxt) <= 126 if v2 else nxt in "_*`["):
            out.append(nxt)
            u, i = u + 1, i + 2
            continue
        if top and src.startswith(top[3], i) and not (top[0] == "italic" and nxt == "_"):
            kind, start, _, close, first, language = stack.pop()
            url, i = "", i + len(close)
            if kind == "text_link" and src.startswith("(", i):
                end = src.find(")", i)
                if end < 0:
                    raise _fail(f"Can't find end of a URL at byte offset {len(src[:i].encode())}")
                url, i = src[i + 1 : end], end + 1
            if u > start:
                url = url or "".join(out[first:])
                ents.append(entity(kind, start, u - start, url, language))
            continue
        literal = (
            top is not None and top[0] != "text_link" and (top[0] in ("pre", "code") or not v2)
        )
        mark = None if literal else next((m for m in marks if src.startswith(m[0], i)), None)
        if mark:
            closing = {"```": "```", "[": "]"}.get(mark[0], mark[0])
            at, i = len(src[:i].encode()), i + len(mark[0])
            language = _LANGUAGE.match(src, i)[0] if mark[1] == "pre" else ""  # type: ignore[index]
            if language and src[i + len(language) : i + len(language) + 1] not in ("", "`"):
                i += len(language)  # ```language, then one line break skipped
            else:
                language = ""
            if mark[1] == "pre":
                i += len(_BREAK.match(src, i)[0])  # type: ignore[index]
            stack.append((mark[1], u, at, closing, len(out), language))
            continue
        if v2 and not literal and c == ">" and (i == 0 or src[i - 1] == "\n"):
            i += 1
            continue
        if v2 and not literal and c in _RESERVED:
            raise _fail(f"Character '{c}' is reserved and must be escaped with the preceding '\\'")
        out.append(c)
        u, i = u + utf16(c), i + 1
    if stack:
        kind, at = stack[-1][0], stack[-1][2]
        name = _NAMES.get(kind, kind.capitalize())
        raise _fail(
            f"Can't find end of {name} entity at byte offset {at}"
            if v2
            else f"Can't find end of the entity starting at byte offset {at}"
        )
    return "".join(out), _sorted(ents)


def formatted_text(p: dict[str, str]) -> tuple[str, list[Json]]:
    """The text and entities of a sendMessage or editMessageText request, as Telegram keeps
    them (the 4096 limit is the caller's: its answer differs between the two)."""
    raw, mode = p.get("text", ""), p.get("parse_mode", "").lower()
    if not raw:
        raise BadRequest("message text is empty")
    if len(raw.encode()) > 1 << 15:
        raise BadRequest("text is too long")
    if mode == "html":
        text, ents = parse_html(raw)
    elif mode in ("markdown", "markdownv2"):
        text, ents = parse_markdown(raw, mode == "markdownv2")
    elif mode in ("", "none"):
        text, ents = raw, json_param(p, "entities", list, "entities")
    else:
        raise BadRequest("unsupported parse_mode")
    kept = text.rstrip(" \t\r\n\v\f")
    end = utf16(kept)
    first = min((e["offset"] for e in ents), default=end)
    cut = min(len(kept) - len(kept.lstrip(" \n")), first)  # one UTF-16 unit each
    ents = [
        e | {"offset": e["offset"] - cut, "length": min(e["length"], end - e["offset"])}
        for e in ents
        if e["offset"] < end
    ]
    if not kept[cut:]:
        raise BadRequest("text must be non-empty")
    return kept[cut:], ents
