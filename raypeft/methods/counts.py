"""Closed-form trainable-parameter counts (task head excluded, as in the papers).

Every method's module must report exactly the count computed here; the method contract
tests check it. Notation follows ../shared/METHODS.md: hidden size ``d``, input length ``s``.
"""

from __future__ import annotations

from collections.abc import Callable


def prompt_tuning_params(prompt_length: int, hidden_size: int) -> int:
    """Soft prompt ``P ∈ R^{l×d}``: ``l·d``."""
    return prompt_length * hidden_size


def deep_prompt_params(
    prompt_length: int, num_layers: int, hidden_size: int, style: str, kv_size: int | None = None
) -> int:
    """Deep prompts: ``t·N·d`` (hidden states) or ``2·t·N·d_kv`` (key/value prefixes).

    ``d_kv`` is one layer's key width (``d`` unless grouped-query attention shrinks it).
    """
    if style == "hidden":
        return prompt_length * num_layers * hidden_size
    return 2 * prompt_length * num_layers * (kv_size or hidden_size)


def dept_params(prompt_length: int, rank: int, max_length: int, hidden_size: int) -> int:
    """DePT: soft prompt ``m·d`` plus ``A ∈ R^{s×r}``, ``B ∈ R^{r×d}``: ``m·d + (s+d)·r``."""
    return prompt_length * hidden_size + (max_length + hidden_size) * rank


def dept_rank_for_budget(
    budget_prompt_length: int, prompt_length: int, max_length: int, hidden_size: int
) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= l·d``, i.e. ``floor((l−m)·d/(s+d))``.

    ``budget_prompt_length`` is the PT length ``l`` whose parameter count is the budget.
    """
    if prompt_length >= budget_prompt_length:
        raise ValueError(
            f"`prompt_length < budget_prompt_length` must hold for DePT, but got "
            f"(prompt_length={prompt_length}, budget_prompt_length={budget_prompt_length})."
        )
    return (budget_prompt_length - prompt_length) * hidden_size // (max_length + hidden_size)


def dept_rank_for_params(budget: int, prompt_length: int, max_length: int, hidden_size: int) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= budget`` (may be < 1: does not fit)."""
    return (budget - prompt_length * hidden_size) // (max_length + hidden_size)


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


# ----------------------------------------------------------------------------- IPT


def ipt_table_params(vocab_size: int, hidden_size: int) -> int:
    """Random/Pretrained IPT: a trainable prompt row per vocabulary entry, ``V·d``."""
    return vocab_size * hidden_size


def ipt_deep_params(num_layers: int, hidden_size: int) -> int:
    """IPT's deep placement: a scale and a shift vector per layer 1..N-1, ``(N−1)·2d``."""
    return (num_layers - 1) * 2 * hidden_size


def textcnn_encoder_params(
    embed_dim: int,
    width: int,
    num_prompts: int,
    hidden_size: int,
    kernel_sizes: tuple[int, ...] = (3, 4, 5),
) -> int:
    """TextCNN ``e -> k·d``: a conv ``K·e·w + w`` per kernel size ``K``, then a projection
    ``(|K|·w)·k·d + k·d``: ``w·(e·ΣK + |K|) + (|K|·w + 1)·k·d``."""
    convs = width * (embed_dim * sum(kernel_sizes) + len(kernel_sizes))
    return convs + (len(kernel_sizes) * width + 1) * num_prompts * hidden_size


def lstm_encoder_params(
    embed_dim: int,
    width: int,
    num_prompts: int,
    hidden_size: int,
    layers: int = 1,
    bidirectional: bool = True,
) -> int:
    """Stacked (bi-)LSTM of ``w`` units then ``D·w -> k·d`` (``D`` directions). A layer reading
    ``a`` inputs holds ``D·4w·(a + w + 2)`` (PyTorch keeps two bias vectors); the first reads
    ``e``, later ones ``D·w``."""
    directions = 2 if bidirectional else 1
    total = directions * 4 * width * (embed_dim + width + 2)
    total += (layers - 1) * directions * 4 * width * (directions * width + width + 2)
    return total + (directions * width + 1) * num_prompts * hidden_size


def mlp_encoder_params(
    input_size: int, width: int, num_prompts: int, hidden_size: int, layers: int = 1
) -> int:
    """MLP ``in -> w (-> w)… -> k·d`` with ``layers`` hidden layers:
    ``(in+1)·w + (layers−1)·(w+1)·w + (w+1)·k·d``."""
    hidden = (input_size + 1) * width + (layers - 1) * (width + 1) * width
    return hidden + (width + 1) * num_prompts * hidden_size


def largest_fitting(count: Callable[[int], int], budget: int, upper: int = 1 << 24) -> int:
    """Largest ``x`` in ``[1, upper]`` with ``count(x) <= budget`` (``count`` increasing);
    0 when even ``x = 1`` does not fit."""
    if count(1) > budget:
        return 0
    low, high = 1, upper
    while low < high:  # invariant: count(low) <= budget
        mid = (low + high + 1) // 2
        if count(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low
