"""Reading a small structured file (a federation's ``federation.yaml``, a dataset's ``dataset.json``, a model
bundle's ``manifest.json``) that must hold a mapping, with one clear error line naming the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fedseg.data.federation import FederationError


def read_mapping(
    path: Path,
    holds: str,
    expected: str,
    error: type[Exception] = FederationError,
    parse: Callable[[str], Any] = json.loads,
) -> dict:
    """The mapping in ``path`` (``parse``: ``json.loads``, or ``yaml.safe_load``); ``error`` naming ``path`` when
    it is missing (``holds``: what its folder holds, for the message), unreadable or not valid, or not a mapping
    (``expected``: what it should be, e.g. "a JSON object with labels and training")."""
    if path.is_dir():
        raise error(f"{path}: is a folder, not a file ({holds})")
    if not path.is_file():
        raise error(f"{path}: missing ({holds})")
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:  # ValueError: JSONDecodeError
        raise error(f"{path}: cannot read ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected {expected}, got {type(data).__name__}")
    return data
