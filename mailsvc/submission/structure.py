"""A submitted message's MIME structure: Python's own parser, with a quicker reading of the
messages mail clients send.

Python's parser (:mod:`email.feedparser`) reads a message one line at a time in interpreted
Python, and compiles a pattern for each multipart's boundary (a new one a message, as clients
make them): on one SMTP connection, a quarter of the process's CPU a message. Most
messages are plain: lines that end in CRLF, header sections with a blank line after them,
multiparts whose boundaries stand alone. :func:`parse` reads those by cutting the text at
those lines (a search, not a loop over lines) and gives the same tree of
:class:`~email.message.Message` as Python's parser, with the same headers, payloads, preamble
and epilogue. Anything else is left to Python's parser: a bare CR or LF, a header section it
would find a defect in (a line that is no header, a first line that continues nothing, an
envelope ``From`` line, no blank line), a multipart with no boundary or one it would find
unsound (no start or close boundary, boundaries one after the other, a transfer encoding a
multipart cannot have), a ``message/*`` part, a digest, parts nested deeper than the caller
allows. So what the quick reading gives is what Python's would, and whatever it leaves, with
its defects, Python's gives (``tests/test_message_structure.py`` holds the two to each other).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from email import policy
from email.message import Message
from email.parser import Parser

#: Python's first policy (compat32), whose headers are plain strings read only when asked for.
#: The modern one builds a parsed header object (and a class) at every look, which made reading
#: a small message cost 2 ms; what it would decode, :mod:`.mime` decodes.
POLICY = policy.compat32
#: A header line's name and its colon, as Python's parser knows a header line.
_NAME = re.compile(r"[\041-\071\073-\176]+:")
#: The transfer encodings a multipart may have (RFC 2045, section 6.4).
_MULTIPART_ENCODINGS = ("7bit", "8bit", "binary")


class TooManyParts(Exception):
    """The message has more parts than its reader allows (containers included)."""


class Parts:
    """How many more parts a reading may make: it stops at the first one too many, not after
    making every part of a message that has thousands."""

    def __init__(self, most: int) -> None:
        self.left = most

    def one_more(self) -> None:
        """:raises TooManyParts: there is no room for another part."""
        self.left -= 1
        if self.left < 0:
            raise TooManyParts


def parse(raw: bytes, max_depth: int, max_parts: int) -> Message:
    """The message ``raw`` as Python's parser reads it (8-bit bytes kept as surrogates):
    read quickly when it is plain and no deeper than ``max_depth``, else by that parser.

    :raises TooManyParts: the quick reading found more than ``max_parts`` parts (Python's
        parser, which reads the rest, makes them all).
    """
    text = raw.decode("ascii", "surrogateescape")
    crlf = text.count("\r\n")
    if text.count("\r") == crlf and text.count("\n") == crlf:  # every line ends in CRLF
        quick = read_plain(text, 0, len(text), max_depth, Parts(max_parts))
        if quick is not None:
            return quick
    return Parser(policy=POLICY).parsestr(text)


def read_plain(text: str, start: int, end: int, depth_left: int, parts: Parts) -> Message | None:
    """``text[start:end]`` (a message, or a part of one, its lines ending in CRLF) read by its
    lines' places, or None when it is not plain (see the module). Only the payloads,
    preambles and epilogues are copied out of ``text``, each once: a part nested in others
    is never copied with them.

    :raises TooManyParts: ``parts`` has no room for one of its parts.
    """
    parts.one_more()
    if text.startswith("\r\n", start, end):
        message, body = Message(policy=POLICY), start + 2
    else:
        blank = text.find("\r\n\r\n", start, end)
        if blank < 0:
            return None
        found = _header_section(text[start:blank])
        if found is None:
            return None
        message, body = found, blank + 4
    maintype = message.get_content_maintype()
    if maintype == "message":
        return None
    if maintype != "multipart":
        message.set_payload(text[body:end])
        return message
    if depth_left <= 1 or message.get_content_type() == "multipart/digest":
        return None
    boundary = message.get_boundary()
    encoding = str(message.get("content-transfer-encoding", "8bit")).lower()
    if not boundary or encoding not in _MULTIPART_ENCODINGS:
        return None
    return _multipart(message, text, body, end, boundary, depth_left, parts)


def _header_section(section: str) -> Message | None:
    """The headers of a section (its lines without the blank one after them), each value as
    Python's first policy keeps it: unfolded no further than its lines' ends."""
    message = Message(policy=POLICY)
    name: str | None = None
    value: list[str] = []
    for line in section.split("\r\n"):
        if line[:1] in (" ", "\t"):
            if name is None:
                return None  # (a first line that continues nothing)
            value.append(line)
            continue
        if name is not None:
            message[name] = "\r\n".join(value)
        found = _NAME.match(line)
        if found is None or line.startswith("From "):
            return None
        name = line[: found.end() - 1]
        value = [line[found.end() :].lstrip(" \t")]
    if name is not None:
        message[name] = "\r\n".join(value)
    return message


def _multipart(
    message: Message, text: str, body: int, end: int, boundary: str, depth_left: int, parts: Parts
) -> Message | None:
    """``message`` with its parts, cut from its body (``text[body:end]``) at its boundary's
    lines."""
    found: list[Message | str] = []
    opened: tuple[int, int] | None = None
    for start, after, closes in _boundary_lines(text, f"--{boundary}", body, end):
        if opened is None:  # the first boundary
            if closes:
                return None
            if start > body:
                message.preamble = text[body : start - 2]  # (its CRLF is the boundary's)
            opened = (start, after)
            continue
        if start - 2 < opened[1]:
            return None  # one boundary right after another
        part = read_plain(text, opened[1], start - 2, depth_left - 1, parts)
        if part is None:
            return None
        if part.is_multipart() and part.epilogue == "":
            if not text.endswith("\r\n", opened[1], start - 2):
                part.epilogue = None  # (as Python's parser: nothing after its close boundary)
        found.append(part)
        if closes:  # the rest is the epilogue
            message.set_payload(found)
            message.epilogue = text[after:end]
            return message
        opened = (start, after)
    return None  # no start boundary, or no close boundary


def _boundary_lines(
    text: str, delimiter: str, start: int, end: int
) -> Iterator[tuple[int, int, bool]]:
    """Where each line of ``text[start:end]`` that is a boundary line starts and ends (with
    its CRLF), and whether it is the close boundary: the delimiter (``--`` and the boundary),
    ``--`` for the close one, and nothing else but blanks (RFC 2046's transport padding).
    Found by searching for the delimiter, not by a pattern made for each boundary: a new
    boundary a message, as clients write them, would cost a new pattern's 50 us."""
    at = (
        start
        if text.startswith(delimiter, start, end)
        else _after_crlf(text, delimiter, start, end)
    )
    while at >= 0:
        line_end = text.find("\r\n", at, end)
        stop = end if line_end < 0 else line_end
        rest = text[at + len(delimiter) : stop]
        closes = rest.startswith("--")
        if not (rest[2:] if closes else rest).strip(" \t"):
            yield at, end if line_end < 0 else line_end + 2, closes
        at = _after_crlf(text, delimiter, at, end)


def _after_crlf(text: str, delimiter: str, start: int, end: int) -> int:
    """Where the next line after ``start`` (before ``end``) that begins with ``delimiter``
    begins, or -1."""
    found = text.find("\r\n" + delimiter, start, end)
    return found + 2 if found >= 0 else -1
