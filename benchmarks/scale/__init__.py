"""The platform's own cost, measured with zero-time replayed trials or beside real ones: per
trial from 10 to 1,000 trials (:mod:`~benchmarks.scale.platform_overhead`), the commands a user
runs after a 1,000-trial search (:mod:`~benchmarks.scale.after_search`), MLflow's system
metrics (:mod:`~benchmarks.scale.system_metrics_overhead`). Re-run each release; results in
``benchmarks/results/`` (docs/performance.md, docs/serving.md).
"""
