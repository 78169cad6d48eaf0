"""Drawing a page's figures aside, so that a failed or interrupted render leaves the previous page and figures.

A page (``report.html``) and its ``figures/*.png`` are drawn again by every ``fedseg report``. Drawing straight into
``figures/`` would leave a run with some figures deleted or replaced and the old page when a file turns out to be
damaged halfway, the disk fills up, or Ctrl-C comes. Instead:

* :func:`figure_draft` gives an empty hidden folder beside ``figures/`` (``.figures-*``) to draw into, and
  removes it when the render ends, however it ends;
* :func:`~fedseg.presentation.kit.write_page` (its ``drawn`` argument) embeds the figures from there, writes
  the page, then :func:`replace_figures` moves them into ``figures/`` (whose PNGs not drawn again are deleted);
  the two steps run under ``fedseg.interrupts.deferred_interrupts``, so a Ctrl-C or SIGTERM meanwhile acts just
  after them: the folder holds either the old page and figures or the new ones.

A stop signal's ``KeyboardInterrupt`` raised while the garbage collector runs a finalizer (matplotlib drops many
objects while drawing) is printed as "Exception ignored in ..." and dropped by Python: the render would go on and
the command end with status 0. :func:`figure_draft` therefore also notes every stop signal
(``fedseg.interrupts.interrupts_noted``): one that was dropped so is raised again when the render ends, without the
print, and no page is written after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fedseg.atomic_files import fsync_dir
from fedseg.interrupts import interrupts_noted

__all__ = ["figure_draft", "replace_figures"]


@contextlib.contextmanager
def figure_draft(root: str | Path) -> Iterator[Path]:
    """A new empty folder ``root/.figures-*`` to draw a page's figures into; deleted with what is left in it when
    the block ends (after :func:`replace_figures`, nothing is). The block runs under :func:`interrupts_noted`."""
    draft = Path(tempfile.mkdtemp(prefix=".figures-", dir=root))
    try:
        with interrupts_noted():
            yield draft
    finally:
        shutil.rmtree(draft, ignore_errors=True)


def replace_figures(drawn: Path, folder: Path) -> None:
    """Move every PNG of ``drawn`` into ``folder`` (created if there is one), replacing those of the same name, and
    delete the PNGs of ``folder`` not drawn this time (none survives from an earlier render); other files are kept.
    Renames within one file system: no new data is written, so a full disk cannot stop it halfway."""
    new = {p.name for p in drawn.glob("*.png")}
    if not new and not folder.is_dir():
        return
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.png"):
        if old.name not in new:
            old.unlink(missing_ok=True)
    for name in sorted(new):
        os.replace(drawn / name, folder / name)
    fsync_dir(folder)
