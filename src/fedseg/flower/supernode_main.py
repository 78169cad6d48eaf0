"""``python -m fedseg.flower.supernode_main [flower-supernode args]``: Flower's ``flower-supernode``,
optionally with shorter waits.

With ``FEDSEG_FLOWER_NODE_POLL=<seconds>`` set, the SuperNode's idle polling (3 s) and its
object-pull backoff (1 s doubling to 10 s) start at that value (``fedseg.flower.flwr_internals``);
everything else is the unmodified ``flower-supernode``. Worth it on a LAN or loopback, where a
poll costs microseconds; on a WAN with many sites, Flower's defaults keep the SuperLink's load low.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib.metadata import distribution

from fedseg.flower.flwr_internals import cap_node_polling, cap_object_pull_backoff, show_log_timestamps


def flower_supernode_command() -> Callable[[], object]:
    """The function behind Flower's ``flower-supernode`` command, found as the command finds it (flwr's
    console-script entry point), so that it runs in this process, after the patches above."""
    (entry,) = distribution("flwr").entry_points.select(group="console_scripts", name="flower-supernode")
    return entry.load()


def main() -> None:
    poll = os.environ.get("FEDSEG_FLOWER_NODE_POLL")
    if poll:
        cap_node_polling(float(poll))
        cap_object_pull_backoff(float(poll))
    flower_supernode = flower_supernode_command()
    show_log_timestamps()  # a site's log is read later, next to the coordinator's

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
