"""A frozen backbone plus a prompt method: the module a trial trains.

The model is the only place that knows the backbone's kind: it feeds the method's inputs to
a classification/regression head (encoders, decoders) or to a seq2seq model that writes the
label as text, and installs the per-layer hooks of methods with deep prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from raypeft.methods import MethodConfig, PromptMethod, build_method
from raypeft.modeling.backbones import Backbone, backbone_arguments, transformer_layers
from raypeft.modeling.dropout import set_dropout_rate, trains_with_dropout
from raypeft.modeling.head_pooling import (
    head_style,
    input_mean,
    pooled_logits,
    resolve_head_pooling,
)
from raypeft.modeling.precision import autocast
from raypeft.modeling.seq2seq_scoring import rank_predictions, verbalizer_ids

TRAINABLE_FILE = "trainable.safetensors"


@dataclass
class PromptedOutput:
    """``logits``: head outputs ``(batch, labels)``, or ``(batch, target, vocab)`` for seq2seq;
    ``loss``: the training loss when the batch has labels."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class PromptedModel(nn.Module):
    """Runs ``method.prepare_inputs`` then the frozen backbone with its task head.

    The backbone runs in ``precision`` (:mod:`raypeft.modeling.precision`, set by
    :func:`raypeft.modeling.build.build_model`); the method's own computation, the head's
    loss and the logits returned for a head stay float32.

    ``backbone_dropout`` (``train.backbone_dropout``; :mod:`raypeft.modeling.dropout`): in
    training mode the backbone's dropout runs at its config's rates (``"config"``), at a given
    rate, or not at all (``0``: the backbone stays in eval mode). Evaluation is always
    without dropout.

    ``head_pooling`` (``model.head_pooling``; :mod:`raypeft.modeling.head_pooling`): the head
    reads the position transformers' head reads (``first``), or the mean of the input's own
    token states (``mean``; ``auto`` picks it for mean-pooling sentence encoders).
    """

    def __init__(
        self,
        backbone: Backbone,
        method_config: MethodConfig,
        *,
        backbone_dropout: float | str = "config",
        head_pooling: str = "first",
    ):
        super().__init__()
        self.backbone = backbone.model
        self.dims = backbone.dims
        self.head_pooling = resolve_head_pooling(head_pooling, backbone.dims)
        self.head_style = head_style(self.backbone) if self.head_pooling == "mean" else None
        resolved = method_config.resolve(backbone.dims)
        resolved.check_backbone(backbone.dims)
        resolved.warm_up(backbone)  # artefacts the driver built, unless this machine lacks them
        # prompts starting from vocabulary rows or a text read the tokenizer (a backbone built
        # by hand, without a model name, has none: benchmarks)
        tokenizer = backbone.tokenizer() if backbone.dims.model_name else None
        self.method: PromptMethod = build_method(
            resolved, backbone.dims, backbone.word_embeddings, tokenizer
        )
        self.backbone_dropout = backbone_dropout
        if isinstance(backbone_dropout, float) and trains_with_dropout(backbone_dropout):
            set_dropout_rate(self.backbone, backbone_dropout)  # this trial's own modules
        self._head_names = {name for name, p in self.backbone.named_parameters() if p.requires_grad}
        self.verbalizers: list[str] | None = None  # seq2seq classes as text (set by build_model)
        self.tokenizer = None  # seq2seq: decodes generated labels (set by build_model)
        # seq2seq classification: generate the label, or rank the verbalizers (build_model
        # sets task.seq2seq_scoring; modeling/seq2seq_scoring.py)
        self.seq2seq_scoring = "generate"
        self.precision = "fp32"  # what the backbone computes in (set by build_model)
        if self.method.uses_layer_prompts:
            self._install_layer_hooks()

    @property
    def kind(self) -> str:
        return self.dims.kind

    def _install_layer_hooks(self) -> None:
        # Deep prompts: at the input of layers 1..N-1 the method's vectors replace the prompt
        # positions [0, t). Layer 0 gets its prompt from prepare_inputs (prepended).
        for index, layer in enumerate(transformer_layers(self.backbone)):
            if index > 0:
                layer.register_forward_pre_hook(self._layer_hook(index), with_kwargs=True)

    def _layer_hook(self, index: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            prompt = self.method.layer_prompt(index, hidden)
            if prompt is None:
                return None
            t = prompt.shape[1]
            prompt = prompt.to(hidden.dtype).expand(hidden.shape[0], -1, -1)
            hidden = torch.cat([prompt, hidden[:, t:]], dim=1)
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        return hook

    def backbone_inputs(
        self, input_ids, attention_mask, token_type_ids=None, features=None
    ) -> dict:
        """The method's keyword inputs for the backbone (plus decoder position ids)."""
        embed = self.backbone.get_input_embeddings()
        kwargs = self.method.prepare_inputs(
            input_ids, attention_mask, token_type_ids, embed, features or {}
        )
        if self.kind == "decoder":
            # inputs are left-padded (and may follow prompt positions or key/value prefixes):
            # count positions over real tokens only, as generate() does
            mask = kwargs["attention_mask"]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs["position_ids"] = positions[:, -kwargs["inputs_embeds"].shape[1] :]
        return kwargs

    def forward(
        self,
        input_ids,
        attention_mask,
        token_type_ids=None,
        labels=None,
        target_ids=None,
        features=None,
    ) -> PromptedOutput:
        kwargs = self.backbone_inputs(input_ids, attention_mask, token_type_ids, features)
        if self.kind == "seq2seq":
            if target_ids is None:
                raise ValueError("a seq2seq backbone needs target_ids (the labels as text)")
            targets = target_ids.masked_fill(target_ids == self.backbone.config.pad_token_id, -100)
            with autocast(self.precision, input_ids.device):  # the loss is fp32 under autocast
                out = self.backbone(**kwargs, labels=targets)
            return PromptedOutput(logits=out.logits, loss=out.loss.float())
        logits = self._head_logits(kwargs, attention_mask)
        loss = None if labels is None else head_loss(logits, labels)
        return PromptedOutput(logits=logits, loss=loss)

    def _head_logits(self, kwargs: dict, input_mask: torch.Tensor) -> torch.Tensor:
        """The head's outputs for the backbone's inputs, in float32 whatever the precision
        (``input_mask``: the input's own attention mask, which ``mean`` pools over)."""
        with autocast(self.precision, input_mask.device):
            arguments = backbone_arguments(self.backbone, kwargs)
            if self.head_style is None:
                return self.backbone(**arguments).logits.float()
            hidden = self.backbone.base_model(**arguments)[0]
            pooled = input_mean(hidden, input_mask)
            return pooled_logits(self.backbone, self.head_style, pooled).float()

    @torch.no_grad()
    def predict(
        self, input_ids, attention_mask, token_type_ids=None, features=None, scoring=None, **_
    ):
        """Predictions for metrics: head outputs ``(batch, labels)`` for classification and
        regression heads; for seq2seq, the generated text mapped back to a class id (-1 when
        it names no class) or a float (NaN when it is not a number), or with ``scoring``
        ``rank`` (default: :attr:`seq2seq_scoring`) a classification task's likeliest class."""
        kwargs = self.backbone_inputs(input_ids, attention_mask, token_type_ids, features)
        if self.kind != "seq2seq":
            return self._head_logits(kwargs, attention_mask).cpu().numpy()
        if self.ranks(scoring):
            targets = verbalizer_ids(self.tokenizer, self.verbalizers)
            return rank_predictions(self.backbone, kwargs, targets, self.precision)
        with autocast(self.precision, input_ids.device):
            generated = self.backbone.generate(
                **kwargs, max_new_tokens=self.new_tokens(), do_sample=False, num_beams=1
            )
        return self.generated_predictions(generated)

    def ranks(self, scoring: str | None = None) -> bool:
        """Whether :meth:`predict` scores each verbalizer's likelihood (seq2seq ``rank``
        scoring of a classification task) rather than generating."""
        return (scoring or self.seq2seq_scoring) == "rank" and self.verbalizers is not None

    def new_tokens(self) -> int:
        """Seq2seq: how many tokens :meth:`predict` generates, the longest label's plus one
        (8 plus one for numbers)."""
        if self.verbalizers is None:
            return 9
        return max(len(self.tokenizer(v)["input_ids"]) for v in self.verbalizers) + 1

    def generated_predictions(self, generated: torch.Tensor) -> np.ndarray:
        """Seq2seq: the sequences ``generate`` wrote, as :meth:`predict` returns them."""
        texts = [
            t.strip() for t in self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        ]
        return text_predictions(texts, self.verbalizers)

    def train(self, mode: bool = True) -> PromptedModel:
        # Training mode reaches the frozen backbone and its head (BERT's and RoBERTa's heads
        # have dropout too) only to run their dropout, as the papers train; its weights never
        # change. backbone_dropout 0 keeps them in eval mode: no dropout, no random draws.
        super().train(mode)
        if not trains_with_dropout(self.backbone_dropout):
            self.backbone.eval()
        return self

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """The method's named groups plus ``head``."""
        groups = dict(self.method.param_groups())
        groups["head"] = [p for n, p in self.backbone.named_parameters() if n in self._head_names]
        return groups

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the tensors that train: ``method.*`` and ``head.*`` (backbone names)."""
        state = {f"method.{k}": v for k, v in self.method.state_dict().items()}
        for name, p in self.backbone.named_parameters():
            if name in self._head_names:
                state[f"head.{name}"] = p
        return {k: v.detach().cpu().contiguous() for k, v in state.items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = {k: v.shape for k, v in self.trainable_state_dict().items()}
        if set(state) != set(expected):
            missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
            raise ValueError(
                f"trainable tensors do not match: missing {missing}, unexpected {extra}"
            )
        wrong = [
            f"{k} {tuple(v.shape)} != {tuple(expected[k])}"
            for k, v in state.items()
            if v.shape != expected[k]
        ]
        if wrong:  # copy_ would broadcast a 1-label head into a 2-label one silently
            raise ValueError(f"trainable tensor shapes do not match: {', '.join(wrong)}")
        method_state = {k[len("method.") :]: v for k, v in state.items() if k.startswith("method.")}
        self.method.load_state_dict(method_state)
        params = dict(self.backbone.named_parameters())
        with torch.no_grad():
            for key, value in state.items():
                if key.startswith("head."):
                    params[key[len("head.") :]].copy_(value)

    def save_trainable(self, folder: Path) -> Path:
        path = Path(folder) / TRAINABLE_FILE
        save_file(self.trainable_state_dict(), str(path))
        return path

    def load_trainable(self, folder: Path) -> None:
        self.load_trainable_state_dict(load_file(str(Path(folder) / TRAINABLE_FILE)))


def head_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for classification heads, mean squared error for a regression head."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels)


def text_predictions(texts: list[str], verbalizers: list[str] | None) -> np.ndarray:
    """Generated label texts as class ids (-1: no class) or, without verbalizers, floats."""
    if verbalizers is not None:
        lookup = {v.strip().lower(): i for i, v in enumerate(verbalizers)}
        return np.array([lookup.get(t.lower(), -1) for t in texts], dtype=np.int64)
    values = []
    for text in texts:
        try:
            values.append(float(text.split()[0]))
        except (ValueError, IndexError):
            values.append(float("nan"))
    return np.array(values, dtype=np.float32)
