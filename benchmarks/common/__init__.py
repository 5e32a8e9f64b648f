"""What every benchmark shares, one concern per module; import the module you need (this
package imports none of them, so a report that needs no torch loads none):

- :mod:`~benchmarks.common.tables`: markdown tables (tabulate), the one table formatter;
- :mod:`~benchmarks.common.machine`: the machine's load beside each timing, its CPU's name;
- :mod:`~benchmarks.common.timing`: interleaved timings and their ratios;
- :mod:`~benchmarks.common.devices`, :mod:`~benchmarks.common.memory`: the device a
  benchmark runs on, synchronising it, peak memory;
- :mod:`~benchmarks.common.processes`: measuring processes started together, a benchmark's
  own hidden worker in a fresh interpreter;
- :mod:`~benchmarks.common.training`: one training step as the training loop takes it;
- :mod:`~benchmarks.common.searches`: one whole search, timed, with its phases.
- :mod:`~benchmarks.common.servers`: real PostgreSQL, S3 and MLflow servers on loopback
  (the tests start them too, through tests/servers.py).
"""
