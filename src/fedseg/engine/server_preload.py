"""The worker pool's process server imports this module first (``fedseg.engine.forkserver.PRELOAD``): it installs
``fedseg.lean_monai``'s import hook before the server imports MONAI, so the server and every worker forked from it
skip MONAI's unused optional integrations, as the ``fedseg`` command does."""

from fedseg import lean_monai

lean_monai.install()
