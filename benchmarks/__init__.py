"""raypeft's benchmarks: each study runs from the repository root as
``python -m benchmarks.<folder>.<study>`` (``--help`` lists its flags); benchmarks/README.md
lists them.

:mod:`benchmarks.common` holds what the studies share (the resumable results file, tables,
the machine line, timing, process runners, whole searches, the tiny search, servers); each
folder holds the studies of one subject (:mod:`~benchmarks.scale`, :mod:`~benchmarks.search`,
:mod:`~benchmarks.device`, :mod:`~benchmarks.fidelity`, :mod:`~benchmarks.synetune`, and the
one-offs of a month, :mod:`~benchmarks.oneoff_2026_11`). A study imports benchmarks.common,
raypeft and its own folder's modules, never another folder's (an import-linter contract).
``benchmarks/results/`` is data (measured results), not code. The benchmarks call raypeft's
own functions; raypeft never imports them.
"""
