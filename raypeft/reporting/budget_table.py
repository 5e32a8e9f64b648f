"""What ``raypeft budget`` prints: every method's settings that fit one parameter budget.

Each registered method answers through ``MethodConfig.budget_options`` (and
``budget_options_at`` for ``-m``), in registration order; this module only works out the
budget and the backbone's shapes (flags, a model's config, an experiment file).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raypeft.config.schema import ExperimentConfig, ModelConfig
from raypeft.methods import METHODS, BackboneDims, MethodConfig
from raypeft.methods.base import BudgetOption
from raypeft.methods.sizing import soft_prompt_params

# T5-base: DePT's reference shapes (the encoder's layers, where prompts go)
DEFAULT_DIMS = BackboneDims(
    hidden_size=768, num_layers=12, vocab_size=32128, max_length=256, kind="seq2seq", num_heads=12
)
DEFAULT_PT_LENGTH = 100


@dataclass
class BudgetRequest:
    """The command line: a budget (-l or --params), shapes, and which methods to list."""

    prompt_length: int | None = None
    params: int | None = None
    max_length: int | None = None
    hidden_size: int | None = None
    layers: int | None = None
    vocab_size: int | None = None
    model: str | None = None
    methods: list[str] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)  # -m: for methods chosen by length


def request_dims(req: BudgetRequest, cfg: ExperimentConfig | None) -> BackboneDims:
    """The backbone's shapes: flags override the model's (or the experiment's) config."""
    # why: with the backbone import below
    from dataclasses import replace

    # why: transformers loads only when `raypeft budget` runs
    from raypeft.modeling.backbones import backbone_dims, load_config

    model = req.model or (cfg.model.name if cfg else None)
    max_length = req.max_length or (cfg.model.max_length if cfg else None)
    if model is not None:
        config = load_config(ModelConfig(name=model), 2, "classification")
        dims = backbone_dims(config, max_length or DEFAULT_DIMS.max_length, model)
    else:
        dims = replace(DEFAULT_DIMS, max_length=max_length or DEFAULT_DIMS.max_length)
    changes = {
        "hidden_size": req.hidden_size,
        "num_layers": req.layers,
        "vocab_size": req.vocab_size,
    }
    dims = replace(dims, **{k: v for k, v in changes.items() if v is not None})
    if req.hidden_size is not None and dims.hidden_size % dims.num_heads:
        dims = replace(dims, num_heads=1, kv_heads=None)  # only the width was given
    return dims


def _method_configs(req: BudgetRequest, cfg: ExperimentConfig | None) -> list[MethodConfig]:
    names = req.methods or list(METHODS)  # registration order: the methods' family tree
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"--method: unknown method {unknown[0]!r}; expected {sorted(METHODS)}")
    configs = []
    for name in names:
        settings = cfg.method_settings(name) if cfg else {"name": name}
        # the budget comes from the command line; the method's own budget keys step aside
        settings = {k: v for k, v in settings.items() if not k.startswith("budget_")}
        settings["budget_params"] = 1
        configs.append(METHODS[name].config_cls.model_validate(settings))
    return configs


def budget_rows(
    req: BudgetRequest, cfg: ExperimentConfig | None = None
) -> tuple[str, list[tuple[str, str, int | None, int | None]]]:
    """A header line and ``(method, settings, params, slack)`` rows (params None: no fit)."""
    dims = request_dims(req, cfg)
    if req.params is not None:
        budget, what = req.params, f"{req.params:,} trainable parameters"
    else:
        length = req.prompt_length or _file_prompt_length(cfg) or DEFAULT_PT_LENGTH
        budget = soft_prompt_params(length, dims.hidden_size)
        what = f"{budget:,} trainable parameters (PT with l={length}, d={dims.hidden_size})"
        if cfg is not None and cfg.budget_params is not None and req.prompt_length is None:
            budget, what = cfg.budget_params, f"{cfg.budget_params:,} trainable parameters"
    header = (
        f"Budget: {what}; backbone d={dims.hidden_size}, N={dims.num_layers}, "
        f"V={dims.vocab_size:,}, s={dims.max_length} ({dims.kind})"
    )
    rows: list[tuple[str, str, int | None, int | None]] = []
    for method in _method_configs(req, cfg):
        options = _options(method, budget, dims, req.prompt_lengths)
        if not options:
            rows.append((method.name, "no setting fits this budget", None, None))
        for opt in options:
            settings = " ".join(f"{k}={v}" for k, v in opt.settings.items())
            rows.append((method.name, settings, opt.params, opt.slack))
    return header, rows


def _options(
    method: MethodConfig, budget: int, dims: BackboneDims, lengths: list[int]
) -> list[BudgetOption]:
    """The method's settings that fit; with ``-m`` lengths, those the method lists for them."""
    if lengths:
        try:
            chosen = method.budget_options_at(budget, dims, lengths)
        except ValueError as exc:
            raise ValueError(f"-m: {exc}") from None
        if chosen is not None:
            return chosen
    return method.budget_options(budget, dims)


def _file_prompt_length(cfg: ExperimentConfig | None) -> int | None:
    """The experiment's budget, when its method sets it as a PT length."""
    return cfg.method.budget_length() if cfg else None
