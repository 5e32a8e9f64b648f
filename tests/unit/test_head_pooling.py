"""``model.head_pooling``: what an encoder's task head reads once a prompt is prepended.

``first`` is transformers' head (and peft's): the first position, a prompt slot. ``mean``
averages the final states of the input's own tokens (prompt slots and padding left out) and
feeds that to the head's classifier; ``auto`` picks it for mean-pooling sentence encoders.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    DistilBertConfig,
    RobertaConfig,
)

from raypeft.config.schema import ModelConfig
from raypeft.errors import ConfigError
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.backbones import Backbone, backbone_dims, load_backbone, load_config
from raypeft.modeling.head_pooling import head_style, input_mean, resolve_head_pooling
from raypeft.modeling.prompted import PromptedModel

PROMPT = 3


def dims_of(name: str):
    return backbone_dims(load_config(ModelConfig(name=name), 2, "classification"), 16, name)


@pytest.mark.parametrize(
    ("name", "setting", "resolved"),
    [
        ("minilm", "auto", "mean"),  # all-MiniLM-L6-v2's sentence-transformers config: mean
        ("tiny-bert", "auto", "first"),  # no sentence-transformers config
        ("tiny-gpt2", "auto", "first"),
        ("tiny-t5", "auto", "first"),
        ("minilm", "first", "first"),
        ("tiny-bert", "mean", "mean"),
    ],
)
def test_auto_picks_mean_for_mean_pooling_sentence_encoders(name, setting, resolved):
    assert resolve_head_pooling(setting, dims_of(name)) == resolved


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-t5", "tiny-llama"])
def test_mean_is_refused_off_encoders(name):
    with pytest.raises(ConfigError, match=r"model.head_pooling: mean .* is a (decoder|seq2seq)"):
        resolve_head_pooling("mean", dims_of(name))


def prompted(backbone: Backbone, pooling: str) -> PromptedModel:
    method = PromptTuningConfig(prompt_length=PROMPT, init="normal", lr=0.1)
    return PromptedModel(backbone, method, backbone_dropout=0, head_pooling=pooling).eval()


def batch(vocab: int = 100) -> dict:
    ids = torch.randint(5, vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0  # padding, which the mean leaves out
    mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_mean_pools_the_input_tokens_into_the_classifier():
    backbone = load_backbone(ModelConfig(name="tiny-bert", max_length=16), 2, "classification")
    model = prompted(backbone, "mean")
    inputs = batch()
    kwargs = model.backbone_inputs(**inputs)
    assert kwargs["inputs_embeds"].shape[1] == PROMPT + 7  # the prompt is prepended
    with torch.no_grad():
        hidden = model.backbone.bert(**kwargs).last_hidden_state[:, PROMPT:]
        weights = inputs["attention_mask"].unsqueeze(-1).float()
        expected = model.backbone.classifier((hidden * weights).sum(1) / weights.sum(1))
        logits = model(**inputs).logits
    torch.testing.assert_close(logits, expected)
    # the same model with the first position (a prompt slot) through the pooler differs
    first = prompted(backbone, "first")
    first.load_trainable_state_dict(model.trainable_state_dict())
    with torch.no_grad():
        assert not torch.allclose(first(**inputs).logits, logits)


def test_padding_never_reaches_the_mean():
    backbone = load_backbone(ModelConfig(name="tiny-bert", max_length=16), 2, "classification")
    model = prompted(backbone, "mean")
    inputs = batch()
    other = {k: v.clone() for k, v in inputs.items()}
    other["input_ids"][inputs["attention_mask"] == 0] = 7  # other tokens under the padding
    with torch.no_grad():
        torch.testing.assert_close(model(**other).logits, model(**inputs).logits)


def test_input_mean_reads_the_positions_after_the_prompt():
    hidden = torch.arange(2 * 5 * 1, dtype=torch.float).reshape(2, 5, 1)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # rows' input tokens are positions 2..4; the first row pools 2 and 3, the second 7
    assert input_mean(hidden, mask).flatten().tolist() == [2.5, 7.0]


def test_a_roberta_style_head_reads_the_mean_through_its_own_layers():
    config = RobertaConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=40, num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.requires_grad_(False)
    model.classifier.requires_grad_(True)
    dims = backbone_dims(config, 16, None)
    backbone = Backbone(model=model, dims=dims, head_params=list(model.classifier.parameters()))
    pt = prompted(backbone, "mean")
    assert pt.head_style == "first_token"
    inputs = batch()
    with torch.no_grad():
        kwargs = pt.backbone_inputs(**inputs)
        hidden = model.roberta(**kwargs).last_hidden_state[:, PROMPT:]
        weights = inputs["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        expected = model.classifier(pooled.unsqueeze(1))  # dense, tanh, out_proj over [:, 0]
        torch.testing.assert_close(pt(**inputs).logits, expected)


def test_a_head_with_layers_before_its_classifier_is_refused():
    config = DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    model = AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(
        ConfigError, match="model.head_pooling: mean cannot feed the head of Distil"
    ):
        head_style(model)


def test_mean_head_trains_only_the_head_and_prompt():
    backbone = load_backbone(ModelConfig(name="tiny-bert", max_length=16), 2, "classification")
    model = prompted(backbone, "mean").train()
    frozen = {n: p.clone() for n, p in model.backbone.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    out = model(**batch(), labels=torch.tensor([0, 1, 1]))
    out.loss.backward()
    assert (
        model.method.prompt.grad is not None
        and model.backbone.classifier.weight.grad.abs().sum() > 0
    )
    optimizer.step()
    for n, p in model.backbone.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
