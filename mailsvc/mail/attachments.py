"""Attachments a send request carries: base64 decoded strictly, named, typed and bounded.

A file is refused when its name says it is executable (Gmail's and Outlook's list: the big
mailbox providers refuse such mail anyway), when its content is not strict base64, or when the
files of one email together pass the limits of the settings. The name is read as a mail client
or Windows would read it: with its trailing dots and spaces dropped, compatibility forms and
letters of other scripts that look like Latin ones (Cyrillic ``е``) taken for those; and a
name that could hide or change what it shows is refused outright (control and invisible
formatting characters such as a right-to-left override or a zero-width space, an RFC 2047
encoded word that clients decode, and ``< > : " | ? *``, with which Windows names streams).
Only plain files can be attached: a ``multipart/*`` or ``message/*`` type would make the
message's own structure (a ``.eml`` file goes as ``application/octet-stream``). The content
type, when not given, is guessed from the file name. A ``contentId`` makes a file an inline
part, referenced from the html as ``cid:<contentId>``.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..http.validation import Problems
from ..store import Attachment

#: Extensions that mailbox providers refuse (Gmail's list, which Outlook's matches closely).
EXECUTABLE = frozenset(
    ".ade .adp .apk .appx .appxbundle .bat .cab .chm .cmd .com .cpl .diagcab .diagcfg "
    ".diagpack .dll .dmg .ex .ex_ .exe .hta .img .ins .iso .isp .jar .jnlp .js .jse .lib .lnk "
    ".mde .mjs .msc .msi .msix .msixbundle .msp .mst .nsh .pif .ps1 .scr .sct .shb .sys .vb "
    ".vbe .vbs .vhd .vxd .wsc .wsf .wsh .xll".split()
)


#: Letters of other scripts that look like Latin ones, as the Latin letter they pass for
#: (after NFKC and case folding; Unicode's confusables for the letters of the extensions).
_LOOKALIKES = str.maketrans(
    {
        **dict.fromkeys("аα", "a"),
        **dict.fromkeys("ьвβ", "b"),
        **dict.fromkeys("сϲ", "c"),
        "ԁ": "d",
        **dict.fromkeys("еёε", "e"),
        "ɡ": "g",
        "һ": "h",
        **dict.fromkeys("іїιıɩ", "i"),
        "ј": "j",
        **dict.fromkeys("кκ", "k"),
        "ӏ": "l",
        **dict.fromkeys("мп", "m"),
        **dict.fromkeys("ոη", "n"),
        **dict.fromkeys("оο", "o"),
        **dict.fromkeys("рρ", "p"),
        "ԛ": "q",
        "ѕ": "s",
        **dict.fromkeys("тτ", "t"),
        **dict.fromkeys("սυ", "u"),
        **dict.fromkeys("ѵν", "v"),
        **dict.fromkeys("ԝω", "w"),
        **dict.fromkeys("хχ", "x"),
        "у": "y",
    }
)
#: Content types that are a message's structure, not a file's.
_STRUCTURE = ("multipart/", "message/")
#: What Windows and mail clients read specially in a file name.
_RESERVED = set('<>:"|?*')


def _why_refused(filename: str) -> str | None:
    """Why a file name is refused, or None."""
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in filename):
        return (
            "must not contain control or invisible formatting characters (such as a "
            "right-to-left override or a zero-width space)"
        )
    if "=?" in filename and "?=" in filename:
        return "must not be an RFC 2047 encoded word (=?...?=): give the name as it is"
    if _RESERVED & set(filename):
        return 'must not contain < > : " | ? or *'
    if "/" in filename or "\\" in filename or not filename.strip(". "):
        return "must be a file name, without a folder"
    read_as = unicodedata.normalize("NFKC", filename).casefold().translate(_LOOKALIKES)
    read_as = read_as.rstrip(". ")  # as Windows reads it
    extension = "." + read_as.rpartition(".")[2] if "." in read_as else ""
    if extension in EXECUTABLE:
        return f"{extension} files are refused (executable; mailbox providers block them)"
    return None


@dataclass(frozen=True)
class AttachmentLimits:
    #: Decoded bytes of all the files of one email.
    max_bytes: int
    #: Files per email.
    max_count: int


def parse_attachments(
    items: Sequence[dict[str, Any]], limits: AttachmentLimits, problems: Problems
) -> tuple[Attachment, ...]:
    """The schema-valid ``attachments`` of a request, decoded; each problem noted (by index),
    none raised."""
    parsed: list[Attachment] = []
    content_ids: set[str] = set()
    for index, item in enumerate(items):
        field = f"attachments[{index}]"
        if problems.failed(field):
            continue
        filename = item["filename"].strip()
        refused = _why_refused(filename)
        if refused is not None:
            problems.add(f"{field}.filename", refused)
            continue
        try:
            content = base64.b64decode(item["content"], validate=True)
        except (binascii.Error, ValueError):
            problems.add(f"{field}.content", "not valid base64 (no spaces or line breaks)")
            continue
        content_id = item.get("contentId")
        if content_id is not None:
            if content_id in content_ids:
                problems.add(f"{field}.contentId", "already used by another attachment")
                continue
            content_ids.add(content_id)
        given = item.get("contentType")
        if given and given.lower().startswith(_STRUCTURE):
            problems.add(
                f"{field}.contentType",
                "must be the type of a file: multipart/* and message/* make the message's "
                "own structure",
            )
            continue
        guessed = mimetypes.guess_type(filename, strict=False)[0]
        if guessed and guessed.startswith(_STRUCTURE):
            guessed = None  # a .eml file is sent as a file, not as a message part
        content_type = given or guessed or "application/octet-stream"
        parsed.append(Attachment(filename, content_type.lower(), content, content_id))
    if len(items) > limits.max_count:
        problems.add(
            "attachments", f"at most {limits.max_count} files (MAILSVC_ATTACHMENTS_MAX_COUNT)"
        )
    total = sum(len(attachment.content) for attachment in parsed)
    if total > limits.max_bytes:
        problems.add(
            "attachments",
            f"at most {limits.max_bytes} bytes in all, decoded; these are {total} "
            f"(MAILSVC_ATTACHMENTS_MAX_BYTES)",
        )
    return tuple(parsed)
