"""Export a trained trial as a Hugging Face peft adapter, and check that peft loads it.

A method with an exact peft equivalent says so through its hooks
(:meth:`~raypeft.methods.base.MethodConfig.peft_type`, and
:meth:`~raypeft.methods.base.PromptMethod.peft_adapter` for the tensors in peft's layout and
peft's config settings); every other method's ``peft_type`` raises with the reason. This
module adds what every adapter shares: the task type, the base model, the head, the files,
and the verification. For seq2seq models raypeft prompts the encoder only:
``num_transformer_submodules: 1`` (peft's default of 2 would also prompt the decoder).

The trained task head (``classifier`` / ``score``) goes under peft's ``modules_to_save``
naming: ``base_model.<parameter name>`` in the file, ``modules_to_save`` in the config.

Where peft and raypeft differ: decoders (GPT-2, LLaMA). raypeft pads their inputs on the left
and numbers positions over the real tokens only (as ``generate`` does); peft drops
``position_ids`` for prompt learning and the backbone numbers every position, padding
included. On a left-padded row the real tokens therefore get positions shifted by the number
of pad tokens, and the logits differ. Without padding (one text at a time, or texts filling
``max_length``) both are identical, which is what the verification compares.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.serving.model_card import model_card

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
README = "README.md"
# safetensors metadata as peft writes it: the tensors' framework, PyTorch (not a method name)
WEIGHTS_METADATA = {"format": "pt"}
PEFT_INSTALL_HINT = "pip install 'raypeft[peft]'"

# Inputs the verification feeds both models: short, mid and one longer than any tiny
# max_length (so a decoder batch has an unpadded row).
SAMPLE_TEXTS = (
    "what a wonderful day, I loved every minute of it",
    "terrible service.",
    "ok",
    "the plot drags on and on, the acting is wooden, the music is loud and the ending makes "
    "no sense at all, yet somehow I could not stop watching until the very last scene",
)
SAMPLE_PAIRS = (
    "it was a great day",
    "the service was bad",
    "fine",
    "a long film that held my attention",
)
ATOL = 1e-5  # float32 logits of the same computation, possibly in another kernel order


class ExportVerificationError(RuntimeError):
    """peft loaded the adapter but something differs from the trained model."""


def require_peft() -> Any:
    """The peft module, or a one-line ConfigError telling how to install it."""
    try:
        # why: peft is an optional extra
        import peft
    except ImportError:
        raise ConfigError(
            f"exporting a peft adapter needs the peft package: {PEFT_INSTALL_HINT}"
        ) from None
    return peft


def peft_type_for(cfg: ExperimentConfig) -> str:
    """The peft type a trained method maps onto (ConfigError if none does)."""
    try:
        return cfg.method.peft_type()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_peft_takes_prefix(cfg: ExperimentConfig, model) -> None:
    """A ConfigError (one line) when the installed peft cannot hand this backbone a key/value
    prefix. peft (0.21.2, the newest on 2026-11-25) passes PREFIX_TUNING's keys and values as
    ``past_key_values`` and refuses a model whose forward declares no such argument
    (``PeftModelForSequenceClassification._prefix_tuning_forward``); transformers 5.24 renamed
    it ``cache`` (``past_key_values`` stays a deprecated alias until 5.40, which peft's
    signature check does not see). No upstream issue or fix existed when this was written."""
    if peft_type_for(cfg) != "PREFIX_TUNING":
        return
    # why: transformers loads only when exporting
    from raypeft.modeling.backbones import cache_argument

    if cache_argument(model.backbone) == "past_key_values":
        return
    raise ConfigError(
        f"method.style: kv exports to peft's PREFIX_TUNING, which peft {_version('peft')} "
        "hands the backbone as past_key_values, an argument transformers "
        f"{_version('transformers')}'s {type(model.backbone.base_model).__name__} no longer "
        "declares (renamed cache in 5.24); export it with transformers<5.24 (constraints.txt "
        "pins a set that does), or serve it with raypeft (predict, mlflow models serve)"
    )


def _version(package: str) -> str:
    return importlib.metadata.version(package)


def check_out_dir(out: Path, force: bool) -> None:
    """``out`` may be absent or empty; a non-empty folder only with ``force``."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {out}: folder is not empty (use --force to replace it)")


# ----------------------------------------------------------------------------- adapter


