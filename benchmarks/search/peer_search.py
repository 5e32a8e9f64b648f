"""The same PT search by raypeft and by what a Hugging Face user writes instead.

The peer is ``transformers.Trainer.hyperparameter_search(backend="optuna")`` over a peft
``PromptTuningConfig(task_type="SEQ_CLS")`` model, with Optuna's successive-halving pruner
asked at every evaluation (the Trainer reports the objective to the trial and raises
``TrialPruned`` when the pruner says so). Both search ``search_spaces/pt.yaml``'s space (the
prompt's learning rate, its length, its initialisation) with its data, steps, evaluations,
batch size and number of trials, one after the other on this machine, on identical examples
(raypeft's own tokenised task, so the same texts, the same truncation). Every figure is read
back from the runs and studies: raypeft's MLflow runs, the peer's Optuna study (sqlite).

The peer's defaults, stated honestly (a user who knows them can change them, which the
variants do):

- one learning rate for the prompt and the new classification head (TrainingArguments has
  one); raypeft gives the head its own (``train.head_lr``);
- BERT's head reads position 0 through its pooler: under peft the prompt is prepended, so
  position 0 is a prompt slot; raypeft's head on a mean-pooling sentence encoder (MiniLM)
  reads the mean of the input's own tokens (``model.head_pooling: auto``);
- fp32 on the CPU (the Trainer's default); raypeft's ``train.precision: auto`` is fp32 on a
  CPU too unless it has AMX (bf16 on a GPU of compute capability 8 or more). Where torch sees a
  GPU both train on it (the peer in fp32, its default there too;
  ``benchmarks.device.gpu_run``, step c);
- trials one at a time, each with every core (``study.optimize`` runs them in turn); raypeft
  runs as many at once as fit, each with one core;
- the best trial's hyperparameters are trained again to get a model (``hyperparameter_search``
  returns hyperparameters, not a model): that run counts in the peer's total.

Variants (``--variants``), one per default above, each isolating it: ``raypeft``, ``peer``,
``raypeft-first-head`` (raypeft with the peer's head: position 0), ``peer-two-rates`` (the peer
with the head at raypeft's ``head_lr``: a Trainer whose ``create_optimizer`` gives the head its
own rate), ``raypeft-bf16`` (raypeft with bf16 autocast on the CPU, what ``auto`` chose on an
AVX512-BF16 CPU until 2026-11-26) and ``peer-bf16`` (the peer with
``TrainingArguments(bf16=True)``: CPU autocast, as ``raypeft-bf16``).

Usage::

    python -m benchmarks.search.peer_search
    python -m benchmarks.search.peer_search --variants raypeft,peer,peer-two-rates \\
        --set train.max_steps=80
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.machine import cpu_name, load_note
from benchmarks.common.paths import REPO
from benchmarks.common.searches import experiment_in, quiet_and_local, timed_search
from benchmarks.common.tables import print_table

RAYPEFT_SETS = {  # what each raypeft variant changes, in the experiment file's terms
    "raypeft": [],
    "raypeft-first-head": ["model.head_pooling=first"],
    "raypeft-bf16": ["train.precision=bf16"],
}
PEER_OPTIONS = {  # what each peer variant changes: the head's own rate, CPU bf16
    "peer": {"two_rates": False, "bf16": False},
    "peer-two-rates": {"two_rates": True, "bf16": False},
    "peer-bf16": {"two_rates": False, "bf16": True},
}
VARIANTS = (*RAYPEFT_SETS, *PEER_OPTIONS)
INIT = {"vocab": "SAMPLE_VOCAB", "normal": "RANDOM", "text": "TEXT"}  # raypeft -> peft


@dataclass
class Outcome:
    """One search, as read back from its records."""

    name: str
    wall_s: float  # the search, and for the peer the final training of the best trial
    search_s: float  # the search alone
    trials: int
    pruned: int  # stopped early by the scheduler or the pruner
    trial_steps: int  # training steps summed over trials (the peer's final run not counted)
    best_val: float
    test: float
    params: dict


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_and_local()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="peer-search-") as tmp:
        for name in args.variants:
            folder = Path(tmp) / name
            folder.mkdir()
            print(f"{name}: running{load_note()}", flush=True)
            outcomes.append(RUNNERS[name.split("-", 1)[0]](name, args, folder))
            print(f"{name}: {json.dumps(outcomes[-1].__dict__, default=str)}", flush=True)
    report(outcomes, args)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", type=Path, default=REPO / "search_spaces" / "pt.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the experiment file (both sides)")  # fmt: skip
    parser.add_argument("--variants", default="raypeft,peer,raypeft-first-head",
                        type=lambda s: [v for v in s.split(",") if v])  # fmt: skip
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    return args


# ----------------------------------------------------------------------------- raypeft


def run_raypeft(name: str, args, folder: Path) -> Outcome:
    """``raypeft tune`` on the experiment file, with the variant's changes."""
    cfg = experiment_in(args.space, name, [*args.set, *RAYPEFT_SETS[name]], folder)
    summary, wall = timed_search(cfg, folder)
    return raypeft_outcome(name, summary, wall)


