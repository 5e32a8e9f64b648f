"""The experiment file's pydantic models: every section, its defaults and its rules.

Reading a file (YAML, ``--set``, the checks across sections) is :mod:`raypeft.config.loading`;
the ``space`` section's language is :mod:`raypeft.config.space`. Everything a run needs is
validated before Ray, MLflow or any folder is touched.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raypeft.config.dotted import set_dotted
from raypeft.config.messages import _key_hint, _loc_text, describe_error
from raypeft.config.method_configs import (
    RegisteredMethodConfig,
    method_config_classes,
    on_method_registered,
)
from raypeft.config.space import (
    SEED_KEY,
    SPACE_KINDS,
    SpaceParam,
    StrictModel,
    configuration_key,
    is_conditional,
)


class ModelConfig(StrictModel):
    """The frozen backbone."""

    name: str = Field(
        "minilm",
        description="Hugging Face id or local path; aliases: minilm (packaged all-MiniLM-L6-v2), "
        "tiny-bert (randomly initialised, for tests)",
    )
    max_length: int = Field(128, ge=8, le=4096, description="s: inputs are padded/truncated to s")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit)")
    head_pooling: Literal["auto", "first", "mean"] = Field(
        "auto",
        description="what an encoder's task head reads: first (the first position, as "
        "transformers' head and peft: a prompt slot once a prompt is prepended), mean (the "
        "mean of the input's own token states) or auto (mean for sentence encoders whose "
        "sentence-transformers config mean-pools, such as minilm; else first)",
    )


class TaskConfig(StrictModel):
    """The labelled task: a registered one, any Hub dataset (`hub`) or local files (`files`)."""

    name: str = Field(
        "tweet_sentiment",
        description="registered task (tweet_sentiment, glue/rte, ...), or `hub` (any Hugging Face "
        "dataset, with `dataset` and the columns) or `files` (local files, with the columns)",
    )
    dataset: str | None = Field(
        None, description="hub tasks: dataset id (or a local dataset folder) for load_dataset"
    )
    dataset_config: str | None = Field(None, description="hub tasks: the dataset's config name")
    validation_split: str = Field("validation", description="hub tasks: split used as validation")
    data_dir: Path | None = Field(
        None, description="folder with train/validation[/test].jsonl instead of the Hub"
    )
    files: dict[Literal["train", "validation", "test"], Path] | None = Field(
        None, description="local jsonl/csv/parquet files per split (task name: files)"
    )
    text_column: str | None = Field(None, description="first text column (files tasks)")
    text_pair_column: str | None = Field(None, description="second text column, if pairs")
    label_column: str = Field("label", description="label column (files tasks)")
    problem: Literal["classification", "regression"] | None = Field(
        None, description="files tasks: classification (default) or regression"
    )
    max_train_examples: int | None = Field(None, ge=1, description="cap on training examples")
    max_eval_examples: int | None = Field(None, ge=1, description="cap on validation examples")
    max_test_examples: int | None = Field(None, ge=1, description="cap on test examples")
    split_seed: int = Field(0, description="seed of subsampling and of derived splits")
    seq2seq_scoring: Literal["generate", "rank"] = Field(
        "generate",
        description="how a seq2seq backbone (T5) answers a classification task: generate "
        "(greedy text, mapped to the class it names; text that names none counts as wrong, "
        "as DePT's code) or rank (each class's verbalizer scored by its log-likelihood under "
        "the decoder, the most likely one predicted: always a class). Regression tasks "
        "always generate; other backbones use their head",
    )


# what train.precision may say (raypeft.modeling.precision resolves it on a device)
PrecisionSetting = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionSetting)


class TrainConfig(StrictModel):
    """The training loop shared by every method (defaults follow DePT's Table 10)."""

    max_steps: int = Field(1000, ge=1)
    batch_size: int = Field(16, ge=1, description="global batch size (split across workers)")
    eval_batch_size: int = Field(64, ge=1)
    eval_every: int = Field(100, ge=1, description="evaluate (and report to Tune) every k steps")
    head_lr: float = Field(1e-3, gt=0, description="learning rate of the task head")
    warmup_ratio: float = Field(
        0.06, ge=0, lt=1, description="linear schedule: warm-up share of max_steps"
    )
    schedule: Literal["linear", "constant"] = Field(
        "linear",
        description="learning-rate schedule: linear (warm-up over warmup_ratio, then linear "
        "decay to zero: DePT's) or constant (every step at the set rates, no warm-up, no "
        "decay: IDPG's Table 4; warmup_ratio is not used)",
    )
    weight_decay: float = Field(0.01, ge=0)
    adam_eps: float = Field(1e-6, gt=0)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = 42
    num_threads: int | None = Field(
        None, ge=1, description="torch threads per worker (default: its CPUs)"
    )
    precision: PrecisionSetting = Field(
        "auto",
        description="what the frozen backbone computes in; trainable tensors and optimizer "
        "state stay fp32. auto: bf16 where the hardware runs it fast (CUDA compute "
        "capability >= 8, a CPU with AVX512-BF16 or AMX), else fp32; fp16: CUDA only",
    )
    backbone_dropout: float | Literal["config"] = Field(
        "config",
        description="the frozen backbone's dropout while the method trains: config (its own "
        "rates, as the papers train: 0.1 for BERT, RoBERTa and T5), 0 (none: the backbone "
        "stays in eval mode) or a rate in (0, 1) for every dropout of the backbone and its "
        "head. Evaluation never drops out",
    )

    @field_validator("backbone_dropout", mode="before")
    @classmethod
    def _dropout_rate(cls, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not math.isfinite(value):
            raise ValueError(f"`backbone_dropout` must be a finite number, but got {value}")
        if value != "config" and not (number and 0 <= value < 1):
            why = " (YAML reads off/no/false as a boolean: write 0)" if value is False else ""
            raise ValueError(
                "`backbone_dropout` must be config or a rate with `0 <= rate < 1` (0: no "
                f"dropout), but got {value!r}{why}"
            )
        return value

    @model_validator(mode="after")
    def _eval_every_fits(self) -> TrainConfig:
        if self.eval_every > self.max_steps:
            raise ValueError(
                "`eval_every <= max_steps` must hold, but got "
                f"(eval_every={self.eval_every}, max_steps={self.max_steps})"
            )
        return self


class SchedulerConfig(StrictModel):
    """Early stopping of trials (their clock: a trial's evaluations, counted from its step 0)."""

    type: Literal["asha", "hyperband", "median", "none"] = Field(
        "asha",
        description="asha (async successive halving), hyperband (async HyperBand: ASHA over "
        "several brackets), median (median stopping rule), none (every trial runs to the end)",
    )
    grace_period: int = Field(
        2,
        ge=1,
        description="evaluations every trial gets before stopping; when set, at most "
        "ceil(train.max_steps / train.eval_every) (the default, 2, is lowered to that)",
    )
    reduction_factor: float = Field(2, gt=1, description="asha/hyperband: keep 1/factor per rung")
    brackets: int = Field(3, ge=1, description="hyperband: number of brackets")
    min_samples_required: int = Field(
        3, ge=1, description="median: trials that must have reached a step before it compares"
    )
    metric: str | None = Field(
        None,
        description="what the scheduler compares trials on, at each evaluation (e.g. val_loss, "
        "which does not tie where accuracies sit at the majority class); default: the search's "
        "metric. The searcher still optimises search.metric",
    )
    mode: Literal["max", "min"] | None = Field(
        None, description="direction of scheduler.metric; default: the metric's own"
    )


# Efficiency figures every trial reports (raypeft/train.py), with the direction that is better.
EFFICIENCY_METRICS: dict[str, str] = {
    "trainable_params": "min",
    "train_samples_per_s": "max",
    "eval_samples_per_s": "max",
    "peak_memory_mb": "min",
    "wall_time_s": "min",
}


class Objective(StrictModel):
    """One objective: a validation metric of the task (its best value in the trial) or an
    efficiency figure (trainable_params, train_samples_per_s, eval_samples_per_s,
    peak_memory_mb, wall_time_s)."""

    metric: str
    mode: Literal["max", "min"] | None = Field(None, description="default: the metric's")


class Bound(StrictModel):
    """A constraint on one metric: trials outside it are infeasible for the sampler and are
    never chosen as the best."""

    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _one_side(self) -> Bound:
        if self.max is None and self.min is None:
            raise ValueError("give max, min or both")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"`min <= max` must hold, but got min={self.min}, max={self.max}")
        return self


class RepeatBest(StrictModel):
    """After the search, train the best configurations again with other seeds."""

    top_k: int = Field(3, ge=1, description="how many of the best configurations to repeat")
    seeds: int = Field(2, ge=1, description="extra seeds per configuration (train.seed + 1..n)")


class SearchConfig(StrictModel):
    """Ray Tune + Optuna settings."""

    metric: str | None = Field(None, description="validation metric to optimise (default: task's)")
    mode: Literal["max", "min"] | None = Field(None, description="default: the metric's")
    objectives: list[Objective] | None = Field(
        None,
        min_length=2,
        description="multi-objective search (Optuna's Pareto front), e.g. accuracy (max) and "
        "train_samples_per_s (max); the first one drives the scheduler and the test evaluation",
    )
    constraints: dict[str, Bound] = Field(
        default_factory=dict,
        description="metric -> {max, min}: e.g. trainable_params: {max: 40000} or "
        "eval_samples_per_s: {min: 500}; the sampler learns them, the best trial satisfies them",
    )
    num_samples: int = Field(12, ge=1, description="number of trials")
    max_concurrent: int | None = Field(None, ge=1, description="default: as many as fit")
    sampler: Literal["tpe", "random", "grid", "cmaes", "gp", "nsga2"] = Field(
        "tpe",
        description="Optuna sampler: tpe, random, grid (every combination of grid/choice "
        "keys), cmaes (numeric keys), gp (Optuna's Gaussian-process sampler), nsga2 "
        "(multi-objective)",
    )
    seed: int = Field(0, description="seed of the sampler")
    startup_trials: int | None = Field(
        None,
        ge=0,
        description="tpe and gp: trials drawn at random before the sampler models the results "
        "(Optuna's n_startup_trials; default Optuna's 10). With 12-24 samples the default "
        "leaves the sampler almost nothing to choose: docs/search_efficiency.md",
    )
    answer_repeats: bool = Field(
        True,
        description="over a discrete space, a configuration the sampler proposes again is "
        "answered from its earlier trial instead of trained again; false: it trains again "
        "(another draw of its noise, at the cost of a trial)",
    )
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="train every configuration once per seed, each its own trial with its own "
        "train.seed (a grid of seeds: sampler grid only); the trials of one configuration share "
        "the raypeft.configuration tag in MLflow and user attribute in Optuna",
    )
    trial_seed: Literal["fixed", "per_trial"] = Field(
        "fixed",
        description="fixed: every trial trains with train.seed (paired comparison); per_trial: "
        "trial k trains with train.seed + k (logged as its train.seed)",
    )
    repeat_best: RepeatBest | None = Field(
        None, description="re-train the top_k configurations with more seeds; mean and std"
    )
    storage: str | None = Field(
        None,
        description="Optuna RDB storage URL (default: $RAYPEFT_SEARCH_STORAGE, else "
        "optuna.db next to the MLflow sqlite store, else in the working directory)",
    )
    study_name: str | None = Field(
        None,
        min_length=1,
        description="Optuna study (default: the MLflow experiment's name); a search with "
        "the same study continues its history",
    )
    scheduler: SchedulerConfig = SchedulerConfig()

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None and len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat a seed: {seeds}")
        return seeds

    @model_validator(mode="after")
    def _consistent(self) -> SearchConfig:
        if self.startup_trials is not None and self.sampler not in ("tpe", "gp"):
            raise ValueError(
                f"startup_trials: only tpe and gp draw start-up trials, so sampler must be one "
                f"of them, but got sampler: {self.sampler}"
            )
        if self.objectives:
            first = self.objectives[0].metric
            if self.metric is not None and self.metric != first:
                raise ValueError(
                    f"metric {self.metric!r} differs from the first objective {first!r}: "
                    "with objectives, leave metric out"
                )
            names = [o.metric for o in self.objectives]
            if len(set(names)) != len(names):
                raise ValueError(f"objectives repeat a metric: {names}")
            if self.sampler in ("cmaes", "gp"):
                raise ValueError(
                    f"sampler: {self.sampler} optimises a single objective: with "
                    "search.objectives, sampler must be tpe, nsga2 or random"
                )
        return self

    def objective_list(self, default_metric: str) -> list[Objective]:
        """The objectives, first one primary; the single metric when there are none."""
        if self.objectives:
            return list(self.objectives)
        return [Objective(metric=self.metric or default_metric, mode=self.mode)]


