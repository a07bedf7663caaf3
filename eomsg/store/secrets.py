"""The data directory's secrets file: what a node must keep but nobody may read back
through it — the token it presents to each linked node it dials, and the key (a
token's hash) it accepts from each that dials it.

They are kept apart from the store, in ``DIR/link-secrets.json`` (owner-only), so that
nothing that reads the store — ``inspect sql``, a replay, a salvaged copy — can reach
them. The file is replaced whole, durably (written beside, synced, renamed, the
directory synced): a crash leaves the old one or the new one, never a mix. A secret
whose link the store does not know is left over from a crash between the two writes,
and ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eomsg.store.files import read_json_object, replace_file

NAME = "link-secrets.json"


def load(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Every link's secrets, by peer; empty when there are none. DataDirError if the
    file is there but cannot be read."""
    return read_json_object(data_dir / NAME, "restore it or remove the links")


def save(data_dir: Path, secrets: dict[str, dict[str, Any]]) -> None:
    """Replace the file with ``secrets``, durably and atomically."""
    replace_file(data_dir / NAME, json.dumps(secrets, sort_keys=True))
