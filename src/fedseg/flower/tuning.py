"""Shorter waits inside Flower (flwr 1.41) for low-latency links; off unless a poll interval is given.

Flower's deployment runtime is built for many sites on slow links: between "a message exists"
and "its payload is there" every component waits with fixed sleeps. Measured on loopback
(``benchmarks/flower_overhead.py``), these waits, not the work, dominate a tiny round:

- a SuperNode asks the SuperLink for new messages every **3 s** when idle, and checks for its
  ClientApp's reply every 0.5 s (``time.sleep`` calls in ``flwr.supernode.start_client_internal``);
- whoever pulls a message's objects (arrays) before the sender has finished pushing them
  backs off **1 s, 2 s, 4 s ... (cap 10 s)** per object (``pull_objects`` /
  ``pull_and_inflate_object_from_tree`` in ``flwr.supercore.inflatable.inflatable_utils``):
  a site starting on a message as soon as it appears, or the server collecting a reply, hits
  this nearly every time;
- a SuperExec looks for new tasks every 1 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, an official
  setting: ``fedseg.flower.deploy.flower_env`` sets it) and ``Grid.send_and_receive`` every 3 s
  (fedseg's engine has its own loop, ``fedseg.flower.engine.Courier``).

``cap_node_polling`` and ``cap_object_pull_backoff`` shorten the first two in the calling
process (they replace a module's ``time`` and two functions' keyword defaults; nothing else of
Flower changes). fedseg applies them in its SuperNode wrapper and warm worker when ``--poll``
is given, and in its ServerApp.
"""

from __future__ import annotations

import time
import types


def cap_node_polling(seconds: float) -> None:
    """Cap every ``time.sleep`` of the SuperNode's main loop at ``seconds``."""
    import flwr.supernode.start_client_internal as loop

    capped = types.ModuleType("time")
    capped.__dict__.update(time.__dict__)
    capped.sleep = lambda s: time.sleep(min(s, seconds))
    loop.time = capped


def cap_object_pull_backoff(seconds: float, cap: float = 1.0) -> None:
    """Retry an unavailable object after ``seconds`` (doubling up to ``cap``) instead of 1 s (up to 10 s);
    the number of tries is raised so the total patience (up to Flower's 2 h limit) stays as long."""
    from flwr.supercore.inflatable import inflatable_utils as iu

    for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        fn.__kwdefaults__.update(initial_backoff=seconds, backoff_cap=max(cap, seconds),
                                 max_tries_per_object=int(1e6))