def _head_tensors(model) -> dict[str, torch.Tensor]:
    """The trained head's tensors by backbone parameter name (none for seq2seq)."""
    prefix = "head."
    return {
        k[len(prefix) :]: v for k, v in model.trainable_state_dict().items() if k.startswith(prefix)
    }


def _head_modules(names) -> list[str]:
    """peft ``modules_to_save`` entries: the modules owning the head parameters."""
    return sorted({name.rsplit(".", 1)[0] for name in names})


def expected_prompt(cfg: ExperimentConfig, model) -> torch.Tensor:
    """The trained prompt in peft's layout (its prompt embedding's weight)."""
    return model.method.peft_adapter().prompt_embeddings


def adapter_config(cfg: ExperimentConfig, meta: dict[str, Any], model) -> Any:
    """peft's config object for the trained model."""
    peft = require_peft()
    dims = model.dims
    task_type = "SEQ_2_SEQ_LM" if dims.kind == "seq2seq" else "SEQ_CLS"
    heads = _head_modules(_head_tensors(model)) or None
    return peft.get_peft_config(
        {
            "peft_type": peft_type_for(cfg),
            **model.method.peft_adapter().settings,
            "task_type": task_type,
            "base_model_name_or_path": base_model_id(cfg.model.name),
            "revision": cfg.model.revision,
            "inference_mode": True,
            "num_layers": dims.num_layers,
            "modules_to_save": heads,
            "num_transformer_submodules": 1,  # raypeft prompts a seq2seq model's encoder only
        }
    )


def base_model_id(name: str) -> str:
    """The base model as the adapter names it (``base_model_name_or_path``): the Hub id of a
    packaged alias (``minilm``: the Hub's all-MiniLM-L6-v2, not the package's folder in this
    environment), else ``model.name`` as given (a Hub id, a folder, a tiny test model)."""
    # why: transformers loads only when exporting
    from raypeft.modeling.backbones import HUB_IDS

    return HUB_IDS.get(name, name)


def adapter_tensors(cfg: ExperimentConfig, model) -> dict[str, torch.Tensor]:
    """``adapter_model.safetensors`` content, under peft's key names."""
    tensors = {"prompt_embeddings": expected_prompt(cfg, model)}
    for name, value in _head_tensors(model).items():
        tensors[f"base_model.{name}"] = value
    return tensors


def _value(enum_or_str) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))


def _tiny_names() -> set[str]:
    # why: transformers loads only when exporting
    from raypeft.modeling.backbones import TINY_CONFIGS

    return set(TINY_CONFIGS)


def write_adapter(
    folder: Path, cfg: ExperimentConfig, meta: dict[str, Any], model, out: Path
) -> Any:
    """Write the adapter files into ``folder`` (moved to ``out`` once verified, which its
    model card names); returns peft's config."""
    config = adapter_config(cfg, meta, model)
    config.save_pretrained(str(folder))  # adapter_config.json, as peft writes it
    save_file(adapter_tensors(cfg, model), str(folder / ADAPTER_WEIGHTS), WEIGHTS_METADATA)
    tiny = cfg.model.name in _tiny_names()
    (folder / README).write_text(model_card(cfg, meta, config, model.kind, out, tiny))
    _readable_as_umask_allows(folder)
    return config


def _readable_as_umask_allows(folder: Path) -> None:
    """Every file of the adapter with the mode the umask gives a new file (0644 under the
    usual 022): safetensors writes its file 0600, peft and Python write theirs by the umask."""
    umask = _umask()
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


# ----------------------------------------------------------------------------- verification


@dataclass
class Verification:
    """What was compared between peft's loaded adapter and raypeft's trained model."""

    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.lines.append(text)


