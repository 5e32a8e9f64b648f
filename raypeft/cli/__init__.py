"""The command line: one module per command group, thin wrappers over the library.

``main`` is the click group (the ``raypeft`` entry point); ``options`` holds what several
commands share (``--tracking-uri``, the one-line failure, quieting libraries). Heavy imports stay
inside the command functions so ``raypeft --help`` answers in a fraction of a second.
"""
