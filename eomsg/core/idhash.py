"""The hash of a publish id: one rule for the store's ``publish_ids.h`` column, the dedup
window's runs (:mod:`eomsg.core.idruns`) and the spill file, kept apart from both so that
code hashing an id loads neither numpy nor Arrow."""

from __future__ import annotations

import zlib


def id_hash(msg_id: str) -> int:
    """The 32-bit hash the store keeps beside each publish id and
    :class:`~eomsg.core.idruns.RetainedIds` are sorted by: CRC-32 of its UTF-8 bytes, the
    same in every process and version. Two ids may share one; a match is always confirmed
    on the id itself."""
    return zlib.crc32(msg_id.encode("utf-8", "surrogatepass"))
