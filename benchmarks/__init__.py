"""raypeft's benchmarks: each study runs from the repository root as
``python -m benchmarks.<study>`` (``--help`` lists its flags).

:mod:`benchmarks.common` holds what the studies share (tables, load notes, timing, process
runners, whole searches); a study of several files has a folder of its own
(:mod:`benchmarks.fidelity`). ``benchmarks/results/`` is data (measured results), not code.
The benchmarks call raypeft's own functions; raypeft never imports them.
"""
