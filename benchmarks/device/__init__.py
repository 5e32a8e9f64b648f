"""What trials get out of one device: a training step per method and precision
(:mod:`~benchmarks.device.gpu_step`); packs of K trials on one backbone against K trials
sharing the device (:mod:`~benchmarks.device.packing`), the operators a pack step dispatches
(:mod:`~benchmarks.device.pack_dispatch`) and a whole search packed
(:mod:`~benchmarks.device.packing_search`); where a trial's seconds go
(:mod:`~benchmarks.device.trial_phases`); and a lent GPU's run of them in one go
(:mod:`~benchmarks.device.gpu_run`, started by scripts/on-device.sh).
:mod:`~benchmarks.device.steps` holds what the step benchmarks share; like them it imports
only torch, transformers, pydantic and raypeft's training core, so it runs on a GPU machine
that has nothing else. docs/performance.md, docs/packing.md.
"""
