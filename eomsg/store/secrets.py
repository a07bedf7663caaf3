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
import os
from pathlib import Path
from typing import Any

from eomsg.errors import DataDirError
from eomsg.store.files import PRIVATE_FILE, owner_only, sync

NAME = "link-secrets.json"


def load(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Every link's secrets, by peer; empty when there are none. DataDirError if the
    file is there but cannot be read."""
    path = data_dir / NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise DataDirError(f"cannot read {path}: {e.strerror}") from e
    owner_only(path)
    try:
        found = json.loads(text)
    except ValueError as e:
        raise DataDirError(f"{path} is not JSON ({e}); restore it or remove the links") from e
    if not isinstance(found, dict):
        raise DataDirError(f"{path} does not hold a JSON object")
    return found


def save(data_dir: Path, secrets: dict[str, dict[str, Any]]) -> None:
    """Replace the file with ``secrets``, durably and atomically."""
    path = data_dir / NAME
    fresh = data_dir / (NAME + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        json.dump(secrets, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)
    sync(data_dir)
