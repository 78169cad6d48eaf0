"""fedseg on a real Flower (flwr 1.41) deployment: the same algorithm code, another engine.

- ``apps``: the ServerApp and ClientApp (and the FAB ``flwr run`` would submit);
- ``engine``: ``FlowerEngine``, the simulator's interface over Flower's ``Grid`` (server side);
- ``node``: what the ClientApp does with a message (site data, ``Context.state``, queries);
- ``records``: fedseg ``Message`` <-> Flower ``RecordDict``, exactly;
- ``server``: the ServerApp's main: the whole experiment through ``fedseg.run``;
- ``launch`` / ``deploy``: SuperLink and SuperNode processes, Control API (``fedseg flower ...``);
- ``certs``: CA, SuperLink certificate and SuperNode keys; ``worker``: the warm ClientApp worker;
- ``tuning``: shorter waits inside Flower for low-latency links; ``cli``: the ``fedseg flower`` commands.
"""

from fedseg import lean_monai

lean_monai.install()  # every Flower process fedseg starts (apps, warm worker, SuperNode) imports this package first
