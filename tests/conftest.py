"""Shared pytest fixtures. Keep this a plain module of fixtures (no test code)."""

from __future__ import annotations

import os
import tempfile

# Tests never touch the network: set before transformers/datasets are imported.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch's OpenMP threads (the CLI's driver scores the test split on every core) wait for
# work by sleeping, not spinning: with both cores busy (pytest-xdist's two workers), a
# spinning thread burnt ~25% of a tiny search's CPU (measured on suite-speed, 2026-11-27);
# sleeping changes no result. CLI subprocesses and the Ray processes they start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# raypeft's cache (IPT's pretrained tables, GPU probes) is per test session, not the user's
# ~/.cache/raypeft (CLI subprocesses of the integration tests inherit it, and reuse what the
# session built)
os.environ.setdefault("RAYPEFT_CACHE_DIR", tempfile.mkdtemp(prefix="raypeft-test-cache-"))

import pytest  # noqa: E402

# the run's summary names each test skipped for a missing system package (tests/system.py)
from tests.system import pytest_terminal_summary  # noqa: E402, F401

TINY_MAX_LENGTH = 16


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models run much faster on one thread (and other jobs may share the cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_model_cfg():
    """``ModelConfig`` of the randomly initialised 2-layer BERT (d=32) at s=16."""
    from raypeft.config.schema import ModelConfig

    return ModelConfig(name="tiny-bert", max_length=TINY_MAX_LENGTH)


@pytest.fixture
def tiny_backbone(tiny_model_cfg):
    """Factory: a fresh frozen tiny-bert backbone; the same ``seed`` gives the same weights."""
    from raypeft.modeling.backbones import load_backbone

    def make(num_labels: int = 2, problem: str = "classification", seed: int = 0):
        return load_backbone(tiny_model_cfg, num_labels=num_labels, problem=problem, seed=seed)

    return make


@pytest.fixture
def tiny_batch():
    """Factory: a fixed batch of token arrays padded to ``length`` (tiny-bert's vocabulary)."""
    import torch

    def make(batch: int = 4, length: int = TINY_MAX_LENGTH, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(1000, 5000, (batch, length), generator=gen)
        input_ids[:, 0] = 101  # [CLS]
        attention_mask = torch.ones(batch, length, dtype=torch.long)
        # ragged real lengths, the rest padding (id 0, mask 0)
        for i in range(batch):
            real = length - (i % 3) * 2
            input_ids[i, real:] = 0
            attention_mask[i, real:] = 0
        token_type_ids = torch.zeros(batch, length, dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
        }

    return make
