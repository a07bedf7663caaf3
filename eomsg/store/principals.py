"""The hashes of the principals' tokens: ``DIR/principals.json`` (owner-only), apart from
the store so that nothing that reads the store — ``inspect sql``, a replay, a salvaged
copy — can reach them.

A token is 32 random bytes: its SHA-256 is as good as any slow password hash against
guessing (there is nothing to guess), and it lets the node find the principal of a token
with one dictionary lookup. The store says who exists (its ``principals`` table, written
with the audit record of the change); this file only keeps the hashes. Adding writes the
hash here first, removing drops it here last: a hash whose principal the store does not
know is left over from a crash between the two writes, and ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eomsg.errors import DataDirError
from eomsg.store.files import read_json_object, replace_file

NAME = "principals.json"


def token_digest(token: str) -> str:
    """The hex SHA-256 of ``token`` as kept (a token is random: no salt or stretching)."""
    return hashlib.sha256(token.encode()).hexdigest()


def load(data_dir: Path) -> dict[str, str]:
    """Each principal's token digest, by name; empty when there is no file. DataDirError
    if it is there but cannot be read."""
    path = data_dir / NAME
    remedy = "restore it, or remove and add the principals again"
    found = read_json_object(path, remedy)
    if not all(isinstance(v, str) for v in found.values()):
        raise DataDirError(f"{path} does not map names to digests; {remedy}")
    return found


def save(data_dir: Path, digests: dict[str, str]) -> None:
    """Replace the file with ``digests``, durably and atomically."""
    replace_file(data_dir / NAME, json.dumps(digests, sort_keys=True))