def raypeft_outcome(name: str, summary, wall: float) -> Outcome:
    """The search's figures from its MLflow runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary.tracking_uri)
    trials = [client.get_run(run_id) for run_id in summary.trial_run_ids.values()]
    steps = [
        max((m.step for m in client.get_metric_history(t.info.run_id, "val_loss")), default=0)
        for t in trials
    ]
    parent = client.get_run(summary.parent_run_id)
    metric = parent.data.tags.get("raypeft.metric", "accuracy")
    return Outcome(
        name=name,
        wall_s=wall,
        search_s=wall,
        trials=len(trials),
        pruned=sum(t.data.tags.get("raypeft.stopped_early") == "true" for t in trials),
        trial_steps=sum(steps),
        best_val=parent.data.metrics.get(f"best_val_{metric}", float("nan")),
        test=parent.data.metrics.get(f"test_{metric}", float("nan")),
        params={k: v for k, v in summary.best_params.items() if not k.startswith("derived.")},
    )


# ----------------------------------------------------------------------------- the peer


def run_peer(name: str, args, folder: Path) -> Outcome:
    """``Trainer.hyperparameter_search`` over a peft prompt-tuning model, then the best
    trial's hyperparameters trained again and scored on the test split."""
    import optuna

    from raypeft.search.study import startup_trials

    cfg = experiment_in(args.space, name, args.set, folder)
    data = peer_data(cfg)
    storage = f"sqlite:///{folder / 'optuna.db'}"
    start = time.perf_counter()
    options = PEER_OPTIONS[name]
    trainer = peer_trainer(cfg, data, folder, **options)
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: peer_space(cfg, trial),
        compute_objective=lambda metrics: metrics["eval_accuracy"],
        n_trials=cfg.search.num_samples,
        direction="maximize",
        backend="optuna",
        # the same start-up count as raypeft's TPE (pt.yaml's search.startup_trials)
        sampler=optuna.samplers.TPESampler(
            seed=cfg.search.seed, n_startup_trials=startup_trials(cfg)
        ),
        pruner=peer_pruner(cfg),
        storage=storage,
        study_name=name,
    )
    search_s = time.perf_counter() - start
    test = final_run(cfg, data, folder, best.hyperparameters, **options)
    wall = time.perf_counter() - start
    return peer_outcome(name, storage, wall, search_s, test, best.hyperparameters)


def peer_space(cfg, trial) -> dict:
    """pt.yaml's space as the peer samples it: the rate as TrainingArguments.learning_rate,
    the prompt's length and initialisation for ``model_init``."""
    space = cfg.space
    return {
        "learning_rate": space["method.lr"].suggest(trial, "learning_rate"),
        "num_virtual_tokens": space["method.prompt_length"].suggest(trial, "num_virtual_tokens"),
        "init": space["method.init"].suggest(trial, "init"),
    }


def peer_pruner(cfg):
    """Successive halving at every evaluation, on the search file's ASHA settings."""
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(**pruner_settings(cfg))


def pruner_settings(cfg) -> dict[str, int]:
    """ASHA's schedule in Optuna's terms: the first rung after ``grace_period`` evaluations
    (in steps: the Trainer reports by step), keeping 1/``reduction_factor``."""
    sched = cfg.search.scheduler
    factor = sched.reduction_factor
    if not float(factor).is_integer():  # Ray's ASHA takes 2.5; Optuna indexes rungs with it
        raise SystemExit(
            f"search.scheduler.reduction_factor: the peer's pruner takes an integer, not {factor}"
        )
    return {
        "min_resource": sched.grace_period * cfg.train.eval_every,
        "reduction_factor": int(factor),  # the schema's float (3.0) breaks Optuna's indexing
    }


def peer_data(cfg):
    """raypeft's tokenised task as datasets: the same examples, the same truncation."""
    import datasets

    from raypeft.data.tokenize import prepare_task

    task = prepare_task(cfg.task, cfg.model)
    return {
        split: datasets.Dataset.from_dict({k: v.tolist() for k, v in arrays.items()})
        for split, arrays in task.splits.items()
    } | {"num_labels": task.num_labels}


def peer_model(cfg, num_labels: int, params: dict):
    """BERT for sequence classification (the packaged MiniLM) with a peft prompt."""
    from peft import PromptTuningConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from raypeft.modeling.backbones import resolve_source

    source = resolve_source(cfg.model.name)
    base = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels)
    prompt = PromptTuningConfig(
        task_type=TaskType.SEQ_CLS,
        num_virtual_tokens=int(params.get("num_virtual_tokens", cfg.method.prompt_length)),
        prompt_tuning_init=INIT[params.get("init", cfg.method.init)],
        tokenizer_name_or_path=source,
    )
    return get_peft_model(base, prompt)


