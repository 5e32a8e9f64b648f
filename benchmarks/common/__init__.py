"""What every benchmark shares, one concern per module; import the module you need (this
package imports none of them, so a report that needs no torch loads none):

- :mod:`~benchmarks.common.results`: the resumable results file (JSON lines, a row on disk
  as each measurement ends, what is stored skipped on a resumed run) every study appends to;
- :mod:`~benchmarks.common.paths`: the repository, its results folder, a file's digest;
- :mod:`~benchmarks.common.tables`: markdown tables (tabulate), the one table formatter;
- :mod:`~benchmarks.common.machine`: the machine's load beside each timing, its CPU's name;
- :mod:`~benchmarks.common.timing`: interleaved timings and their ratios;
- :mod:`~benchmarks.common.devices`, :mod:`~benchmarks.common.memory`: the device a
  benchmark runs on, synchronising it, peak memory;
- :mod:`~benchmarks.common.processes`: measuring processes started together, a benchmark's
  own hidden worker in a fresh interpreter;
- :mod:`~benchmarks.common.training`: one training step as the training loop takes it;
- :mod:`~benchmarks.common.searches`: one whole search, timed, with its phases;
- :mod:`~benchmarks.common.tiny_search`: the tiny search the tests train and the scale studies
  replay in zero time (its recorded 10 x 10 table);
- :mod:`~benchmarks.common.servers`: real PostgreSQL, S3 and MLflow servers on loopback
  (the tests start them too, through tests/servers.py).
"""
