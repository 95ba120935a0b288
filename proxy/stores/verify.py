"""The one check of a stored object against its reference and admission record (proxy layer).

Each backend reads an object and its record its own way (a file with a JSON record beside it, a GET
with its metadata) and hands both to ``verify``: the only place that decides an object is intact, so
the filesystem and S3 refuse exactly the same damage with the same code.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from ...policy.errors import CORRUPT, AttachmentError, ImageRejected
from ...policy.model import ID_PREFIX, StoredImage, short_id
from .admission import header_info


class Record(Protocol):
    """What admission recorded of an object (``stores.base.AttachmentMeta`` is one)."""

    @property
    def media_type(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...


def verify(attachment_id: str, data: bytes, record: Record) -> StoredImage:
    """The verified image, when ``data`` is the object ``attachment_id`` names and agrees with its
    ``record``: its SHA-256 is the id's digest, its size the record's, and its header parses to
    the record's media type and dimensions.

    Raises ``AttachmentError(ATTACHMENT_CORRUPT)`` naming the first check that failed, never the
    bytes. A hash and a header parse, in proportion to the size: off the event loop when large."""
    def corrupt(why: str) -> AttachmentError:
        return AttachmentError(CORRUPT, f"{CORRUPT}: {short_id(attachment_id)} {why}", attachment_id=attachment_id)

    if ID_PREFIX + hashlib.sha256(data).hexdigest() != attachment_id:
        raise corrupt("content does not match its digest")
    if len(data) != record.bytes:
        raise corrupt(f"size {len(data)} disagrees with its record ({record.bytes})")
    try:
        info = header_info(data)
    except ImageRejected:
        raise corrupt("image header cannot be parsed") from None
    if info.media_type != record.media_type:
        raise corrupt(f"media type {info.media_type} disagrees with its record")
    if (info.width, info.height) != (record.width, record.height):
        raise corrupt(f"dimensions {info.width}x{info.height} disagree with its record")
    return StoredImage(id=attachment_id, media_type=info.media_type, bytes=len(data), width=info.width,
                       height=info.height, data=data)