class ResourcesConfig(StrictModel):
    """What one trial asks Ray for: ``workers_per_trial`` workers, each with
    ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs."""

    workers_per_trial: int = Field(1, ge=1, description="Ray Train workers per trial (DDP)")
    cpus_per_worker: float = Field(1, gt=0)
    gpus_per_worker: float = Field(
        0,
        ge=0,
        description="GPUs per worker: a fraction in (0, 1] shares one GPU between trials (0.25: "
        "four trials per GPU, Ray's fractional GPUs; memory is not partitioned), or a whole "
        "number. 0 (default): none, 1 with use_gpu: true, or chosen by use_gpu: auto",
    )
    use_gpu: bool | Literal["auto"] = Field(
        "auto",
        description="auto (default): trials go to a GPU when the Ray cluster has one, else the "
        "CPU; how many share a GPU (or train as a pack) is chosen at the start of the search "
        "from a short probe of step time and memory, cached per backbone, method and GPU "
        "(docs/performance.md). true: shorthand for gpus_per_worker: 1; beside a "
        "gpus_per_worker > 0 it is redundant (that amount is used), and `use_gpu: false` "
        "beside it is an error. false: the CPU",
    )
    trial_runner: Literal["auto", "in_process", "ray_train", "replay"] = Field(
        "auto",
        description="auto: single-worker trials train inside the Tune trainable (faster, see "
        "README), multi-worker trials in a Ray Train TorchTrainer, on CPU or GPU alike; "
        "replay: no training, each trial reports the curve replay.table recorded for its "
        "configuration (a demo of a whole search; the platform's own cost measured)",
    )
    trials_per_worker: int = Field(
        1,
        ge=1,
        le=64,
        description="K > 1: trials train in packs of up to K on one worker, sharing its frozen "
        "backbone (one fused forward and backward pass per step); each is still its own trial "
        "(Optuna trial, MLflow run, checkpoint, scheduler decision) and asks Ray for 1/K of a "
        "worker's CPUs and GPUs (docs/packing.md). Single-worker trials only",
    )

    compile_packs: bool = Field(
        False,
        description="packs whose members step fused (on an encoder; docs/packing.md): compile the "
        "pack's forward pass and losses with torch.compile, its shapes static while its "
        "membership holds (every slot a full batch, prompts padded to a multiple of 16). "
        "Exact as the eager pack; it pays a compilation per membership change and is off "
        "until measured to win (docs/packing.md)",
    )

    @field_validator("trials_per_worker")
    @classmethod
    def _packs_are_single_worker(cls, value: int, info: ValidationInfo) -> int:
        # a pack is one process on one device: DDP workers, Ray Train and several GPUs
        # per worker cannot hold one
        if value == 1:
            return value
        workers = info.data.get("workers_per_trial", 1)
        if workers > 1:
            raise ValueError(
                "a pack is one process on one device, so `trials_per_worker == 1` must hold "
                f"with workers_per_trial={workers} (DDP trials do not pack), but got {value}"
            )
        if info.data.get("trial_runner") == "ray_train":
            raise ValueError(
                "packed trials train in their worker's process, so `trials_per_worker == 1` "
                f"must hold with trial_runner: ray_train, but got {value}; use auto or in_process"
            )
        gpus = info.data.get("gpus_per_worker", 0)
        if gpus > 1:
            raise ValueError(
                "a pack trains on one device, so `gpus_per_worker <= 1` must hold with "
                f"trials_per_worker={value}, but got gpus_per_worker={gpus:g}"
            )
        cpus = info.data.get("cpus_per_worker", 1)
        if min(cpus / value, gpus / value if gpus else 1) < 1e-4:
            raise ValueError(
                "each trial of a pack asks Ray for 1/trials_per_worker of a worker's CPUs and "
                "GPUs, so that share must be >= 0.0001 (Ray's smallest amount), but got "
                f"cpus_per_worker={cpus:g}, gpus_per_worker={gpus:g}, trials_per_worker={value}"
            )
        return value

    @field_validator("gpus_per_worker")
    @classmethod
    def _ray_gpu_amount(cls, value: float, info: ValidationInfo) -> float:
        # Ray's rule for resource amounts: a fraction of one unit, or whole units; it counts
        # in steps of 0.0001, so a smaller fraction would be rounded to no GPU at all
        if value > 1 and not float(value).is_integer():
            raise ValueError(
                "`0 < gpus_per_worker <= 1` (trials share a GPU) or a whole number of GPUs "
                f"must hold, as Ray places GPUs, but got gpus_per_worker={value:g}"
            )
        if 0 < value < 1e-4:
            raise ValueError(
                "`gpus_per_worker >= 0.0001` must hold (Ray's smallest fraction), but got "
                f"{value:g}"
            )
        workers = info.data.get("workers_per_trial", 1)
        if workers > 1 and 0 < value < 1:
            # Ray packs fractions onto one GPU, and NCCL refuses two DDP ranks on one GPU
            raise ValueError(
                "a fraction of a GPU is for trials sharing one; DDP workers each need whole "
                f"GPUs, so `gpus_per_worker >= 1` must hold with workers_per_trial={workers}, "
                f"but got {value:g}"
            )
        return value

    @field_validator("use_gpu", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        # one message for the union of a bool and "auto" (pydantic would give one per member)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return TypeAdapter(bool).validate_python(value)
        except ValidationError:
            raise ValueError(f"must be true, false or auto (got {value!r})") from None

    @field_validator("use_gpu")
    @classmethod
    def _use_gpu_agrees(cls, value: bool | str, info: ValidationInfo) -> bool | str:
        # runs only when use_gpu is given; gpus_per_worker (declared before) is validated
        gpus = info.data.get("gpus_per_worker", 0)
        if value is False and gpus > 0:
            raise ValueError(
                f"`use_gpu: false` contradicts gpus_per_worker={gpus:g}: drop use_gpu "
                "(gpus_per_worker > 0 uses a GPU)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _gpus_imply_use_gpu(cls, data: Any) -> Any:
        # a dumped config then reads `use_gpu: true` beside its fraction, and validates again
        if isinstance(data, dict) and "use_gpu" not in data:
            gpus = data.get("gpus_per_worker")
            if isinstance(gpus, (int, float)) and gpus > 0:
                return {**data, "use_gpu": True}
        return data

    @property
    def gpus(self) -> float:
        """GPUs per worker: ``gpus_per_worker``, else 1 with ``use_gpu: true``, else 0. An
        unresolved ``use_gpu: auto`` counts as 0 (its fallback, the CPU) until the search
        resolves it on the cluster (:func:`raypeft.search.gpu_plan.plan_resources`)."""
        if self.use_gpu == "auto":
            return 0.0
        return float(self.gpus_per_worker or (1 if self.use_gpu else 0))

    @property
    def gpu_auto(self) -> bool:
        """``use_gpu: auto``: the search decides GPU or CPU, and the sharing, when it starts."""
        return self.use_gpu == "auto"


# Where MLflow can keep an experiment's artefacts: object stores and file systems every reader
# of the tracking store can reach (MLflow's artifact repositories; a plain absolute folder too)
ARTIFACT_SCHEMES = ("s3", "gs", "wasbs", "abfss", "hdfs", "sftp", "file", "mlflow-artifacts")


class TrackingConfig(StrictModel):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (default: sqlite:///mlflow.db): a sqlite file, a "
        "database server (postgresql+psycopg://user:password@host:5432/mlflow; postgresql:// "
        "means the same driver) or a tracking server (http://host:5000)",
    )
    artifact_location: str | None = Field(
        None,
        description="where an experiment the search creates keeps its artefacts (models, the "
        "experiment file): a URI every reader reaches (s3://bucket/mlflow) or an absolute "
        "folder. Default: a tracking server's --artifacts-destination; for a database URI, "
        "./mlruns where the search starts, on that machine's disk only. An existing "
        "experiment keeps the location it was created with",
    )
    experiment: str | None = Field(
        None, min_length=1, description="MLflow experiment name (default: name)"
    )
    # --- models, registry, system metrics (issue 16; see docs/serving.md) ---
    register_model: bool | str = Field(
        True,
        description="register the chosen trial's model in the MLflow Model Registry as a new "
        "version of this name; true: the experiment's name, false: do not register",
    )
    champion_alias: str | None = Field(
        "champion",
        min_length=1,
        description="registry alias of the best version (models:/NAME@champion); null: none",
    )
    champion_policy: Literal["if_better", "always", "never"] = Field(
        "if_better",
        description="when the alias moves to a new version: if_better (it beats the alias's "
        "version on the same validation metric and mode), always, or never",
    )
    log_models: Literal["best", "all"] = Field(
        "best",
        description="trial runs logged as MLflow python_function models (servable with "
        "mlflow models serve): the chosen trial only, or every finished trial",
    )
    system_metrics: bool = Field(
        True,
        description="MLflow system metrics (CPU, memory, disk, network; GPU with pynvml) on "
        "every trial run, sampled where the trial trains",
    )
    system_metrics_interval: float = Field(
        10.0, ge=0.5, description="seconds between two system-metric samples of a trial"
    )

    @field_validator("artifact_location")
    @classmethod
    def _artifact_uri(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme, sep, rest = value.partition("://")
        if sep and (scheme.lower() not in ARTIFACT_SCHEMES or not rest.strip("/")):
            raise ValueError(
                f"must be a URI of an artifact store ({', '.join(ARTIFACT_SCHEMES)}) with a "
                f"location after '://', or an absolute folder, but got {value!r}"
            )
        if not sep and not Path(value).is_absolute():
            raise ValueError(
                "must be a URI (e.g. s3://bucket/mlflow) or an absolute folder (a relative one "
                f"would depend on where the search starts), but got {value!r}"
            )
        return value

    @field_validator("register_model")
    @classmethod
    def _registry_name(cls, value: bool | str) -> bool | str:
        if isinstance(value, str) and (not value.strip() or any(c in value for c in "/@:")):
            raise ValueError(
                f"a registered model name must be non-empty without '/', '@' or ':' (they "
                f"would break models:/NAME@alias URIs), but got {value!r}"
            )
        return value

    def registered_model_name(self, experiment: str) -> str | None:
        """The registry name the search registers under (None: not registered)."""
        if self.register_model is False:
            return None
        if self.register_model is True:
            return re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment).strip("-") or "raypeft"
        return self.register_model


class ReplayConfig(StrictModel):
    """``resources.trial_runner: replay``: trials report a recorded learning-curve table's
    values instead of training (``raypeft table`` writes such tables)."""

    table: str | None = Field(
        None,
        description="a learning-curve table (JSON, from `raypeft table`) holding a curve for "
        "every configuration the space can propose; required with trial_runner: replay",
    )
    time_scale: float = Field(
        0.01,
        ge=0,
        description="each evaluation is reported after its recorded seconds times this: 1 as "
        "recorded, 0.01 a 4-minute trial in 2.4 s, 0 at once",
    )


class RunConfig(StrictModel):
    """Where Ray keeps results and checkpoints, and how trials survive failures."""

    storage_path: str | None = Field(
        None,
        description="Ray results and checkpoints: a local folder or a URI shared by every "
        "node (s3://bucket/path) (default: $RAYPEFT_STORAGE_PATH, else ~/ray_results)",
    )
    max_failures: int = Field(
        2,
        ge=-1,
        description="restarts of a trial whose worker dies (process killed, node lost), each "
        "from its latest checkpoint; -1: no limit. A diverging loss is never retried",
    )


class ExperimentConfig(StrictModel):
    """One experiment file: what to train, how, and what to search."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    budget_params: int | None = Field(
        None,
        ge=1,
        description="one trainable-parameter budget for every method (task head excluded): "
        "each method derives its size knob from it",
    )
    method: RegisteredMethodConfig  # a registered method's config, told apart by `name`
    methods: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="settings of each method by name, used when the space chooses "
        "method.name (one experiment comparing methods)",
    )
    train: TrainConfig = TrainConfig()
    search: SearchConfig = SearchConfig()
    space: dict[str, SpaceParam] = Field(
        default_factory=dict, description="dotted config key -> distribution or grid"
    )
    resources: ResourcesConfig = ResourcesConfig()
    tracking: TrackingConfig = TrackingConfig()
    run: RunConfig = RunConfig()
    replay: ReplayConfig = ReplayConfig()

    @model_validator(mode="before")
    @classmethod
    def _budget_for_every_method(cls, data: Any) -> Any:
        # the experiment-wide budget is each method's budget_params
        if isinstance(data, dict) and data.get("budget_params") is not None:
            method = data.get("method")
            if isinstance(method, dict):
                data = {**data, "method": {**method, "budget_params": data["budget_params"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _seeds_join_the_space(cls, data: Any) -> Any:
        # search.seeds is the grid `train.seed: {grid: seeds}`: every configuration once per
        # seed. Written back into the space, so everything that reads the space sees it.
        search = data.get("search") if isinstance(data, dict) else None
        seeds = search.get("seeds") if isinstance(search, dict) else None
        if not isinstance(seeds, list):
            return data
        space = dict(data.get("space") or {})
        given = space.get(SEED_KEY)
        if given is None:
            space[SEED_KEY] = {"grid": list(seeds)}
        elif not (isinstance(given, dict) and given.get("grid") == seeds):
            raise ValueError(
                f"search.seeds: the seeds are given twice, as search.seeds and as space."
                f"{SEED_KEY}; keep one"
            )
        return {**data, "space": space}

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        known = method_config_classes()
        for name, settings in methods.items():
            if name not in known:
                raise ValueError(f"unknown method {name!r}; expected one of {sorted(known)}")
            if not isinstance(settings, dict) or "name" in settings:
                raise ValueError(f"`methods.{name}` must be a mapping of that method's settings")
        return methods

    @model_validator(mode="after")
    def _method_presets_validate(self) -> ExperimentConfig:
        for name in self.methods:
            config_cls = method_config_classes()[name]
            try:
                config_cls.model_validate(self.method_settings(name))
            except ValidationError as err:
                first = err.errors()[0]
                loc = _loc_text(list(first["loc"]))
                msg = (
                    "unknown key" + _key_hint(list(first["loc"]), config_cls, f"methods.{name}")
                    if first["type"] == "extra_forbidden"
                    else describe_error(first)
                )
                got = first.get("input")
                got_text = (
                    "" if first["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
                )
                raise ValueError(f"methods.{name}.{loc}: {msg}{got_text}") from None
        return self

    def method_settings(self, name: str) -> dict[str, Any]:
        """The method section a trial gets when it chooses method ``name``.

        ``methods[name]`` if given, else the ``method`` section when it names that method,
        else the method's defaults; the experiment's ``budget_params`` applies to each.
        """
        if name in self.methods:
            settings = {"name": name, **self.methods[name]}
        elif name == self.method.name:
            settings = self.method.model_dump(mode="json")
        else:
            settings = {"name": name}
        if self.budget_params is not None:
            settings["budget_params"] = self.budget_params
        return settings

    @field_validator("space", mode="before")
    @classmethod
    def _one_kind_per_key(cls, space: Any) -> Any:
        if not isinstance(space, dict):
            return space
        for key, entry in space.items():
            kinds = sorted(set(entry) & SPACE_KINDS) if isinstance(entry, dict) else []
            if len(kinds) != 1:
                found = f"got {kinds}" if kinds else f"got {entry!r}"
                raise ValueError(
                    f"`{key}` must have exactly one of {sorted(SPACE_KINDS)}, but {found}"
                )
        return space

    @model_validator(mode="after")
    def _sampler_fits_space(self) -> ExperimentConfig:
        sampler = self.search.sampler
        if self.search.seeds is not None and sampler != "grid":
            raise ValueError(
                f"search.seeds: every configuration runs once per seed, which needs "
                f"sampler: grid, but got sampler: {sampler}"
            )
        if sampler == "grid":
            for key, param in self.space.items():
                if param.listed() is None:
                    raise ValueError(
                        f"search.sampler: grid runs every combination of grid/choice keys, so "
                        f"every space key must be grid or choice, but space.{key} is "
                        "continuous; use choice, or another sampler"
                    )
                if is_conditional(key):
                    raise ValueError(
                        f"search.sampler: grid cannot run the conditional key space.{key} (it "
                        "is inactive in trials of other methods); use tpe or random"
                    )
            size = math.prod(len(p.listed()) for p in self.space.values())
            if self.search.num_samples > size:
                raise ValueError(
                    f"search.num_samples: {self.search.num_samples} trials exceed the "
                    f"{size} combinations sampler grid runs (each once)"
                )
        if sampler == "cmaes" and all(p.listed() is not None for p in self.space.values()):
            raise ValueError(
                "search.sampler: cmaes needs at least one uniform, loguniform or int space key "
                "(it samples the others at random)"
            )
        return self

    @model_validator(mode="after")
    def _batch_splits_over_workers(self) -> ExperimentConfig:
        workers = self.resources.workers_per_trial
        runner = self.resources.trial_runner
        if runner in ("in_process", "replay") and workers != 1:
            raise ValueError(
                "resources.workers_per_trial: `workers_per_trial == 1` must hold with "
                f"trial_runner: {runner} (it runs in the Tune trial itself), but got "
                f"workers_per_trial={workers}; use trial_runner: ray_train or auto for DDP"
            )
        if self.train.batch_size % workers:
            raise ValueError(
                f"train.batch_size: `batch_size % resources.workers_per_trial == 0` must hold "
                f"(DDP splits the global batch evenly over the workers), but got "
                f"batch_size={self.train.batch_size}, workers_per_trial={workers}"
            )
        return self

    @model_validator(mode="after")
    def _replay_has_a_table(self) -> ExperimentConfig:
        replaying = self.resources.trial_runner == "replay"
        if replaying and not self.replay.table:
            raise ValueError(
                "replay.table: resources.trial_runner: replay needs a learning-curve table "
                "(`raypeft table ... --out FILE`), but none was given"
            )
        if self.replay.table and not replaying:
            raise ValueError(
                f"replay.table: set ({self.replay.table}), but trials train "
                f"(resources.trial_runner: {self.resources.trial_runner}); set "
                "resources.trial_runner: replay, or leave replay.table out"
            )
        if replaying and self.resources.trials_per_worker > 1:
            raise ValueError(
                "resources.trials_per_worker: `trials_per_worker == 1` must hold with "
                f"trial_runner: replay (replayed trials do not train), but got "
                f"{self.resources.trials_per_worker}"
            )
        return self

    @model_validator(mode="after")
    def _fp16_needs_a_gpu(self) -> ExperimentConfig:
        # caught here rather than when every trial starts and fails on its CPU
        # use_gpu: auto may still find a GPU: the search refuses fp16 if it finds none
        if self.train.precision == "fp16" and not (self.resources.gpus or self.resources.gpu_auto):
            raise ValueError(
                "train.precision: fp16 needs a GPU (resources.use_gpu or gpus_per_worker > 0), "
                "but the trials run on CPUs; use bf16 or auto there"
            )
        return self

    def configuration_of(self, trial_config: dict[str, Any]) -> str:
        """The :func:`configuration_key` of a trial's config (its searched keys only)."""
        return configuration_key({k: v for k, v in trial_config.items() if k in self.space})

    def grid_keys(self) -> list[str]:
        return [k for k, p in self.space.items() if p.joint]

    def grid_size(self) -> int:
        """How many combinations the joint grid has (computed, not enumerated)."""
        keys = self.grid_keys()
        return math.prod(len(self.space[k].listed()) for k in keys) if keys else 0

    def space_candidates(self, max_int_values: int = 64) -> dict[str, list[Any]]:
        """Values of each searched key worth resolving before a search: every grid/choice
        value, every value of a short int range (else its ends), the ends of a float range."""
        return {k: p.candidates(max_int_values) for k, p in self.space.items()}

    def most_evaluations(self) -> int:
        """The most evaluations a trial of this search makes (the schedulers count them; the
        schedulers' ``max_t``): the longest ``train.max_steps`` over the shortest
        ``train.eval_every`` the space can give; a shorter trial ends at its own length."""
        steps, every = self.space.get("train.max_steps"), self.space.get("train.eval_every")
        longest = steps.largest() if steps else self.train.max_steps
        most_often = every.smallest() if every else self.train.eval_every
        return math.ceil(longest / most_often)

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the ``grid`` keys (the joint grid), in file order."""
        keys = self.grid_keys()
        if not keys:
            return []
        values = [self.space[k].listed() for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


# A method registered after this module is imported (a plugin) joins the `method` union too.
on_method_registered(lambda: ExperimentConfig.model_rebuild(force=True))


def apply_trial_params(cfg: ExperimentConfig, params: dict[str, Any]) -> ExperimentConfig:
    """The experiment config of one trial: the file with the sampled values put in place.

    A sampled ``method.name`` first swaps in that method's settings (``methods``), so the
    other sampled ``method.*`` keys land on the chosen method.
    """
    data = cfg.model_dump(mode="json")
    if "budget_params" in params:
        data["budget_params"] = params["budget_params"]
    if "method.name" in params:
        chosen = cfg.model_copy(update={"budget_params": data["budget_params"]})
        data["method"] = chosen.method_settings(params["method.name"])
    chosen = data["method"]["name"]
    for key, value in params.items():
        if is_conditional(key):
            _, name, knob = key.split(".", 2)
            if name == chosen:  # a knob of a method this trial did not choose is inactive
                set_dotted(data, f"method.{knob}", value)
        elif key != "method.name":
            set_dotted(data, key, value)
    return ExperimentConfig.model_validate(data)


def experiment_json_schema() -> dict[str, Any]:
    """JSON schema of an experiment file (editors complete and check the YAML with it)."""
    schema = ExperimentConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "raypeft experiment"
    # the name defaults to the file's stem when the file leaves it out
    schema["required"] = [k for k in schema.get("required", []) if k != "name"]
    return schema


# ----------------------------------------------------------------------------- a trial's
# Tune config: the sampled settings, plus records that are not settings

DERIVED_PREFIX = "derived."  # values computed from the sampled ones (DePT's rank, the count)
REPEAT_PREFIX = "repeat."  # a re-run of a top configuration with another seed (repeat_best)
REPEAT_OF = f"{REPEAT_PREFIX}of"  # the trial id a repeat re-trains


def trial_config(cfg: ExperimentConfig, tune_config: dict[str, Any]) -> ExperimentConfig:
    """A trial's full config from Tune's flat ``{key: value}`` (derived and repeat records
    dropped)."""
    sampled = {
        k: v for k, v in tune_config.items() if not k.startswith((DERIVED_PREFIX, REPEAT_PREFIX))
    }
    return apply_trial_params(cfg, sampled)