def training_arguments(cfg, folder: Path, bf16: bool = False):
    """The Trainer's arguments for pt.yaml's training (``bf16``: the CPU's autocast), on the
    GPU where there is one, in fp32 (the Trainer's default), else on the CPU."""
    import torch
    from transformers import TrainingArguments

    train = cfg.train
    return TrainingArguments(
        output_dir=str(folder / "trainer"),
        max_steps=train.max_steps,
        per_device_train_batch_size=train.batch_size,
        per_device_eval_batch_size=64,
        eval_strategy="steps",
        eval_steps=train.eval_every,
        learning_rate=cfg.method.lr,
        warmup_steps=math.ceil(train.warmup_ratio * train.max_steps),  # as raypeft warms up
        weight_decay=train.weight_decay,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        seed=train.seed,
        use_cpu=not torch.cuda.is_available(),  # the GPU where there is one (device/gpu_run)
        bf16=bf16,
        disable_tqdm=True,
    )


def peer_trainer(cfg, data, folder: Path, two_rates: bool, bf16: bool):
    """The Trainer a Hugging Face user writes for the search (``model_init`` per trial)."""
    from transformers import PrinterCallback

    num_labels = data["num_labels"]
    trainer = trainer_class(cfg, two_rates)(
        model_init=lambda trial: peer_model(cfg, num_labels, trial.params if trial else {}),
        args=training_arguments(cfg, folder, bf16),
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        compute_metrics=accuracy,
    )
    trainer.remove_callback(PrinterCallback)  # a dict per evaluation would drown the table
    return trainer


def trainer_class(cfg, two_rates: bool):
    """The Trainer itself, or (``two_rates``) one giving the head ``train.head_lr``."""
    from transformers import Trainer

    return two_rate_trainer(cfg.train.head_lr) if two_rates else Trainer


def two_rate_trainer(head_lr: float):
    """A Trainer whose optimizer gives the classification head ``head_lr`` (raypeft's
    default) and the prompt the searched rate."""
    from transformers import Trainer

    class TwoRates(Trainer):
        def create_optimizer(self, model=None):
            import torch

            model = model or self.model
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            groups = [
                {"params": [p for n, p in named if "classifier" not in n]},
                {"params": [p for n, p in named if "classifier" in n], "lr": head_lr},
            ]
            self.optimizer = torch.optim.AdamW(
                groups, lr=self.args.learning_rate, weight_decay=self.args.weight_decay
            )
            return self.optimizer

    return TwoRates


def accuracy(prediction) -> dict:
    predicted = prediction.predictions.argmax(-1)
    return {"accuracy": float((predicted == prediction.label_ids).mean())}


def final_run(cfg, data, folder: Path, params: dict, two_rates: bool, bf16: bool) -> float:
    """The best trial's hyperparameters trained again; its test accuracy."""
    from transformers import PrinterCallback

    args = training_arguments(cfg, folder, bf16)
    args.learning_rate = params["learning_rate"]
    trainer = trainer_class(cfg, two_rates)(
        model=peer_model(cfg, data["num_labels"], params),
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        compute_metrics=accuracy,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.evaluate(data["test"], metric_key_prefix="test")["test_accuracy"]


def peer_outcome(name, storage, wall, search_s, test, params) -> Outcome:
    """The peer's figures from its Optuna study."""
    import optuna

    study = optuna.load_study(study_name=name, storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    steps = [max(t.intermediate_values, default=0) for t in finished]
    return Outcome(
        name=name,
        wall_s=wall,
        search_s=search_s,
        trials=len(finished),
        pruned=sum(t.state == optuna.trial.TrialState.PRUNED for t in finished),
        trial_steps=sum(steps),
        best_val=study.best_value,
        test=test,
        params=params,
    )


RUNNERS = {"raypeft": run_raypeft, "peer": run_peer}


# ----------------------------------------------------------------------------- the table


def report(outcomes: list[Outcome], args) -> None:
    """The side-by-side table, each figure also as a ratio to the peer's."""
    peer = next((o for o in outcomes if o.name == "peer"), None)

    def ratio(value: float, of: float | None) -> str:
        return f"{value / of:.2f}" if of else "-"

    rows = [
        [o.name, f"{o.wall_s:.0f}", ratio(o.wall_s, peer and peer.wall_s), f"{o.search_s:.0f}",
         str(o.trials), str(o.pruned), str(o.trial_steps), f"{o.best_val:.4f}", f"{o.test:.4f}",
         json.dumps(o.params)]
        for o in outcomes
    ]  # fmt: skip
    header = ["search", "wall (s)", "wall / peer", "search (s)", "trials", "stopped early",
              "trial-steps", "best val acc", "test acc", "chosen"]  # fmt: skip
    print(f"\n{cpu_name()}; {args.space.name} {' '.join(args.set)}{load_note()}")
    print_table(header, rows)


if __name__ == "__main__":
    main()