def _fail(message: str) -> None:
    raise ExportVerificationError(message)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def verify_adapter(folder: Path, cfg: ExperimentConfig, meta: dict[str, Any], predictor) -> list:
    """Load ``folder`` with ``PeftModel.from_pretrained`` on a freshly built base model and
    compare it with the trained raypeft model. Raises ExportVerificationError on a mismatch;
    returns the lines describing what matched."""
    peft = require_peft()
    # why: transformers loads only when exporting
    from raypeft.modeling.backbones import load_backbone

    model = predictor.model
    report = Verification()
    # the base model as raypeft builds it (tiny random models: the same seed); the head is
    # zeroed so that a trained head can only come from the adapter file
    base = load_backbone(cfg.model, meta["num_labels"], meta["problem"], seed=cfg.train.seed).model
    trained_head = _head_tensors(model)
    with torch.no_grad():
        for name, param in base.named_parameters():
            if name in trained_head:
                param.zero_()
    peft_model = peft.PeftModel.from_pretrained(base, str(folder))
    peft_model.eval()
    report.add(
        f"peft {peft.__version__} loaded it: PeftModel.from_pretrained(base, out) -> "
        f"{type(peft_model).__name__} ({_value(peft_model.active_peft_config.peft_type)}, "
        f"{_value(peft_model.active_peft_config.task_type)})"
    )

    loaded = peft_model.prompt_encoder[peft_model.active_adapter].embedding.weight.detach().cpu()
    expected = expected_prompt(cfg, model)
    if loaded.shape != expected.shape or not torch.equal(loaded.float(), expected):
        _fail(
            f"peft's prompt embeddings {tuple(loaded.shape)} differ from the trained ones "
            f"{tuple(expected.shape)}"
        )
    what = model.method.peft_adapter().what
    report.add(f"  {what}: peft's embedding {tuple(loaded.shape)} equals the trained tensor")

    if trained_head:
        params = dict(peft_model.base_model.named_parameters())
        for name, value in trained_head.items():
            module, leaf = name.rsplit(".", 1)
            key = f"{module}.modules_to_save.{peft_model.active_adapter}.{leaf}"
            if key not in params:
                _fail(f"peft did not wrap the head parameter {name} as {key}")
            if not torch.equal(params[key].detach().cpu(), value):
                _fail(f"peft's head parameter {key} differs from the trained {name}")
        report.add(
            f"  head ({', '.join(_head_modules(trained_head))}): "
            f"{len(trained_head)} tensors equal the trained head"
        )
    _compare_outputs(peft_model, predictor, meta, report)
    return report.lines


def _sample_inputs(meta):
    pairs = list(SAMPLE_PAIRS) if meta.get("text_pair") else None
    return list(SAMPLE_TEXTS), pairs


@torch.no_grad()
def _compare_outputs(peft_model, predictor, meta, report: Verification) -> None:
    texts, pairs = _sample_inputs(meta)
    batch = predictor.inputs(texts, pairs)
    batch = {k: v.cpu() for k, v in batch.items() if k != "features"}
    model = predictor.model
    kind = model.kind
    if kind == "seq2seq":
        _compare_seq2seq(peft_model, predictor, batch, report)
        return
    ours = torch.as_tensor(model.predict(**batch))
    mask = batch["attention_mask"]
    padded = (mask == 0).any(1)
    if kind == "encoder":
        theirs = peft_model(**batch).logits.float()
        diff = _max_diff(theirs, ours)
        if diff > ATOL:
            _fail(f"peft's logits differ from raypeft's by up to {diff:.3g}")
        report.add(
            f"  logits on {len(texts)} sample inputs (right-padded batch): "
            f"max |peft - raypeft| = {diff:.2g}"
        )
        return
    # decoders: compare each input without padding; report the padded batch's difference
    rows = []
    for i in range(len(texts)):
        keep = mask[i] == 1
        ids = batch["input_ids"][i][keep].unsqueeze(0)
        rows.append(peft_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0])
    theirs = torch.stack(rows).float()
    diff = _max_diff(theirs, ours)
    if diff > ATOL:
        _fail(f"peft's logits on unpadded inputs differ from raypeft's by up to {diff:.3g}")
    report.add(
        f"  logits on {len(texts)} sample inputs, each fed to peft without padding: "
        f"max |peft - raypeft| = {diff:.2g}"
    )
    batched = peft_model(input_ids=batch["input_ids"], attention_mask=mask).logits.float()
    full = ~padded
    same_full = _max_diff(batched[full], ours[full]) if full.any() else 0.0
    if same_full > ATOL:
        _fail(f"peft's logits on unpadded rows of a batch differ by up to {same_full:.3g}")
    if padded.any():
        off = _max_diff(batched[padded], ours[padded])
        same = f"rows without padding equal (max diff {same_full:.2g}); " if full.any() else ""
        report.add(
            f"  the same left-padded batch in peft: {same}padded rows differ by up to "
            f"{off:.2g}, because peft numbers positions over the padding (raypeft over real "
            "tokens only)"
        )


