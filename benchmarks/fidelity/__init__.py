"""The fidelity study: PT, DePT, M-IDPG-PHM and IPT at one trainable-parameter budget on real
tasks (``python -m benchmarks.fidelity --help``; docs/fidelity.md).

:mod:`~benchmarks.fidelity.cli` (the command, its worker pool and results file) ·
:mod:`~benchmarks.fidelity.plan` (what runs, in which order; no torch) ·
:mod:`~benchmarks.fidelity.report` (its markdown tables from the results file; no torch) ·
:mod:`~benchmarks.fidelity.worker` (one run, in a worker process).
"""
