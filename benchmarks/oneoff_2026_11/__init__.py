"""One-off studies of November 2026, each behind one table of the docs, kept runnable as they
were; not re-run each release. A study here imports only :mod:`benchmarks.common` and raypeft.

- :mod:`~benchmarks.oneoff_2026_11.idpg_cache`: IDPG's sentence encodings cached once
  against computed every step (docs/measured.md, docs/methods.md).

The other one-offs of that month were removed, their tables kept as recorded results
(benchmarks/README.md says where each lives and the commit that last held its code).
"""