def _compare_seq2seq(peft_model, predictor, batch, report: Verification) -> None:
    model, meta = predictor.model, predictor.meta
    tokenizer = model.tokenizer
    words = (meta.get("verbalizers") or ["0.0"])[0]
    target = torch.as_tensor(tokenizer([words])["input_ids"]).repeat(len(batch["input_ids"]), 1)
    ours = model(**batch, target_ids=target).logits.float()
    theirs = peft_model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=target
    ).logits.float()
    diff = _max_diff(theirs, ours)
    if diff > ATOL:
        _fail(f"peft's decoder logits differ from raypeft's by up to {diff:.3g}")
    report.add(
        f"  decoder logits (teacher-forced on {words!r}) on {len(target)} sample inputs: "
        f"max |peft - raypeft| = {diff:.2g}"
    )
    # why: torch loads only when verifying an export
    from raypeft.modeling.prompted import text_predictions

    ours_pred = model.predict(**batch, scoring="generate")  # peft's side can only generate
    longest = max(len(tokenizer(v)["input_ids"]) for v in (meta.get("verbalizers") or ["0.0"]))
    generated = peft_model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=(longest if meta.get("verbalizers") else 8) + 1,
        do_sample=False,
        num_beams=1,
    )
    texts = [t.strip() for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    theirs_pred = text_predictions(texts, model.verbalizers)
    if not np.array_equal(ours_pred, theirs_pred, equal_nan=ours_pred.dtype.kind == "f"):
        _fail(f"peft's generated labels {theirs_pred} differ from raypeft's {ours_pred}")
    report.add("  generated labels (greedy): equal")


# ----------------------------------------------------------------------------- export


@dataclass
class ExportResult:
    out: Path
    peft_type: str
    task_type: str
    files: dict[str, str]  # file name -> what it holds
    checks: list[str]


def export_peft(model_folder: Path, out: Path, *, force: bool = False) -> ExportResult:
    """Write a peft adapter for the trained model in ``model_folder`` to ``out``, verified.

    The adapter is written to a temporary folder beside ``out`` and renamed into place only
    once peft has loaded it and matched the trained model: a failed export leaves nothing.
    """
    require_peft()
    # why: torch loads only when verifying an export
    from raypeft.serving.predict import Predictor, read_config

    out = Path(out).expanduser().absolute()
    check_out_dir(out, force)
    peft_type_for(read_config(model_folder))  # before loading any model
    # peft runs the exported (float32) tensors in fp32: verify against raypeft in fp32 too
    predictor = Predictor.from_folder(model_folder, device="cpu", precision="fp32")
    cfg, meta, model = predictor.cfg, predictor.meta, predictor.model
    if model.head_pooling == "mean":
        raise ConfigError(
            f"model.head_pooling: this model's head reads the mean of its input tokens "
            f"({cfg.model.head_pooling} resolved to mean); peft's heads read the first "
            "position, so only a model trained with model.head_pooling: first exports"
        )
    check_peft_takes_prefix(cfg, model)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        staging.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would make the export private
        config = write_adapter(staging, cfg, meta, model, out)
        with warnings.catch_warnings():  # peft warns about ignored position ids etc.
            warnings.simplefilter("ignore")
            checks = verify_adapter(staging, cfg, meta, predictor)
        _move_into_place(staging, out, force)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    tensors = adapter_tensors(cfg, model)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in tensors.items())
    files = {
        ADAPTER_CONFIG: (
            f"{_value(config.peft_type)}, task_type {_value(config.task_type)}, "
            f"num_virtual_tokens {config.num_virtual_tokens}, base model "
            f"{config.base_model_name_or_path}"
        ),
        ADAPTER_WEIGHTS: shapes,
        README: "model card: base model and class, labels, inputs, precision, a snippet",
    }
    return ExportResult(out, _value(config.peft_type), _value(config.task_type), files, checks)


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _move_into_place(staging: Path, out: Path, force: bool) -> None:
    check_out_dir(out, force)  # again: something may have appeared meanwhile
    old = None
    if out.is_dir():
        if any(out.iterdir()):
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rmdir(old)
            out.rename(old)
        else:
            out.rmdir()
    try:
        staging.rename(out)
    except OSError:
        if old is not None:  # put the previous folder back
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
