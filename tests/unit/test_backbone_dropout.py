"""The frozen backbone's dropout while a method trains (``train.backbone_dropout``), on every
tiny backbone kind: its own rates by default, none at 0 (really none: attention included),
an explicit rate everywhere; frozen weights bit for bit unchanged; no trial's rate reaching
the cache or another trial.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from raypeft.config.schema import ExperimentConfig, ModelConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling import cache
from raypeft.modeling.backbones import load_backbone
from raypeft.modeling.build import build_model
from raypeft.modeling.dropout import dropout_rates, set_dropout_rate
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.optimizer import build_optimizer

BACKBONES = ["tiny-bert", "tiny-t5", "tiny-gpt2", "tiny-llama"]
# where each kind's attention reads its dropout probability in transformers 5 (a float
# attribute, or the p of an nn.Dropout) - what "off" must switch off and a rate must reach
ATTENTION_RATE = {
    "tiny-bert": "bert.encoder.layer.0.attention.self.dropout.p",
    "tiny-t5": "encoder.block.0.layer.0.SelfAttention.dropout",
    "tiny-gpt2": "transformer.h.0.attn.attn_dropout.p",
    "tiny-llama": "model.layers.0.self_attn.attention_dropout",
}
PT = PromptTuningConfig(prompt_length=2, lr=0.05)


def backbone(name: str):
    return load_backbone(ModelConfig(name=name, max_length=16), 2, "classification")


def outputs(model: PromptedModel, batch: dict) -> torch.Tensor:
    """The backbone's outputs for ``batch`` (seq2seq: decoder logits for a fixed target)."""
    if model.kind != "seq2seq":
        return model(**batch).logits
    kwargs = model.backbone_inputs(batch["input_ids"], batch["attention_mask"])
    return model.backbone(**kwargs, decoder_input_ids=batch["input_ids"][:, :3]).logits


def batch_for(name: str, tiny_batch) -> dict:
    batch = tiny_batch()
    if name != "tiny-bert":  # T5, GPT-2 and LLaMA take no segment ids
        batch.pop("token_type_ids")
    return batch


@pytest.mark.parametrize("name", BACKBONES)
def test_a_rate_reaches_every_dropout_attention_included(name):
    model = backbone(name).model
    rates = dropout_rates(model)
    assert ATTENTION_RATE[name] in rates
    set_dropout_rate(model, 0.37)
    assert set(dropout_rates(model).values()) == {0.37}


@pytest.mark.parametrize("name", BACKBONES)
def test_zero_is_no_dropout_at_all(name, tiny_batch):
    """backbone_dropout 0: in training mode the backbone stays in eval mode, so every dropout,
    attention's included (it reads ``self.training``), is off: outputs repeat exactly and no
    random number is drawn."""
    model = PromptedModel(backbone(name), PT, backbone_dropout=0.0)
    model.train()
    batch = batch_for(name, tiny_batch)
    rng = torch.get_rng_state()
    assert torch.equal(outputs(model, batch), outputs(model, batch))
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.method.training and not any(m.training for m in model.backbone.modules())


@pytest.mark.parametrize("name", BACKBONES)
def test_a_rate_drops_out_in_training_and_never_in_evaluation(name, tiny_batch):
    # tiny-llama has attention dropout only (its config's rate: 0): a rate switches it on
    model = PromptedModel(backbone(name), PT, backbone_dropout=0.3)
    batch = batch_for(name, tiny_batch)
    model.train()
    assert not torch.equal(outputs(model, batch), outputs(model, batch))
    model.eval()
    assert torch.equal(outputs(model, batch), outputs(model, batch))


def test_config_keeps_the_backbones_own_rates(tiny_backbone):
    fresh = dropout_rates(tiny_backbone().model)
    model = PromptedModel(tiny_backbone(), PT)  # default: config
    assert dropout_rates(model.backbone) == fresh and set(fresh.values()) == {0.1}


@pytest.mark.parametrize("name", BACKBONES)
def test_frozen_tensors_are_bit_identical_after_training_with_dropout(name, tiny_batch):
    model = PromptedModel(backbone(name), PT, backbone_dropout=0.3)
    head = {id(p) for p in model.param_groups()["head"]}
    frozen = {
        n: p.detach().clone() for n, p in model.backbone.named_parameters() if id(p) not in head
    }
    buffers = {n: b.clone() for n, b in model.backbone.named_buffers()}
    cfg = ExperimentConfig(name="dropout", model=ModelConfig(name=name, max_length=16), method=PT)
    optimizer = build_optimizer(model, cfg)
    batch = batch_for(name, tiny_batch)
    model.train()
    for _ in range(3):
        loss = outputs(model, batch).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    params = dict(model.backbone.named_parameters())
    assert all(torch.equal(params[n], v) and params[n].grad is None for n, v in frozen.items())
    assert all(torch.equal(b, buffers[n]) for n, b in model.backbone.named_buffers())


def _labels():
    """What build_model reads of a task."""
    return SimpleNamespace(
        spec=SimpleNamespace(problem="classification"), num_labels=2, verbalizers=None
    )


def _cfg(dropout) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "dropout",
            "model": {"name": "tiny-bert", "max_length": 16},
            "method": {"name": "pt", "prompt_length": 2},
            "train": {"backbone_dropout": dropout},
        }
    )


def test_a_trials_rate_reaches_neither_the_cache_nor_the_next_trial(tiny_batch):
    """Trials share a cached backbone's frozen tensors, not its modules: a rate set on one
    trial's copy stays there, and the cached entry stays pristine (no reload)."""
    cache.clear_backbone_cache()
    own = dropout_rates(build_model(_cfg("config"), _labels()).backbone)
    loads = cache.loads()
    high = build_model(_cfg(0.45), _labels())
    after = build_model(_cfg("config"), _labels())
    assert set(dropout_rates(high.backbone).values()) == {0.45}
    assert dropout_rates(after.backbone) == own
    (entry,) = cache._ENTRIES.values()
    assert dropout_rates(entry.model) == own and cache._pristine(entry)
    assert cache.loads() == loads
    # training the high-rate trial leaves the next one's rates and the cache alone too
    high.train()
    high(**tiny_batch()).logits.sum().backward()
    assert dropout_rates(build_model(_cfg("config"), _labels()).backbone) == own
    assert cache.loads() == loads and cache._pristine(entry)
