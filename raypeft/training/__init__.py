"""The loop every trial runs, whatever runs it (Tune, Ray Train, a test, a benchmark).

It reports through a callback and knows nothing of Ray, MLflow or Optuna, so it runs on a
machine with only torch, transformers and pydantic.

``loop`` (:func:`~raypeft.training.loop.train`, read it first) · ``datasets`` (a task's splits
as tensors, the method's features) · ``sampler`` (global batches, shared by DDP workers) ·
``optimizer`` (AdamW per parameter group, warm-up schedule) · ``evaluation`` (metrics of a split,
which evaluation is the best) · ``checkpoints`` (what a reported checkpoint holds) · ``resume``
(resumable state) · ``distributed`` (what DDP workers agree on) · ``pack`` (several trials on
one backbone, one forward pass for all) · ``efficiency`` (throughput, memory) · ``result_keys``
(result keys that are not metrics).
"""
