"""fedseg's Flower app: one ``ServerApp`` and one ``ClientApp`` for every fedseg algorithm.

- ``server_app``: its main function runs the whole experiment over the ``Grid``
  (``fedseg.flower.server.serve``); the algorithm's Server talks to a ``FlowerEngine``.
- ``client_app``: ``train.<action>`` and ``evaluate.<action>`` messages go to the fedseg Client
  of the run's algorithm (actions are the algorithms' own names, e.g. ``train.train``,
  ``train.loss``, ``train.install``, ``evaluate.evaluate``, ``evaluate.share_model``); the
  engine's own messages are named query actions (``query.info``, ``query.snapshot``,
  ``query.restore``, ``query.refused``). See ``fedseg.flower.node``.

``build_fab()`` bundles them as a Flower App Bundle (a ``pyproject.toml`` and a one-line
module importing this one): what ``flwr run`` would submit. fedseg itself is not inside the
FAB -- every SuperNode and the SuperLink's machine have it installed (same version; checked),
and per-run dependency installation is off.
"""

from __future__ import annotations

import json
import threading

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

import fedseg
from fedseg.flower import node

MODULE = "fedseg_flower_app"  # the FAB's module
DEFAULT_ACTION = "default"  # Flower's action of a bare "train" / "evaluate" (ClientApp.train's default)


_REGISTERING = threading.Lock()  # module-level: the app itself is pickled to Ray actors (simulation runtime)


class FedsegClientApp(ClientApp):
    """A ``ClientApp`` whose train/evaluate messages of any action name reach the fedseg Client;
    query actions are registered with ``@client_app.query(name)`` as usual.

    Flower routes a message to the function registered for its ``<category>.<action>``, and fedseg's
    actions are the algorithms' own names (any algorithm may add one), so a train or evaluate action
    is registered -- with Flower's ``@app.train(action)`` / ``@app.evaluate(action)`` -- when its first
    message arrives; Flower then calls it as any registered function (mods, lifespan)."""

    def __init__(self) -> None:
        super().__init__()
        self._algorithm_actions: set[str] = set()

    def __call__(self, message: Message, context: Context) -> Message:
        category, _, action = message.metadata.message_type.partition(".")
        register = {"train": self.train, "evaluate": self.evaluate}.get(category)
        name = f"{category}.{action or DEFAULT_ACTION}"  # "train" is Flower's "train.default"
        if register is not None and name not in self._algorithm_actions:
            with _REGISTERING:
                if name not in self._algorithm_actions:
                    register(action or DEFAULT_ACTION)(algorithm_message)
                    self._algorithm_actions.add(name)
        return super().__call__(message, context)


def algorithm_message(message: Message, context: Context) -> Message:
    """A ``train.<action>`` or ``evaluate.<action>`` message: the algorithm's Client answers it."""
    return node.handle(message, context)


client_app = FedsegClientApp()
server_app = ServerApp()


def local_dp_mod(message: Message, context: Context, call_next) -> Message:
    """``fedseg.flower.secure.local_dp_mod`` (imported on use: queries never load PyTorch)."""
    from fedseg.flower.secure import local_dp_mod as mod

    return mod(message, context, call_next)


@client_app.train(mods=[secaggplus_mod, local_dp_mod])
def secure_train(message: Message, context: Context) -> Message:
    """A bare ``train`` message is a stage of SecAgg+ (``fl.secure_aggregation``; fedseg's own training
    messages are ``train.<action>``): Flower's ``secaggplus_mod`` answers the key stages itself and calls this
    for the masked-vector stage (``fedseg.flower.secure.site_train``), through Flower's ``LocalDpMod`` when
    ``fl.local_dp`` is set (``fedseg.flower.secure.local_dp_mod``)."""
    from fedseg.flower.secure import site_train

    return site_train(message, context)


client_app._algorithm_actions.add(f"train.{DEFAULT_ACTION}")  # registered above: not an algorithm action


@client_app.query(node.INFO)
def info(message: Message, context: Context) -> Message:
    return node.handle(message, context)


@client_app.query(node.SNAPSHOT)
def snapshot(message: Message, context: Context) -> Message:
    return node.handle(message, context)


@client_app.query(node.RESTORE)
def restore(message: Message, context: Context) -> Message:
    return node.handle(message, context)


@client_app.query(node.REFUSED)
def refused(message: Message, context: Context) -> Message:
    return node.handle(message, context)


@client_app.query(node.RELEASE)
def release(message: Message, context: Context) -> Message:
    return node.handle(message, context)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    from fedseg.flower.server import serve

    serve(grid, dict(context.run_config))


def pyproject() -> str:
    from fedseg.flower.server import DEFAULTS

    config = "\n".join(f'"{k}" = {json.dumps(v)}' for k, v in DEFAULTS.items())  # JSON scalars are TOML scalars
    return f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedseg-flower"
version = "{fedseg.__version__}"
description = "fedseg algorithms on Flower: one ServerApp and one ClientApp for every algorithm"
license = "Apache-2.0"
dependencies = ["flwr==1.41.0"]

[tool.flwr.app]
publisher = "fedseg"

[tool.flwr.app.components]
serverapp = "{MODULE}:server_app"
clientapp = "{MODULE}:client_app"

[tool.flwr.app.config]
{config}
"""


def build_fab() -> bytes:
    """The Flower App Bundle of fedseg's app (bytes, as ``flwr build`` writes them)."""
    from fedseg.flower.flwr_internals import build_fab as build

    return build(
        {
            "pyproject.toml": pyproject().encode(),
            # assignments, not an import: Flower's simulation runtime finds the apps by reading this file's syntax
            f"{MODULE}.py": b'"""fedseg on Flower (see fedseg.flower.apps)."""\n'
            b"from fedseg.flower import apps\n\nclient_app = apps.client_app\nserver_app = apps.server_app\n",
        }
    )
