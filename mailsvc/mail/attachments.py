"""Attachments a send request carries: base64 decoded strictly, named, typed and bounded.

A file is refused when its name says it is executable (Gmail's and Outlook's list: the big
mailbox providers refuse such mail anyway), when its content is not strict base64, or when the
files of one email together pass the limits of the settings. The content type, when not
given, is guessed from the file name. A ``contentId`` makes a file an inline part, referenced
from the html as ``cid:<contentId>``.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..store import Attachment
from ..validation import Problems

#: Extensions that mailbox providers refuse (Gmail's list, which Outlook's matches closely).
EXECUTABLE = frozenset(
    ".ade .adp .apk .appx .appxbundle .bat .cab .chm .cmd .com .cpl .diagcab .diagcfg "
    ".diagpack .dll .dmg .ex .ex_ .exe .hta .img .ins .iso .isp .jar .jnlp .js .jse .lib .lnk "
    ".mde .mjs .msc .msi .msix .msixbundle .msp .mst .nsh .pif .ps1 .scr .sct .shb .sys .vb "
    ".vbe .vbs .vhd .vxd .wsc .wsf .wsh .xll".split()
)


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
        if "/" in filename or "\\" in filename or not filename.strip("."):
            problems.add(f"{field}.filename", "must be a file name, without a folder")
            continue
        extension = "." + filename.rpartition(".")[2].lower() if "." in filename else ""
        if extension in EXECUTABLE:
            problems.add(
                f"{field}.filename",
                f"{extension} files are refused (executable; mailbox providers block them)",
            )
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
        guessed = mimetypes.guess_type(filename, strict=False)[0]
        content_type = item.get("contentType") or guessed or "application/octet-stream"
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
