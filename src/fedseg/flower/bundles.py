"""Which Flower App Bundles (FABs) a site runs: fedseg's own app, nothing else (issue 28).

Flower 1.41's Control API starts a run with any FAB, and a SuperNode runs that FAB's ClientApp
unverified. Flower's own check (``flower-supernode --trusted-entities``) passes only FABs that the
SuperLink marked ``valid_license`` and signed, which the open-source SuperLink does for Flower Hub
apps only: a FAB submitted with its content, as fedseg submits its app, can never pass it.

fedseg's check instead: fedseg's FAB (``fedseg.flower.apps.build_fab``) is deterministic -- a
``pyproject.toml`` (name, fedseg's version, the ServerApp's default config) and a one-line module
naming ``fedseg.flower.apps.client_app``; a run's own config travels beside it (``StartRun``'s override
config), not in it. So a site pins the SHA-256 of the FAB its own installed fedseg builds, and its
ClientApp runner (``fedseg.flower.worker``, in every isolation) accepts a task only if the task's FAB
has exactly these bytes; it then runs ``fedseg.flower.apps.client_app``, the ClientApp that FAB names.
No FAB is installed or imported on a site. Any other FAB -- another app, a modified fedseg app, fedseg's
app of another version -- is refused before anything of it runs: one log line on the site (run id, FAB
hash, why) and an error reply that the run's ServerApp receives. Its ``pyproject.toml`` is read as data
(zip + TOML) only to say what it is.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tomllib
import zipfile

import fedseg
from fedseg.flower.log_text import printable

APP = "fedseg/fedseg-flower"  # publisher/name of fedseg's app (``fedseg.flower.apps.pyproject``)
MAX_PYPROJECT = 1 << 20  # bytes of a foreign pyproject.toml read to name it (a zip may inflate a lot)


class BundleRefused(RuntimeError):
    """A run's app bundle is not fedseg's app: its ClientApp is never run on this site."""


@functools.cache
def pinned_hash() -> str:
    """SHA-256 (hex) of the one FAB this site runs: fedseg's app as this site's fedseg builds it."""
    from fedseg.flower.apps import build_fab

    return hashlib.sha256(build_fab()).hexdigest()


def bundle_name(content: bytes) -> str | None:
    """``publisher/name version`` from the FAB's ``pyproject.toml``, read as data; ``None`` if unreadable."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as fab:
            if fab.getinfo("pyproject.toml").file_size > MAX_PYPROJECT:
                return None
            config = tomllib.loads(fab.read("pyproject.toml").decode())
        project, app = config["project"], config["tool"]["flwr"]["app"]
        name = f"{app['publisher']}/{project['name']} {project['version']}"
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, UnicodeDecodeError):
        return None
    return printable(" ".join(name.split()))[:120]  # one line, whatever the bundle says


def refusal(content: bytes, who: str = "this site") -> str | None:
    """Why ``who`` (a site, or the coordinator, which runs a run's ServerApp: ``fedseg.flower.serverapp_runner``)
    refuses a FAB with ``content``; ``None`` for fedseg's own app."""
    if hashlib.sha256(content).hexdigest() == pinned_hash():
        return None
    name, ours = bundle_name(content), f"{APP} {fedseg.__version__}"
    if name is None:
        return "it is not a readable Flower app bundle"
    if name == ours:
        return f"it claims to be {ours} but differs from the one {who}'s fedseg builds (modified)"
    if name.startswith(APP + " "):
        return f"it is fedseg's app of another version ({name}); {who} runs {ours}: install the same version"
    return f"it is not fedseg's app ({name})"


def check_bundle(run_id: int, content: bytes, who: str = "this site") -> None:
    """Raise ``BundleRefused`` (one line: run id, FAB hash, why) unless ``content`` is fedseg's own app."""
    why = refusal(content, who)
    if why is not None:
        digest = hashlib.sha256(content).hexdigest()
        raise BundleRefused(
            f"run {run_id} refused: its app bundle (FAB sha256 {digest}) is not the one {who} runs "
            f"(fedseg's own, sha256 {pinned_hash()}): {why}"
        )
