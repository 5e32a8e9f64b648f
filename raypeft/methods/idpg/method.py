"""IDPG (instance-dependent prompt generation): a small generator turns a sentence
representation ``M(x)`` into the example's own prompt, ``d_in → m → t·d`` with a nonlinearity.

The second layer's bias is a task prompt: with its weight at zero IDPG is prompt tuning.
``M(x)`` never depends on trained parameters, so the driver computes it once per example (the
backbone's pooled encoding of the un-prompted input, or averaged GloVe vectors) and every
trial reads it from ``features["sentence"]``.

- S-IDPG (``layers: single``): the prompt is prepended at the input only.
- M-IDPG (``layers: multi``): a prompt at every layer (the input layer's prepended, the
  others replacing the prompt positions' hidden states). Versions: ``S`` one generator for
  all layers; ``M`` one generator with a second-layer bias per layer (the paper's choice);
  ``L`` a generator per layer. Each layer's generator reads ``M(x)`` or, with
  ``generator_input: previous_layer``, the previous layer's output pooled over the real
  tokens; the input layer always reads ``M(x)``. When ``d_in != d`` (GloVe) and the input
  is the previous layer, the input layer keeps its own first generator layer (``d_in → m``)
  and the others share one reading ``d``: shared weights need one input width.

Initialisation: the second-layer bias (one per bias slot) starts from vocabulary embeddings
(``init_prompt``, as PT, seed ``init_seed + slot``), so S-IDPG starts next to the PT prompt
of the same seed; first layers are LeCun-normal (unit gain through tanh); second-layer
weights start small (the generated part is about a tenth of an embedding's scale), so every
parameter gets gradients from the first step yet the instance part starts as a nudge.
The nonlinearity defaults to tanh: bounded, so a large ``M(x)`` cannot blow the generated part
up (relu and gelu are available).

A.5's variants: ``residual`` adds the generator's input to every prompt vector; ``layer_norm``
normalises the prompt vectors (with both: normalise each part, add, normalise the sum), each
norm ``2·d`` parameters, shared like the generator (per layer in version ``L``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from raypeft.methods.base import (
    BackboneDims,
    BudgetOption,
    FeatureSpec,
    MethodConfig,
    PromptMethod,
    no_peft_equivalent,
    prepend_prompt,
    register_method,
)
from raypeft.methods.idpg import fused
from raypeft.methods.idpg.phm import PHMLinear, init_phm_a
from raypeft.methods.idpg.sentence_encoders import (
    BackboneEncoding,
    GloveEncoding,
    PoolingChoice,
    glove_width,
    pool,
    resolve_pooling,
)
from raypeft.methods.prompt_init import init_prompt

UP_INIT_SCALE = 0.1  # generated part / embedding scale at initialisation
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def idpg_params(
    hidden_size: int,
    input_size: int,
    prompt_length: int,
    generator_hidden: int,
    *,
    num_layers: int = 1,
    multi: bool = False,
    version: str = "M",
    generator: str = "dnn",
    phm_n: int = 1,
    shared_a: bool | None = None,
    previous_layer: bool = False,
    residual: bool = False,
    layer_norm: bool = False,
) -> int:
    """IDPG's generator ``d_in → m → t·d`` (idpg.txt §3, A.1.2); ``d_in = input_size``.

    A layer ``a → b`` holds ``a·b`` weights (DNN) or ``a·b/n`` (PHM's ``B`` set) plus its
    bias. Single-layer (S-IDPG): ``(d_in·m + m) + (m·t·d + t·d)``. Multi-layer (M-IDPG,
    ``N = num_layers`` prompts): version ``S`` shares everything, ``M`` gives each layer its
    own second-layer bias (``N·t·d``), ``L`` gives each layer its own generator. With
    ``previous_layer`` input and ``d_in != d`` the input layer keeps its own first layer
    (``d_in → m``) and the later layers share one reading ``d``. PHM adds ``n³`` per ``A`` set:
    one shared set (``shared_a``, default for S-IDPG) or one per PHM layer (default for
    M-IDPG). LayerNorm adds ``2·d`` per norm: one on the output, three with ``residual``
    (generated part, ``M(x)`` and their sum); one set, or one per layer in version ``L``.
    """
    d, d_in, t, m = hidden_size, input_size, prompt_length, generator_hidden
    layers = num_layers if multi else 1
    per_layer = multi and version == "L"
    if per_layer:
        down_inputs = [d_in] + [d if previous_layer else d_in] * (layers - 1)
    elif multi and previous_layer and d_in != d:
        down_inputs = [d_in, d]
    else:
        down_inputs = [d_in]
    ups = layers if per_layer else 1
    biases = layers if multi and version in ("M", "L") else 1

    def weights(size_in: int, size_out: int) -> int:
        if generator != "phm":
            return size_in * size_out
        if size_in % phm_n or size_out % phm_n:
            raise ValueError(
                f"`phm_n` must divide both sizes of a PHM layer, but got "
                f"(phm_n={phm_n}, in={size_in}, out={size_out})"
            )
        return (size_in // phm_n) * (size_out // phm_n) * phm_n

    total = sum(weights(w, m) + m for w in down_inputs)
    total += ups * weights(m, t * d) + biases * t * d
    if generator == "phm":
        share = (not multi) if shared_a is None else shared_a
        total += (1 if share else len(down_inputs) + ups) * phm_n**3
    if layer_norm:
        total += (layers if per_layer else 1) * (3 if residual else 1) * 2 * d
    return total


class IDPGConfig(MethodConfig):
    """IDPG's generator and where its prompts go. Defaults: the paper's M-IDPG-PHM
    (M version, previous-layer input, m=16, t=5, n=16).

    With ``budget_params``, ``generator_hidden`` is derived: the largest ``m`` (a multiple
    of ``phm_n`` for PHM) whose count fits the budget.
    """

    name: Literal["idpg"] = "idpg"
    prompt_length: int = Field(5, ge=1, description="t: prompt tokens generated (per layer)")
    generator_hidden: int = Field(
        16, ge=1, description="m: generator bottleneck width (derived with budget_params)"
    )
    generator: Literal["dnn", "phm"] = Field(
        "phm", description="dnn: plain linear layers; phm: W = Σ A_i ⊗ B_i (n³ + in·out/n)"
    )
    phm_n: int = Field(16, ge=1, description="n of the PHM layers: must divide d_in, m and t·d")
    phm_shared_a: bool | None = Field(
        None,
        description="one A set for every PHM layer (true) or one per PHM layer (false); "
        "null: the paper's convention (S-IDPG shares, M-IDPG does not)",
    )
    layers: Literal["single", "multi"] = Field(
        "multi", description="single: S-IDPG (input layer only); multi: M-IDPG (every layer)"
    )
    version: Literal["S", "M", "L"] = Field(
        "M",
        description="M-IDPG sharing: S one generator for all layers; M a second-layer bias "
        "per layer; L a generator per layer",
    )
    generator_input: Literal["sentence", "previous_layer"] = Field(
        "previous_layer",
        description="M-IDPG: each layer's generator reads M(x) or the previous layer's "
        "output pooled over the real tokens (the input layer always reads M(x))",
    )
    encoder: Literal["backbone", "glove"] = Field(
        "backbone", description="M(x): the frozen backbone's pooled encoding, or mean GloVe"
    )
    pooling: PoolingChoice = Field(
        "auto",
        description="how token states become one vector: the backbone encoder's M(x) and "
        "the previous layer's output (first/last real token, or masked mean). auto: the "
        "backbone's own pooling where it is a sentence encoder that declares one "
        "(sentence-transformers' pooling config: mean for the packaged MiniLM), else the "
        "paper's first token ([CLS], §4.5.1), or a decoder's last real token",
    )
    glove_path: str | None = Field(
        None,
        description="encoder glove: a GloVe text file (.gz ok) or .npy + word list; "
        "null: packaged GloVe 6B 50d (d_in=50)",
    )
    activation: Literal["tanh", "relu", "gelu"] = Field(
        "tanh", description="nonlinearity between the generator's layers (tanh: bounded)"
    )
    residual: bool = Field(
        False,
        description="add the generator's input (M(x), or the pooled previous layer) to every "
        "prompt vector (IDPG A.5; needs d_in = d)",
    )
    layer_norm: bool = Field(False, description="LayerNorm on the prompt vectors (IDPG A.5)")
    lr: float = Field(5e-3, gt=0, description="generator learning rate (paper grid 5e-3..1e-4)")
    init_seed: int = Field(0, description="seed of the generator's initialisation")

    @field_validator("glove_path")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        # trials run in their own folders: a relative path must not change meaning there
        return None if path is None else str(Path(path).expanduser().absolute())

    @model_validator(mode="after")
    def _phm_only(self) -> IDPGConfig:
        if self.phm_shared_a is not None and self.generator != "phm":
            raise ValueError(
                "`phm_shared_a` applies to PHM generators only, but got "
                f"(generator={self.generator!r}, phm_shared_a={self.phm_shared_a})"
            )
        return self

    @classmethod
    def examples(cls) -> dict[str, IDPGConfig]:
        small = {"prompt_length": 3, "generator_hidden": 8, "phm_n": 4, "lr": 0.02}
        return {
            "s-phm": cls(layers="single", **small),
            "m-phm-previous": cls(layers="multi", version="M", **small),
            "l-dnn-sentence": cls(
                layers="multi", version="L", generator="dnn", generator_input="sentence", **small
            ),
            "s-dnn-residual-norm": cls(
                layers="single", generator="dnn", residual=True, layer_norm=True, **small
            ),
            # packaged GloVe (d_in=50 != d): the input layer keeps its own first layer
            "glove-previous": cls(
                layers="multi", version="S", generator="dnn", encoder="glove", **small
            ),
            "budget": cls(layers="single", budget_params=1500, **small),
        }

    # ------------------------------------------------------------------ sizes and counts

    @property
    def multi(self) -> bool:
        return self.layers == "multi"

    def input_width(self, dims: BackboneDims) -> int:
        """``d_in``: the backbone's ``d``, or the GloVe file's width."""
        return dims.hidden_size if self.encoder == "backbone" else glove_width(self.glove_path)

    def shares_a(self) -> bool:
        """Whether all PHM layers share one A set (the paper: S-IDPG yes, M-IDPG no)."""
        return (not self.multi) if self.phm_shared_a is None else self.phm_shared_a

    def _count(self, dims: BackboneDims, d_in: int, m: int) -> int:
        return idpg_params(
            dims.hidden_size,
            d_in,
            self.prompt_length,
            m,
            num_layers=dims.num_layers,
            multi=self.multi,
            version=self.version,
            generator=self.generator,
            phm_n=self.phm_n,
            shared_a=self.shares_a(),
            previous_layer=self.generator_input == "previous_layer",
            residual=self.residual,
            layer_norm=self.layer_norm,
        )

    def _check_sizes(self, dims: BackboneDims, d_in: int, m: int | None) -> None:
        d, t = dims.hidden_size, self.prompt_length
        if self.residual and d_in != d:
            raise ValueError(
                "`residual` adds M(x) to every prompt vector, so `d_in == d` must hold, "
                f"but got (d_in={d_in}, d={d}); use encoder: backbone or residual: false"
            )
        if self.generator != "phm":
            return
        sizes = {"d_in": d_in, "t·d": t * d}
        if self.multi and self.generator_input == "previous_layer":
            sizes["d"] = d
        if m is not None:
            sizes["m"] = m
        if any(size % self.phm_n for size in sizes.values()):
            got = ", ".join(f"{k}={v}" for k, v in sizes.items())
            raise ValueError(
                f"`phm_n` must divide {', '.join(sizes)}, but got (phm_n={self.phm_n}, {got})"
            )

    def _largest_fitting(self, budget: int, dims: BackboneDims, d_in: int) -> int | None:
        """Largest ``m`` (a multiple of ``n`` for PHM) whose count fits ``budget``."""
        step = self.phm_n if self.generator == "phm" else 1
        first = self._count(dims, d_in, step)
        if first > budget:
            return None
        slope = self._count(dims, d_in, 2 * step) - first  # the count is affine in m
        m = step * (1 + (budget - first) // slope)
        while self._count(dims, d_in, m) > budget:  # guard: never exceed the budget
            m -= step
        return m

    def resolve(self, dims: BackboneDims) -> IDPGConfig:
        d_in = self.input_width(dims)
        self._check_sizes(dims, d_in, None)
        resolved = self
        if self.pooling == "auto":
            resolved = self.model_copy(update={"pooling": resolve_pooling("auto", dims)})
        if self.budget_params is not None:
            m = self._largest_fitting(self.budget_params, dims, d_in)
            if m is None:
                smallest = self._count(dims, d_in, self.phm_n if self.generator == "phm" else 1)
                raise ValueError(
                    f"`budget_params >= {smallest}` must hold for the smallest IDPG generator "
                    f"here, but got (budget_params={self.budget_params})"
                )
            resolved = resolved.model_copy(update={"generator_hidden": m})
        resolved._check_sizes(dims, d_in, resolved.generator_hidden)
        return resolved

    def prompt_positions(self) -> int:
        return self.prompt_length

    def check_backbone(self, dims: BackboneDims) -> None:
        self.resolve(dims)  # sizes (PHM divisibility, residual widths) raise ValueError

    def learning_rates(self) -> dict[str, float]:
        return {"generator": self.lr}

    def num_params(self, dims: BackboneDims) -> int:
        resolved = self.resolve(dims)
        return resolved._count(dims, self.input_width(dims), resolved.generator_hidden)

    def derived(self) -> dict[str, Any]:
        budget = self.budget_params is not None
        return {"generator_hidden": self.generator_hidden} if budget else {}

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """The largest fitting ``m`` first, then smaller ones halving down to ``n`` (or 1)."""
        d_in = self.input_width(dims)
        self._check_sizes(dims, d_in, None)
        top = self._largest_fitting(budget, dims, d_in)
        if top is None:
            return []
        step = self.phm_n if self.generator == "phm" else 1
        sizes, m = [top], step
        while m < top:
            sizes.insert(1, m)
            m *= 2
        return [
            BudgetOption(self.name, {"generator_hidden": m}, self._count(dims, d_in, m), budget)
            for m in sizes
        ]

    def peft_type(self) -> str:
        raise ValueError(no_peft_equivalent(self.name, "its per-example generated prompts"))

    def feature_specs(self) -> dict[str, FeatureSpec]:
        if self.encoder == "glove":
            return {"sentence": GloveEncoding(path=self.glove_path)}
        return {"sentence": BackboneEncoding(pooling=self.pooling)}


# ----------------------------------------------------------------------------- module


def _dense(size_in: int, size_out: int, std: float, bias: bool, gen: torch.Generator):
    layer = nn.utils.skip_init(nn.Linear, size_in, size_out, bias=bias)  # no global RNG draw
    with torch.no_grad():
        layer.weight.normal_(0, std, generator=gen)
        if bias:
            layer.bias.zero_()
    return layer


@register_method
class IDPG(PromptMethod):
    """The generator; prompts per example at the input (and, for M-IDPG, every layer)."""

    config_cls = IDPGConfig
    uses_layer_prompts = True  # overridden per instance: S-IDPG needs no layer hooks

    def __init__(
        self,
        config: IDPGConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__(config, dims, word_embeddings, tokenizer)
        config = self.config = config.resolve(dims)
        multi, per_layer = config.multi, config.multi and config.version == "L"
        self.uses_layer_prompts = multi
        layers = dims.num_layers if multi else 1
        d, t, m = dims.hidden_size, config.prompt_length, config.generator_hidden
        self.d_in = d_in = config.input_width(dims)
        previous = multi and config.generator_input == "previous_layer"
        gen = torch.Generator().manual_seed(config.init_seed)

        phm = config.generator == "phm"
        if phm and config.shares_a():
            self.phm_a = nn.Parameter(init_phm_a(config.phm_n, gen))
        else:
            self.register_parameter("phm_a", None)

        def linear(size_in: int, size_out: int, std: float, bias: bool) -> nn.Module:
            if phm:
                return PHMLinear(
                    size_in,
                    size_out,
                    config.phm_n,
                    bias=bias,
                    shared_a=self.phm_a,
                    weight_std=std,
                    generator=gen,
                )
            return _dense(size_in, size_out, std, bias, gen)

        # first layers (d_in → m, with bias): which one each layer uses is parts_of' business
        if per_layer:
            widths = [d_in] + [d if previous else d_in] * (layers - 1)
        elif previous and d_in != d:
            widths = [d_in, d]
        else:
            widths = [d_in]
        self.down = nn.ModuleList(linear(w, m, 1 / math.sqrt(w), True) for w in widths)
        emb_std = word_embeddings.weight.detach().float().std().item()
        up_std = UP_INIT_SCALE * emb_std / math.sqrt(m)
        self.up = nn.ModuleList(
            linear(m, t * d, up_std, False) for _ in range(layers if per_layer else 1)
        )
        # second-layer biases: the task prompts (one per layer in versions M and L)
        slots = layers if multi and config.version in ("M", "L") else 1
        self.prompt_bias = nn.Parameter(
            torch.stack(
                [
                    init_prompt(
                        t, word_embeddings, "vocab", config.init_seed + k, tokenizer=tokenizer
                    ).flatten()
                    for k in range(slots)
                ]
            )
        )
        sets = layers if per_layer else 1

        def norms(wanted: bool) -> nn.ModuleList:
            return nn.ModuleList(nn.LayerNorm(d) for _ in range(sets if wanted else 0))

        self.norm_out = norms(config.layer_norm)
        self.norm_gen = norms(config.layer_norm and config.residual)
        self.norm_sentence = norms(config.layer_norm and config.residual)
        self.activation = ACTIVATIONS[config.activation]()
        self._stash: tuple[torch.Tensor, torch.Tensor] | None = None

    # a fused pack computes every member's generator at once (raypeft.methods.idpg.fused)
    fused_parts = staticmethod(fused.fused_parts)
    fused_layer_prompts = staticmethod(fused.fused_layer_prompts)
    fusing_limitation = staticmethod(fused.fusing_limitation)

    @staticmethod
    def fused_constants(members) -> dict:
        return {}

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"generator": list(self.parameters())}

    def parts_of(self, layer: int) -> tuple[int, int, int, int]:
        """Indices of (first layer, second layer, bias, norms) that ``layer`` uses."""
        down = min(layer, len(self.down) - 1)  # per layer, or [input layer, the rest], or one
        up = layer if len(self.up) > 1 else 0
        bias = layer if len(self.prompt_bias) > 1 else 0
        norm = layer if len(self.norm_out) > 1 else 0
        return down, up, bias, norm

    def generate(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Prompt ``(batch, t, d)`` for ``layer`` from its generator input ``x`` ``(batch, w)``."""
        down, up, bias, norm = self.parts_of(layer)
        x = x.to(self.prompt_bias.dtype)
        hidden = self.activation(self.down[down](x))
        out = self.up[up](hidden) + self.prompt_bias[bias]
        prompt = out.view(x.shape[0], self.config.prompt_length, self.dims.hidden_size)
        if self.config.residual:
            if self.config.layer_norm:  # normalise both parts, then their sum (A.5)
                summed = self.norm_gen[norm](prompt) + self.norm_sentence[norm](x).unsqueeze(1)
                return self.norm_out[norm](summed)
            return prompt + x.unsqueeze(1)
        if self.config.layer_norm:
            return self.norm_out[norm](prompt)
        return prompt

    def _sentence(self, features: dict[str, torch.Tensor] | None, batch: int) -> torch.Tensor:
        sentence = (features or {}).get("sentence")
        if sentence is None:
            raise ValueError(
                "IDPG needs features['sentence'] (the per-example M(x)); the driver computes "
                "it (raypeft.search.run.precompute_features, or "
                "raypeft.training.datasets.ensure_features)"
            )
        if tuple(sentence.shape) != (batch, self.d_in):
            raise ValueError(
                f"features['sentence'] must have shape (batch, d_in)=({batch}, {self.d_in}), "
                f"but got {tuple(sentence.shape)}"
            )
        return sentence

    def prepare_inputs(self, input_ids, attention_mask, token_type_ids, embed, features=None):
        sentence = self._sentence(features, input_ids.shape[0])
        inputs_embeds = embed(input_ids)
        if self.uses_layer_prompts:  # what layer_prompt needs when the layer hooks fire
            self._stash = (sentence, attention_mask)
        prompt = self.generate(0, sentence).to(inputs_embeds.dtype)
        return prepend_prompt(prompt, inputs_embeds, attention_mask, token_type_ids)

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if self._stash is None:
            raise RuntimeError("IDPG.layer_prompt called before prepare_inputs")
        sentence, mask = self._stash
        if self.config.generator_input == "previous_layer":
            real = hidden_states[:, self.config.prompt_length :]  # the input's positions
            return self.generate(layer, pool(real, mask, self.config.pooling))
        return self.generate(layer, sentence)
