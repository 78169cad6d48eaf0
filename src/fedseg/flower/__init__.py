"""fedseg on a real Flower (flwr 1.41) deployment: the same algorithm code, another engine.

- ``apps``: the ServerApp and ClientApp (and the FAB ``flwr run`` would submit);
- ``engine``: ``FlowerEngine``, the simulator's interface over Flower's ``Grid`` (server side);
- ``node``: what the ClientApp does with a message (site data, ``Context.state``, queries);
- ``records``: fedseg ``Message`` <-> Flower ``RecordDict``, exactly;
- ``server``: the ServerApp's main: the whole experiment through ``fedseg.run``;
- ``launch`` / ``deploy``: SuperLink and SuperNode processes, Control API (``fedseg flower ...``);
- ``superlink`` / ``superlink_main``: the SuperLink's command line and its two listeners (Fleet API only; the
  Control API only with the coordinator's key);
- ``certs``: CA, SuperLink certificate and SuperNode keys;
- ``worker`` / ``serverapp_runner``: the task runners of a site (ClientApp) and of the coordinator (ServerApp),
  their common part in ``task_runner``; ``runtime_secret``: the secret and tokens they are handed on stdin;
- ``flwr_internals``: what fedseg takes from Flower where it has no public API (shorter waits inside Flower among
  them); ``cli``: the ``fedseg flower`` commands.
"""

from fedseg import lean_monai

lean_monai.install()  # every Flower process fedseg starts (apps, warm worker, SuperNode) imports this package first
