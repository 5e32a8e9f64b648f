"""The loop every trial runs, whatever runs it (Tune, Ray Train, a test, a benchmark).

It reports through a callback and knows nothing of Ray, MLflow or Optuna, so it runs on a
machine with only torch, transformers and pydantic.
"""
