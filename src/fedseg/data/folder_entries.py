"""Folder entries that are no data, skipped wherever a folder of cases or slices is listed (``ignored_entry``): by
the folder readers (``fedseg.data.folder``, the importers), a DICOM series' slices (``fedseg.data.dicom_series``),
``fedseg predict``'s inputs and the record of the data a run keeps. Standard library only."""

from __future__ import annotations

OS_JUNK_FILES = frozenset({"thumbs.db", "ehthumbs.db", "desktop.ini"})  # Windows Explorer's, as .DS_Store is macOS'


def ignored_entry(name: str) -> bool:
    """Whether a folder entry named ``name`` is no data and is skipped wherever a folder of cases or slices is
    listed: hidden (a name starting with ``.``: macOS' ``.DS_Store`` and ``._*``), or a file that Windows Explorer
    leaves in folders it shows (``Thumbs.db``, ``ehthumbs.db``, ``desktop.ini``; any case)."""
    return name.startswith(".") or name.lower() in OS_JUNK_FILES
