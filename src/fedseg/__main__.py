"""``python -m fedseg``: the ``fedseg`` command (:func:`fedseg.command.entry`), for a notebook or script whose
``PATH`` does not hold the environment's ``bin/`` (a Jupyter kernel started without activating it)."""

from fedseg.command import entry

if __name__ == "__main__":
    entry()
