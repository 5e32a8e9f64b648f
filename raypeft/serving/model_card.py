"""The README.md of an exported peft adapter: a model card a Hugging Face user can act on.

It says what the adapter sits on (base model and the transformers class to load it with),
what it predicts (labels and ``id2label``), how inputs must be prepared (``max_length``,
padding side, text pairs), in which precision raypeft computed and how to reproduce peft's
numbers with ``raypeft predict``, and gives a Python snippet that runs as written: it loads
the base model, applies the adapter and classifies :data:`SNIPPET_TEXTS`, printing what
``raypeft predict --precision fp32`` prints (``label<TAB>score<TAB>text``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raypeft.config.schema import ExperimentConfig

SNIPPET_TEXTS = ("what a wonderful day, I loved every minute of it", "terrible service.")
SNIPPET_PAIRS = ("it was a great day", "the service was bad")


def model_card(
    cfg: ExperimentConfig, meta: dict[str, Any], config: Any, kind: str, out: Path, tiny: bool
) -> str:
    """The card for the adapter written to ``out`` (``config``: peft's config object;
    ``kind``: encoder, decoder or seq2seq; ``tiny``: a raypeft test backbone, not on the Hub)."""
    peft_type, task_type = _value(config.peft_type), _value(config.task_type)
    base = config.base_model_name_or_path
    lines = [
        f"# {peft_type} adapter for `{cfg.model.name}`: {meta['name']}",
        "",
        "Exported by raypeft, verified on export: peft loads it onto the base model and "
        "computes what raypeft computes (prompt, head, logits).",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{base}`{_revision(cfg)}{_alias(cfg, base, tiny)} |",
        f"| model class | `{_model_class(kind, tiny)}` (peft task_type `{task_type}`) |",
        f"| task | {meta['name']}: {meta['problem']}{_pair_note(meta)} |",
        f"| labels | {_labels_cell(meta)} |",
        f"| inputs | padded and truncated to `max_length` {cfg.model.max_length} tokens, "
        f"padding on the {'left' if kind == 'decoder' else 'right'} |",
        f"| precision | adapter tensors float32; raypeft trained with `train.precision: "
        f"{cfg.train.precision}`. peft runs the adapter in float32: `raypeft predict "
        "--precision fp32` gives its numbers exactly |",
        f"| raypeft method | `{cfg.method.name}` |",
        "",
        "## Use it",
        "",
        "```python",
        *_snippet(cfg, meta, kind, out, tiny, base),
        "```",
    ]
    if kind == "decoder":
        lines += [
            "",
            "Decoder note: raypeft numbers positions over real tokens only; peft ignores "
            "position ids, so batched left-padded inputs can differ slightly from raypeft's; "
            "one text at a time they agree.",
        ]
    return "\n".join(lines) + "\n"


def id2label(meta: dict[str, Any]) -> dict[int, str]:
    """Class id to name, as transformers configs hold it (ids as text without names)."""
    names = meta.get("label_names") or meta.get("verbalizers") or []
    return {i: str(names[i]) if i < len(names) else str(i) for i in range(meta["num_labels"])}


def _value(enum_or_str) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))


def _revision(cfg: ExperimentConfig) -> str:
    return f" (revision `{cfg.model.revision}`)" if cfg.model.revision else ""


def _alias(cfg: ExperimentConfig, base: str, tiny: bool) -> str:
    if tiny:
        return f": `{cfg.model.name}`, a randomly initialised raypeft test model (not on the Hub)"
    if base != cfg.model.name:  # a packaged alias: ``base`` is the Hub id it copies
        return f" (raypeft's `{cfg.model.name}` is a packaged copy of it)"
    return ""


def _packaged_copy(cfg: ExperimentConfig) -> list[str]:
    """Snippet lines that load a packaged alias's local copy where its package is installed
    (offline too), else the Hub id ``BASE`` already holds."""
    # why: transformers loads only when exporting
    from raypeft.modeling.backbones import PACKAGED_MODULES

    module = PACKAGED_MODULES.get(cfg.model.name)
    if module is None:
        return []
    return [
        f"try:  # the packaged copy raypeft's `{cfg.model.name}` is, where installed",
        f"    import {module}",
        f"    BASE = {module}.get_model_path()",
        "except ImportError:",
        "    pass",
    ]


def _model_class(kind: str, tiny: bool) -> str:
    if tiny:
        return "raypeft.modeling.backbones.load_backbone(...).model"
    auto = "AutoModelForSeq2SeqLM" if kind == "seq2seq" else "AutoModelForSequenceClassification"
    return f"transformers.{auto}"


def _pair_note(meta: dict[str, Any]) -> str:
    return " on text pairs (text, text_pair)" if meta.get("text_pair") else ""


def _labels_cell(meta: dict[str, Any]) -> str:
    if meta["problem"] != "classification":
        return "one regression value"
    return f"{meta['num_labels']}, `id2label` `{json.dumps(id2label(meta))}`"


def _snippet(
    cfg: ExperimentConfig, meta: dict[str, Any], kind: str, out: Path, tiny: bool, base: str
) -> list[str]:
    """Python lines that load the base model and this adapter and classify two texts."""
    lines = ["import torch", "from peft import PeftModel"]
    lines += _load_base(cfg, meta, kind, tiny, base)
    lines += [
        f"model = PeftModel.from_pretrained(base, {str(out)!r}).eval()",
        f"texts = {list(SNIPPET_TEXTS)!r}",
    ]
    pairs = f", {list(SNIPPET_PAIRS)!r}" if meta.get("text_pair") else ""
    if kind == "seq2seq":
        return lines + _seq2seq_lines(cfg, pairs)
    lines += [
        _tokenize_line(cfg, pairs),
        "with torch.no_grad():",
        "    logits = model(**inputs).logits",
    ]
    if meta["problem"] != "classification":
        return lines + [
            "for text, value in zip(texts, logits[:, 0]):",
            "    print(f'{float(value):.4f}\\t{float(value):.4f}\\t{text}')",
        ]
    return lines + [
        "probabilities = logits.softmax(-1)",
        "for text, p in zip(texts, probabilities):",
        "    label = base.config.id2label[int(p.argmax())]",
        "    print(f'{label}\\t{float(p.max()):.4f}\\t{text}')",
    ]


def _tokenize_line(cfg: ExperimentConfig, pairs: str) -> str:
    """The snippet's tokenizer call: padded and cut as the model was trained, returning torch
    tensors (transformers' own name for them)."""
    from transformers.utils import TensorType  # why: the card is written after training

    return (
        f"inputs = tokenizer(texts{pairs}, padding='max_length', truncation=True, "
        f"max_length={cfg.model.max_length}, return_tensors={TensorType.PYTORCH.value!r})"
    )


def _seq2seq_lines(cfg: ExperimentConfig, pairs: str) -> list[str]:
    return [
        _tokenize_line(cfg, pairs),
        "with torch.no_grad():",
        "    written = model.generate(**inputs, max_new_tokens=8)",
        "for text, label in zip(texts, tokenizer.batch_decode(written, skip_special_tokens=True)):",
        "    print(f'{label}\\t-\\t{text}')",
    ]


def _load_base(
    cfg: ExperimentConfig, meta: dict[str, Any], kind: str, tiny: bool, source: str
) -> list[str]:
    """Lines that build ``base`` (the base model with its label settings) and ``tokenizer``."""
    labels = id2label(meta) if meta["problem"] == "classification" else None
    if tiny:
        return [
            "from raypeft.config.schema import ModelConfig",
            "from raypeft.modeling.backbones import load_backbone, load_tokenizer",
            f"spec = ModelConfig(name={cfg.model.name!r}, max_length={cfg.model.max_length})",
            f"base = load_backbone(spec, {meta['num_labels']}, {meta['problem']!r}, "
            f"seed={cfg.train.seed}).model",
            f"base.config.id2label = {labels!r}",
            f"tokenizer = load_tokenizer({cfg.model.name!r})",
        ]
    auto = "AutoModelForSeq2SeqLM" if kind == "seq2seq" else "AutoModelForSequenceClassification"
    revision = f", revision={cfg.model.revision!r}" if cfg.model.revision else ""
    lines = [
        f"from transformers import {auto}, AutoTokenizer",
        "from transformers.utils import logging",
        "",
        "logging.set_verbosity_error()  # the base's head is new here: the adapter holds it",
        f"BASE = {source!r}",
        *_packaged_copy(cfg),
        f"tokenizer = AutoTokenizer.from_pretrained(BASE{revision}, "
        f"padding_side={'left' if kind == 'decoder' else 'right'!r})",
    ]
    if kind == "seq2seq":
        return lines + [f"base = {auto}.from_pretrained(BASE{revision})"]
    settings = f"num_labels={meta['num_labels']}"
    if labels:
        label2id = {name: i for i, name in labels.items()}
        settings += f", id2label={labels!r}, label2id={label2id!r}"
    else:
        settings += ", problem_type='regression'"
    lines.append(f"base = {auto}.from_pretrained(BASE{revision}, {settings})")
    if kind == "decoder":
        lines += [
            "if tokenizer.pad_token is None:  # GPT-style models pad with end-of-sequence",
            "    tokenizer.pad_token = tokenizer.eos_token",
            "base.config.pad_token_id = tokenizer.pad_token_id",
        ]
    return lines
