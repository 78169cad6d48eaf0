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
    """The mapping in ``path`` (``parse``: ``json.loads``; YAML: :func:`read_yaml`); ``error`` naming ``path`` when
    it is missing (``holds``: what its folder holds, for the message), unreadable or not valid, or not a mapping
    (``expected``: what it should be, e.g. "a JSON object with labels and training")."""
    if path.is_dir():
        raise error(f"{path}: is a folder, not a file ({holds})")
    if not path.is_file():
        raise error(f"{path}: missing ({holds})")
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except error:  # parse's own line, naming the file (read_yaml)
        raise
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:  # ValueError: JSONDecodeError
        raise error(f"{path}: cannot read ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected {expected}, got {type(data).__name__}")
    return data


def read_yaml(path: Path, holds: str, expected: str, error: type[Exception] = FederationError) -> dict:
    """:func:`read_mapping` of a YAML file, parsed as configs and bench files are
    (``fedseg.config_load.read_yaml_mapping``): a key given twice in one mapping, which YAML would let the last value
    win silently, is refused with one line naming the file, the key and its lines, as are YAML that is not valid, an
    empty file and another top level."""
    from fedseg.config_load import ConfigError, read_yaml_mapping

    def parse(text: str) -> dict:
        try:
            return read_yaml_mapping(text, str(path), empty=f"empty; expected {expected}")
        except ConfigError as e:
            raise error(str(e)) from None

    return read_mapping(path, holds, expected, error, parse)
