"""Bad input: keys and types, the method's name, the search space, scheduler, sampler,
objectives and the training loop (what the schema rejects).

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

import pytest

from .helpers import Case, exp, ids, run_in_process

CASES: list[Case] = [
    # ---- keys and types
    Case("unknown-top-level-key", exp(bogus=1), ("exp.yaml: bogus: unknown key", "the keys there")),
    Case(
        "unknown-nested-key",
        exp(search={"scheduler": {"type": "asha", "grace": 1}}),
        ("search.scheduler.grace: unknown key", "did you mean search.scheduler.grace_period"),
        in_process=True,
    ),
    Case(
        "typo-suggests-the-key",
        exp(train__max_stepz=30),
        ("train.max_stepz: unknown key", "did you mean train.max_steps?"),
    ),
    Case(
        "typo-in-a-method-knob",
        exp(method={"name": "dept", "prompt_lenght": 4, "budget_prompt_length": 10}),
        ("method.prompt_lenght: unknown key", "did you mean method.prompt_length"),
    ),
    Case(
        "string-for-int",
        exp(train__max_steps="many"),
        ("train.max_steps", "must be an integer", "'many'"),
    ),
    Case("list-for-mapping", exp(model=["tiny-bert"]), ("model", "must be a mapping")),
    Case(
        "fraction-for-int",
        exp(train__batch_size=2.5),
        ("train.batch_size", "must be an integer", "2.5"),
    ),
    Case(
        "unknown-method", exp(method={"name": "lora"}), ("method", "unknown method 'lora'", "'pt'")
    ),
    Case(
        "init-text-without-text",
        exp(method={"name": "pt", "prompt_length": 4, "init": "text"}),
        ("method.init_text", "init: text needs a non-empty `init_text`", "it is not set"),
        in_process=True,
    ),
    Case(
        "init-text-blank",
        exp(
            method={
                "name": "dept",
                "prompt_length": 4,
                "budget_prompt_length": 10,
                "init": "text",
                "init_text": "  ",
            }
        ),
        ("method.init_text", "init: text needs a non-empty `init_text`", "got '  '"),
    ),
    Case(
        "unknown-lowrank-init",
        exp(method={"name": "dept", "prompt_length": 4, "rank": 2, "lowrank_init": "lora"}),
        ("method.lowrank_init", "must be one of 'official' or 'paper'", "'lora'"),
    ),
    Case(
        "method-without-name",
        exp(method={"prompt_length": 4}),
        ("method", "must name the method", "pt"),
    ),
    # ---- the search space
    Case(
        "grid-and-distribution-on-one-key",
        exp(space={"method.lr": {"grid": [0.1], "loguniform": [0.01, 0.1]}}),
        ("`method.lr` must have exactly one of", "['grid', 'loguniform']"),
    ),
    Case(
        "space-key-names-no-field",
        exp(space={"method.learning_rate": {"choice": [0.1, 0.2]}}),
        ("space.method.learning_rate", "unknown key, not a config field"),
    ),
    Case(
        "space-key-not-searchable",
        exp(space={"model.max_length": {"choice": [16, 32]}}),
        ("space.model.max_length", "only method, methods.<name>, train and budget_params"),
    ),
    Case(
        "empty-choice",
        exp(space={"train.batch_size": {"choice": []}}),
        ("space.train.batch_size.choice", "must have at least 1 item"),
    ),
    Case(
        "loguniform-low-zero",
        exp(space={"method.lr": {"loguniform": [0, 0.1]}}),
        ("space.method.lr", "`0 < low` must hold"),
    ),
    Case(
        "uniform-low-above-high",
        exp(space={"method.lr": {"uniform": [0.5, 0.1]}}),
        ("space.method.lr.uniform", "`low <= high` must hold"),
    ),
    Case(
        "int-step-not-fitting",
        exp(space={"method.prompt_length": {"int": [2, 9], "step": 2}}),
        ("space.method.prompt_length.int", "`(high - low) % step == 0` must hold"),
    ),
    Case(
        "space-value-invalid-for-the-field",
        exp(space={"train.batch_size": {"choice": [4, 0]}}),
        ("train.batch_size", "must be >= 1", "[from space.train.batch_size=0]"),
    ),
    Case(
        "space-values-valid-alone-not-together",
        exp(
            train={"max_steps": 100, "eval_every": 10, "batch_size": 4},
            space={"train.eval_every": {"choice": [50]}, "train.max_steps": {"choice": [20, 100]}},
        ),
        ("`eval_every <= max_steps` must hold", "[from train.eval_every=50 train.max_steps=20]"),
    ),
    # ---- scheduler and sampler
    Case(
        "reduction-factor-not-above-1",
        exp(search={"scheduler": {"type": "asha", "reduction_factor": 1}}),
        ("search.scheduler.reduction_factor", "must be > 1"),
    ),
    Case(
        "grace-period-beyond-the-evaluations",  # 20 steps / eval every 10 = 2 evaluations
        exp(search={"scheduler": {"type": "asha", "grace_period": 5}}),
        ("search.scheduler.grace_period", "`grace_period <= 2` must hold", "grace_period=5"),
    ),
    Case(
        "unknown-scheduler-type",
        exp(search={"scheduler": {"type": "pbt"}}),
        ("search.scheduler.type", "must be one of 'asha', 'hyperband', 'median' or 'none'"),
    ),
    Case(
        "grid-sampler-with-a-continuous-key",
        exp(search={"sampler": "grid"}, space={"method.lr": {"loguniform": [0.01, 0.1]}}),
        ("search.sampler", "must be grid or choice", "space.method.lr is continuous"),
    ),
    Case(
        "cmaes-with-two-objectives",
        exp(
            search={
                "sampler": "cmaes",
                "objectives": [{"metric": "accuracy"}, {"metric": "train_samples_per_s"}],
            },
            space={"method.lr": {"loguniform": [0.01, 0.1]}},
        ),
        ("cmaes", "search.objectives", "must be tpe, nsga2 or random"),
    ),
    # ---- objectives and constraints
    Case(
        "metric-the-task-does-not-report",
        exp(search={"metric": "bleu"}),
        ("search.metric", "'bleu' is not reported", "accuracy"),
    ),
    Case(
        "objective-the-task-does-not-report",
        exp(search={"objectives": [{"metric": "accuracy"}, {"metric": "f1"}]}),
        ("search.objectives[1].metric", "'f1' is not reported"),
    ),
    Case(
        "constraint-min-above-max",
        exp(search={"constraints": {"trainable_params": {"min": 100, "max": 10}}}),
        ("search.constraints.trainable_params", "`min <= max` must hold"),
    ),
    # ---- training loop
    Case(
        "eval-every-beyond-max-steps",
        exp(train={"max_steps": 5, "eval_every": 10}),
        ("train", "`eval_every <= max_steps` must hold", "eval_every=10"),
    ),
    Case(
        "backbone-dropout-not-below-1",
        exp(train__backbone_dropout=1.5),
        ("train.backbone_dropout", "a rate with `0 <= rate < 1`", "got 1.5"),
    ),
    Case(
        "backbone-dropout-unknown-word",
        exp(train__backbone_dropout="own"),
        ("train.backbone_dropout", "must be config or a rate", "'own'"),
    ),
    Case(
        "backbone-dropout-off-read-as-a-boolean",  # YAML 1.1: off is false
        "name: bad-input\n"
        "model: {name: tiny-bert, max_length: 16}\n"
        "method: {name: pt, prompt_length: 4}\n"
        "train: {max_steps: 20, eval_every: 10, batch_size: 4, backbone_dropout: off}\n"
        "run: {storage_path: ray_results}\n",
        ("train.backbone_dropout", "got False", "YAML reads off/no/false as a boolean: write 0"),
    ),
    Case(
        "batch-not-divisible-by-workers",
        exp(train__batch_size=5, resources={"workers_per_trial": 2, "cpus_per_worker": 0.5}),
        ("train.batch_size", "`batch_size % resources.workers_per_trial == 0` must hold"),
    ),
    Case(
        "unknown-learning-rate-schedule",
        exp(train__schedule="cosine"),
        ("train.schedule", "must be one of 'linear' or 'constant'", "'cosine'"),
    ),
    Case(
        "unknown-seq2seq-scoring",
        exp(task={"name": "tweet_sentiment", "seq2seq_scoring": "beam"}),
        ("task.seq2seq_scoring", "must be one of 'generate' or 'rank'", "'beam'"),
    ),
    Case(
        "unknown-idpg-pooling",
        exp(method={"name": "idpg", "pooling": "cls"}),
        ("method.pooling", "must be one of 'auto', 'first', 'mean' or 'last'", "'cls'"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)


IN_PROCESS = [c for c in CASES if c.in_process]


@pytest.mark.parametrize("case", IN_PROCESS, ids=ids(IN_PROCESS))
@pytest.mark.slow
def test_bad_input_in_a_real_process(case, tmp_path):
    run_in_process(case, tmp_path)
