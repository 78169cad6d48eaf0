"""Reading a dataset's JSON description (MSD's and nnU-Net's ``dataset.json``) with one clear error line."""

from __future__ import annotations

import json
from pathlib import Path

from fedseg.data.federation import FederationError


def read_json_object(path: Path, holds: str, expected: str) -> dict:
    """The JSON object in ``path``; ``FederationError`` naming ``path`` when it is missing (``holds``: what the
    dataset folder holds, for the message), unreadable, or not an object (``expected``: the keys it should have)."""
    if not path.is_file():
        raise FederationError(f"{path}: missing ({holds})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise FederationError(f"{path}: expected a JSON object with {expected}")
    return data
