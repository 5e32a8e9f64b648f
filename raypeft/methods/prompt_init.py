"""Where a soft prompt starts: word-embedding rows of the backbone's frequent tokens or of a
given text, or a random draw.

``vocab`` samples the rows of the backbone's most frequent real tokens. Lester et al. (2021)
draw from T5's 5,000 most common tokens (their code takes the first 5,000 rows of the
embedding table, without replacement); DePT §3.1 starts from "randomly sampled top
vocabularies". No tokenizer ships its training-corpus counts, but every family of tokenizer
orders its ids by frequency once its special, placeholder and character rows are set aside:

- **SentencePiece** (T5, LLaMA): ids follow the pieces' scores, i.e. their
  frequency in the tokenizer's corpus. First come the special tokens (``<pad>``, ``</s>``,
  ``<unk>``), then, for byte-fallback models (LLaMA), the 256 byte rows ``<0x00>``..``<0xFF>``.
  T5 puts its sentinels ``<extra_id_N>`` (ids 32000-32099 of t5-base) last, and its
  embedding table has 28 more rows (32100-32127) that no token reaches and that never trained:
  ids are only drawn below the tokenizer's length.
- **Byte-level BPE** (GPT-2, RoBERTa): ids follow the merge order, which follows the pair
  frequencies the merges were learnt from (RoBERTa's ids follow fairseq's frequency-sorted
  dictionary, so its single characters sit among the frequent tokens); the 256 single-byte
  symbols come first in GPT-2.
- **WordPiece** (BERT, and the packaged MiniLM): ``[PAD]``, ``[unused0-993]`` and the special
  tokens, then about a thousand single characters in code-point order (ids 999-1995 of
  bert-base-uncased), then frequency order from "the" (1996) on.

So one rule serves all three: walk the ids in order, skip the special and added tokens,
placeholder rows (``[unusedN]``, ``<unusedN>``, ``<extra_id_N>``, ``madeupwordN``), byte rows
(``<0xNN>``) and every token that is a single character once its word-boundary marker (``##``,
``▁``, ``Ġ``) is removed (letters, digits, punctuation, bytes: they carry no meaning of their
own, and in WordPiece they are not in frequency order), and keep the first
:data:`FREQUENT_TOKENS`. A method built without a tokenizer (by hand, as the parameter-count
tests do) draws from every row instead.

``vocab_uniform`` is the rule raypeft used before: any row of the upper 90% of the table, rare
or untrained ones included; it is kept to measure what starting from frequent tokens changes.

``text`` starts from a given text, as Hugging Face peft's ``PromptTuningInit.TEXT`` and DePT's
official code do (its default text is "Classify this text is postive or not:"): the text's ids
as the tokenizer encodes it (its special tokens included, e.g. BERT's ``[CLS]`` and ``[SEP]``,
T5's ``</s>``), repeated until they fill the prompt, then cut to its length.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Annotated, Any, Literal

import torch
from pydantic import AfterValidator, ValidationInfo
from torch import nn

PromptInit = Literal["vocab", "text", "normal", "vocab_uniform"]

# Lester et al.'s population: the 5,000 most common tokens
FREQUENT_TOKENS = 5000

# rows that hold no real token: vocabulary placeholders and byte-fallback symbols
_PLACEHOLDER = re.compile(
    r"\[unused\d+\]|<unused\d+>|<extra_id_\d+>|madeupword\d+|<0x[0-9A-Fa-f]{2}>"
)
# word-boundary markers: WordPiece continuation, SentencePiece and byte-level BPE word starts
_MARKERS = ("##", "▁", "Ġ")


def _text_for_init(text: str | None, info: ValidationInfo) -> str | None:
    if info.data.get("init") == "text" and (text is None or not text.strip()):
        given = "it is not set" if text is None else f"got {text!r}"
        raise ValueError(f"init: text needs a non-empty `init_text` to start from, but {given}")
    return text


# a config's ``init_text`` (declared after its ``init``, which it is checked against)
InitText = Annotated[str | None, AfterValidator(_text_for_init)]


def token_text(token: str) -> str:
    """A vocabulary entry without its word-boundary marker (``##s`` -> ``s``)."""
    for marker in _MARKERS:
        if token.startswith(marker):
            return token[len(marker) :]
    return token


@lru_cache(maxsize=8)  # a tokenizer is read once per process (load_tokenizer returns one object)
def frequent_token_ids(tokenizer: Any, count: int = FREQUENT_TOKENS) -> tuple[int, ...]:
    """The ids of the tokenizer's ``count`` most frequent real tokens, most frequent first
    (see the module's docstring for how each tokenizer family orders its ids)."""
    skipped = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    ids: list[int] = []
    for index, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if index in skipped or token is None or _PLACEHOLDER.fullmatch(token):
            continue
        if len(token_text(token)) > 1:
            ids.append(index)
            if len(ids) == count:
                break
    return tuple(ids)


def text_token_ids(tokenizer: Any, text: str, length: int) -> list[int]:
    """``text``'s ids (special tokens included) repeated to fill ``length``, then cut to it,
    as peft's ``PromptTuningInit.TEXT`` and DePT's code build them."""
    ids = tokenizer(text)["input_ids"]
    if not ids:
        raise ValueError(f"init_text {text!r} encodes to no token")
    return (ids * math.ceil(length / len(ids)))[:length]


def init_prompt(
    length: int,
    word_embeddings: nn.Embedding,
    how: PromptInit,
    seed: int,
    *,
    tokenizer: Any | None = None,
    text: str | None = None,
) -> torch.Tensor:
    """Initial soft prompt ``(length, d)`` in float32.

    ``vocab``: rows of :func:`frequent_token_ids` drawn without replacement (with replacement
    only when the prompt is longer than the population, as Lester et al.'s code does), or of
    every row when there is no tokenizer. ``text``: the rows of ``text``'s tokens
    (:func:`text_token_ids`; needs the tokenizer). ``normal``: a normal draw with the
    embedding table's standard deviation. ``vocab_uniform``: rows drawn uniformly, with
    replacement, from the upper 90% of the table (raypeft's rule before it read the
    tokenizer: rare, placeholder and untrained rows included; for ablations). ``seed`` seeds
    the draw.
    """
    weight = word_embeddings.weight.detach()
    if how == "text":
        if tokenizer is None or not text:
            raise ValueError("init: text needs the backbone's tokenizer and a non-empty init_text")
        ids = torch.tensor(text_token_ids(tokenizer, text, length))
        return weight[ids].clone().float()
    gen = torch.Generator().manual_seed(seed)
    if how == "vocab_uniform":  # raypeft's earlier rule, kept to measure what the fix changed
        ids = torch.randint(weight.shape[0] // 10, weight.shape[0], (length,), generator=gen)
        return weight[ids].clone().float()
    if how == "vocab":
        rows = weight.shape[0]
        population = torch.arange(rows)
        if tokenizer is not None:
            population = torch.tensor([i for i in frequent_token_ids(tokenizer) if i < rows])
            if len(population) == 0:
                raise ValueError("init: vocab found no real token in the backbone's tokenizer")
        if len(population) >= length:
            picks = torch.randperm(len(population), generator=gen)[:length]
        else:
            picks = torch.randint(len(population), (length,), generator=gen)
        return weight[population[picks]].clone().float()
    std = weight.float().std().item()
    return torch.randn(length, weight.shape[1], generator=gen) * std
