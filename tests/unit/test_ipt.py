"""IPT: corpora, text encoders, the three strategies, deep placement, counts and budgets."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from raypeft.config.schema import ModelConfig
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.methods.ipt import pretrain as pretrain_module
from raypeft.methods.ipt.corpora import load_corpus
from raypeft.methods.ipt.method import IPTConfig, first_real_tokens, ipt_deep_params, read_count
from raypeft.methods.ipt.text_encoders import (
    EncoderSpec,
    lstm_encoder_params,
    mlp_encoder_params,
    textcnn_encoder_params,
)
from raypeft.modeling.backbones import frozen_backbone, load_tokenizer
from raypeft.modeling.prompted import PromptedModel
from raypeft.modeling.prompted import head_loss as loss_fn
from raypeft.training.optimizer import build_optimizer

V, D, N, S = 30522, 32, 2, 16  # tiny-bert: MiniLM's vocabulary, d=32, 2 layers, s=16

# ------------------------------------------------------------------------ corpora


def test_bbc_news_corpus_loads():
    corpus = load_corpus()
    assert corpus.categories == ["business", "entertainment", "politics", "sports", "tech"]
    assert len(corpus) == len(corpus.labels) == 2225
    assert sorted(set(corpus.labels)) == [0, 1, 2, 3, 4]
    assert corpus.labels.count(3) == 511  # sports
    assert all(text.strip() for text in corpus.texts)
    assert load_corpus().texts == corpus.texts  # sorted paths: the same order every time


def _write_folder(root, docs: dict[str, list[str]]):
    for category, texts in docs.items():
        (root / category).mkdir(parents=True)
        for i, text in enumerate(texts):
            (root / category / f"{i:03d}.txt").write_text(text)
    return root


def test_user_folder_and_table_corpora(tmp_path):
    folder = _write_folder(tmp_path / "c", {"zeta": ["z one", "z two"], "alpha": ["a one"]})
    (folder / "notes.txt").write_text("a stray file outside any category is ignored")
    corpus = load_corpus(folder)
    assert corpus.categories == ["alpha", "zeta"]
    assert list(zip(corpus.texts, corpus.labels, strict=True)) == [
        ("a one", 0),
        ("z one", 1),
        ("z two", 1),
    ]
    rows = [
        {"text": "x", "label": "spam"},
        {"text": "y", "label": "ham"},
        {"text": "", "label": "ham"},
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    corpus = load_corpus(str(jsonl))
    assert corpus.categories == ["ham", "spam"] and corpus.labels == [1, 0]  # empty text dropped
    csv = tmp_path / "c.csv"
    csv.write_text("text,label\nt0,10\nt1,9\nt2,10\n")
    corpus = load_corpus(csv)
    assert corpus.categories == ["9", "10"] and corpus.labels == [1, 0, 1]  # numeric order


@pytest.mark.parametrize("case", ["missing", "empty", "columns", "format", "one-class", "bad"])
def test_bad_corpus_is_a_one_line_config_error(tmp_path, case):
    path = {
        "missing": tmp_path / "nowhere",
        "empty": tmp_path / "empty",
        "columns": tmp_path / "c.jsonl",
        "format": tmp_path / "c.txt",
        "one-class": tmp_path / "one",
        "bad": tmp_path / "bad.parquet",
    }[case]
    if case == "empty":
        path.mkdir()
    elif case == "columns":
        path.write_text(json.dumps({"sentence": "x", "label": 0}))
    elif case == "format":
        path.write_text("x")
    elif case == "one-class":
        _write_folder(path, {"only": ["x", "y"]})
    elif case == "bad":
        path.write_bytes(b"not parquet")
    with pytest.raises(ConfigError) as err:
        load_corpus(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message


# ------------------------------------------------------------------------ encoders

ENCODER_SPECS = {
    "textcnn": EncoderSpec("textcnn", embed_dim=12, width=5, num_prompts=3, hidden_size=8),
    "lstm-bi-2": EncoderSpec("lstm", 12, 5, 3, 8, layers=2, bidirectional=True),
    "lstm-uni": EncoderSpec("lstm", 12, 5, 3, 8, layers=1, bidirectional=False),
    "mlp-mean-3": EncoderSpec("mlp", 12, 5, 3, 8, layers=2),
    "mlp-flatten": EncoderSpec("mlp", 12, 5, 3, 8, mlp_pool="flatten", positions=4),
}


@pytest.mark.parametrize("name", list(ENCODER_SPECS))
def test_encoder_count_equals_closed_form(name):
    spec = ENCODER_SPECS[name]
    encoder = spec.build(seed=0)
    assert sum(p.numel() for p in encoder.parameters()) == spec.num_params()
    e, w, k, d = 12, 5, 3, 8
    by_hand = {
        "textcnn": w * (3 + 4 + 5) * e + 3 * w + (3 * w + 1) * k * d,
        "lstm-bi-2": 2 * 4 * w * (e + w + 2) + 2 * 4 * w * (2 * w + w + 2) + (2 * w + 1) * k * d,
        "lstm-uni": 4 * w * (e + w + 2) + (w + 1) * k * d,
        "mlp-mean-3": (e + 1) * w + (w + 1) * w + (w + 1) * k * d,
        "mlp-flatten": (4 * e + 1) * w + (w + 1) * k * d,
    }[name]
    assert spec.num_params() == by_hand


@pytest.mark.parametrize("name", list(ENCODER_SPECS))
def test_encoder_reads_only_the_first_lengths_tokens(name):
    spec = ENCODER_SPECS[name]
    encoder = spec.build(seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 12, generator=gen)
    lengths = torch.tensor([7, 2, 4])
    out = encoder(x, lengths)
    assert out.shape == (3, 3, 8)
    changed = x.clone()
    changed[1, 2:] += 5.0  # past row 1's length
    changed[2, 4:] -= 5.0
    torch.testing.assert_close(encoder(changed, lengths), out)
    changed[0, 1] += 5.0  # inside row 0 (and inside the MLP's 4 flattened positions)
    assert not torch.allclose(encoder(changed, lengths)[0], out[0])


def test_seeded_encoders_are_reproducible():
    spec = ENCODER_SPECS["lstm-bi-2"]
    a, b, c = spec.build(1), spec.build(1), spec.build(2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


# ------------------------------------------------------------------------ token selection


def test_first_real_tokens_for_right_and_left_padding():
    ids = torch.tensor([[5, 6, 7, 0, 0], [0, 0, 8, 9, 4]])
    mask = (ids != 0).long()
    got, valid = first_real_tokens(ids, mask, 4)
    assert got.tolist() == [[5, 6, 7, 0], [8, 9, 4, 0]]
    assert valid.tolist() == [[True, True, True, False], [True, True, True, False]]
    got, valid = first_real_tokens(ids, mask, 7)  # longer than the input: padded
    assert got.shape == (2, 7) and valid.sum().item() == 6


def test_read_count_is_ceil_of_rho_n():
    n = torch.tensor([10, 7, 1, 3])
    assert read_count(0.3, n).tolist() == [3, 3, 1, 1]  # 0.3·10 = 3 exactly, not 4
    assert read_count(1.0, n).tolist() == [10, 7, 1, 3]
    assert read_count(0.01, 16) == 1


# ------------------------------------------------------------------------ random IPT


def _gpt2_backbone():
    from raypeft.modeling.backbones import load_backbone

    return load_backbone(ModelConfig(name="tiny-gpt2", max_length=S), 2, "classification")


def _left_padded(batch):
    """The fixture's right-padded rows, moved to the right end (as decoders are fed)."""
    ids, mask = batch["input_ids"].clone(), batch["attention_mask"].clone()
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        ids[i] = torch.cat([ids[i, n:], ids[i, :n]])
        mask[i] = torch.cat([mask[i, n:], mask[i, :n]])
    return ids, mask


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_random_prompt_is_table_rows_of_first_real_tokens(tiny_backbone, tiny_batch, kind):
    backbone = tiny_backbone() if kind == "encoder" else _gpt2_backbone()
    length = 14  # the fixture's rows hold 16, 14, 12, 16 real tokens: row 2 is padded
    model = PromptedModel(backbone, IPTConfig(prompt_length=length))
    batch = tiny_batch()
    real = [
        row[m.bool()] for row, m in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    if kind == "encoder":
        ids, mask = batch["input_ids"], batch["attention_mask"]
    else:
        ids, mask = _left_padded(batch)
    embed = model.backbone.get_input_embeddings()
    kwargs = model.method.prepare_inputs(ids, mask, None, embed)
    table = model.method.table
    for i, tokens in enumerate(real):
        n = min(len(tokens), length)
        torch.testing.assert_close(kwargs["inputs_embeds"][i, :n], table[tokens[:n]])
        assert (kwargs["inputs_embeds"][i, n:length] == 0).all()
        assert kwargs["attention_mask"][i, :length].tolist() == [1] * n + [0] * (length - n)
    torch.testing.assert_close(kwargs["inputs_embeds"][:, length:], embed(ids))
    assert torch.equal(kwargs["attention_mask"][:, length:], mask)
    assert model(ids, mask).logits.shape == (4, 2)


def test_random_table_scale_and_seed(tiny_backbone):
    a = PromptedModel(tiny_backbone(), IPTConfig(init_seed=1)).method.table
    b = PromptedModel(tiny_backbone(), IPTConfig(init_seed=1)).method.table
    assert a.shape == (V, D) and torch.equal(a, b)
    std = tiny_backbone().word_embeddings.weight.std().item()
    assert a.std().item() == pytest.approx(std, rel=0.05)


# ------------------------------------------------------------------------ pretraining


@pytest.fixture
def small_corpus(tmp_path, monkeypatch):
    """A tiny two-topic corpus and a private cache folder."""
    monkeypatch.setenv("RAYPEFT_CACHE_DIR", str(tmp_path / "cache"))
    sport = [f"the team won the match with a late goal number {i}" for i in range(8)]
    money = [f"the bank raised interest rates and stocks fell by {i}" for i in range(8)]
    return _write_folder(tmp_path / "corpus", {"sport": sport, "money": money})


def _pretrained_cfg(corpus, **kw) -> IPTConfig:
    return IPTConfig(corpus=str(corpus), pretrain_epochs=2, pretrain_width=4, **kw)


def test_pretrained_table_comes_from_the_cache_and_is_reused(
    tiny_model_cfg, tiny_backbone, small_corpus, monkeypatch
):
    cfg = _pretrained_cfg(small_corpus, strategy="pretrained")
    calls = []
    real = pretrain_module.pretrain_textcnn
    monkeypatch.setattr(
        pretrain_module, "pretrain_textcnn", lambda spec, tok: calls.append(spec) or real(spec, tok)
    )
    cfg.warm_up(frozen_backbone(tiny_model_cfg))
    assert len(calls) == 1 and calls[0].tokenizer == "minilm"  # tiny-bert borrows its tokenizer
    backbone = tiny_backbone()
    path = cfg.pretrain_spec(backbone.dims).path()
    assert path.is_file() and path.parent == small_corpus.parent / "cache" / "ipt"
    assert not list(path.parent.glob("*.tmp"))  # written through a temporary file
    from safetensors.torch import load_file

    cached = load_file(str(path))["embedding"]
    model = PromptedModel(backbone, cfg)
    table = model.method.table
    assert table.requires_grad and table.shape == cached.shape == (V, D)
    # the pretrained rows, rescaled by one scalar to the backbone's embedding scale
    scale = (table / cached).flatten()[0]
    torch.testing.assert_close(table, cached * scale)
    assert table.std().item() == pytest.approx(backbone.word_embeddings.weight.std().item())
    # second use: the cache answers, pretraining does not run again
    cfg.warm_up(frozen_backbone(tiny_model_cfg))
    again = PromptedModel(tiny_backbone(), cfg).method.table
    assert len(calls) == 1 and torch.equal(again, table)
    # a different pretraining setting is a different cache entry
    cfg.model_copy(update={"pretrain_seed": 1}).warm_up(frozen_backbone(tiny_model_cfg))
    assert len(calls) == 2 and len(list(path.parent.glob("*.safetensors"))) == 2


def test_a_trial_without_the_cache_builds_the_table_itself(
    tiny_backbone, small_corpus, monkeypatch
):
    # no warm_up on this machine (another node of a cluster): the model pretrains once
    calls = []
    real = pretrain_module.pretrain_textcnn
    monkeypatch.setattr(
        pretrain_module, "pretrain_textcnn", lambda spec, tok: calls.append(spec) or real(spec, tok)
    )
    cfg = _pretrained_cfg(small_corpus, strategy="encoder")
    PromptedModel(tiny_backbone(), cfg)
    PromptedModel(tiny_backbone(), cfg)
    assert len(calls) == 1


def test_table_strategies_need_the_backbone_name():
    from raypeft.methods import BackboneDims

    dims = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)
    with pytest.raises(ValueError, match=r"model_name must be set"):
        IPTConfig(strategy="pretrained").pretrain_spec(dims)


def test_pretraining_learns_the_corpus(small_corpus):
    spec = pretrain_module.PretrainSpec(
        tokenizer="tiny-bert", vocab_size=V, embed_dim=8, corpus=str(small_corpus), epochs=8,
        width=8, batch_size=4, seed=0,
    )  # fmt: skip
    tokenizer = load_tokenizer("tiny-bert")
    result = pretrain_module.pretrain_textcnn(spec, tokenizer)
    assert result.categories == ["money", "sport"] and result.num_docs == 16
    assert result.state["embedding"].shape == (V, 8)
    assert result.state["body.convs.0.weight"].shape == (8, 8, 3)
    assert result.accuracy == 1.0  # one held-out document of an easy corpus
    again = pretrain_module.pretrain_textcnn(spec, tokenizer)  # fixed seed: the same table
    assert torch.equal(again.state["embedding"], result.state["embedding"])


# ------------------------------------------------------------------------ encoder IPT


@pytest.mark.parametrize("encoder", ["textcnn", "lstm", "mlp"])
def test_encoder_ipt_trains_only_the_encoder(
    tiny_model_cfg, tiny_backbone, tiny_batch, small_corpus, encoder
):
    cfg = _pretrained_cfg(small_corpus, strategy="encoder", encoder=encoder, encoder_width=4)
    cfg.warm_up(frozen_backbone(tiny_model_cfg))
    backbone = tiny_backbone()
    model = PromptedModel(backbone, cfg)
    method = model.method
    assert not method.table.requires_grad
    assert not any(k.startswith("table") for k in method.state_dict())  # rebuilt from cache
    assert method.num_trainable() == cfg.num_params(backbone.dims)
    assert method.num_trainable() == sum(p.numel() for p in method.encoder.parameters())
    if encoder == "textcnn":  # width 4 = pretraining width: the convolutions start pretrained
        from safetensors.torch import load_file

        cached = load_file(str(cfg.pretrain_spec(backbone.dims).path()))
        assert torch.equal(method.encoder.body.convs[1].weight, cached["body.convs.1.weight"])
    table = method.table.clone()
    before = {k: v.clone() for k, v in method.state_dict().items()}
    opt = build_optimizer(model, _experiment(cfg))
    loss = loss_fn(model(**tiny_batch()).logits, torch.ones(4, dtype=torch.long))
    loss.backward()
    opt.step()
    assert torch.equal(method.table, table)
    assert all(not torch.equal(v, before[k]) for k, v in method.state_dict().items()), [
        k for k, v in method.state_dict().items() if torch.equal(v, before[k])
    ]


def test_encoder_prompts_are_k_vectors_on_the_embedding_scale(
    tiny_model_cfg, tiny_backbone, tiny_batch, small_corpus
):
    cfg = _pretrained_cfg(small_corpus, strategy="encoder", num_prompts=3, encoder_width=6)
    cfg.warm_up(frozen_backbone(tiny_model_cfg))
    model = PromptedModel(tiny_backbone(), cfg)
    batch = tiny_batch()
    embed = model.backbone.get_input_embeddings()
    kwargs = model.method.prepare_inputs(
        batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], embed
    )
    assert kwargs["inputs_embeds"].shape == (4, 3 + S, D)
    assert (kwargs["attention_mask"][:, :3] == 1).all()
    norms = kwargs["inputs_embeds"][:, :3].norm(dim=-1)
    expected = embed.weight.norm(dim=1).mean()
    torch.testing.assert_close(norms, expected.expand_as(norms))
    prompts = kwargs["inputs_embeds"][:, :3]
    assert not torch.allclose(prompts[0], prompts[1])  # instance-wise


@pytest.mark.parametrize("encoder", ["textcnn", "lstm", "mlp"])
def test_utilisation_rate_sets_how_many_tokens_are_read(
    tiny_model_cfg, tiny_backbone, tiny_batch, small_corpus, encoder
):
    batch = tiny_batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    changed = ids.clone()
    changed[0, 9:] = torch.arange(2000, 2007)  # row 0: 16 real tokens; alter its last 7
    prompts = {}
    for rho in (0.5, 1.0):
        cfg = _pretrained_cfg(
            small_corpus, strategy="encoder", encoder=encoder, encoder_width=4, utilisation=rho
        )
        cfg.warm_up(frozen_backbone(tiny_model_cfg))
        method = PromptedModel(tiny_backbone(), cfg).method
        prompts[rho] = [method.instance_prompt(x, mask)[0] for x in (ids, changed)]
    # ρ = 0.5 reads ceil(0.5·16) = 8 tokens of row 0: the change is not seen
    torch.testing.assert_close(prompts[0.5][0], prompts[0.5][1])
    assert not torch.allclose(prompts[1.0][0][0], prompts[1.0][1][0])
    torch.testing.assert_close(prompts[1.0][0][1:], prompts[1.0][1][1:])  # other rows as before


# ------------------------------------------------------------------------ deep placement


def _experiment(method_cfg, head_lr: float = 0.01):
    from raypeft.config.schema import ExperimentConfig, TrainConfig

    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=S),
        method=method_cfg,
        train=TrainConfig(head_lr=head_lr, max_steps=10, eval_every=5),
    )


def test_deep_placement_installs_layer_prompts_and_trains(tiny_backbone, tiny_batch, monkeypatch):
    cfg = IPTConfig(prompt_length=5, placement="deep", lr=0.05)
    model = PromptedModel(tiny_backbone(), cfg)
    method = model.method
    assert method.uses_layer_prompts
    from raypeft.modeling.backbones import transformer_layers

    layers = transformer_layers(model.backbone)
    assert not layers[0]._forward_pre_hooks and len(layers[1]._forward_pre_hooks) == 1
    assert method.num_trainable() == V * D + (N - 1) * 2 * D == cfg.num_params(model.dims)
    calls = []
    real = method.layer_prompt

    def spy(layer, hidden):
        out = real(layer, hidden)
        calls.append((layer, out.shape, hidden.shape))
        return out

    monkeypatch.setattr(method, "layer_prompt", spy)
    batch = tiny_batch(batch=8)
    labels = torch.ones(8, dtype=torch.long)
    opt = build_optimizer(model, _experiment(cfg, head_lr=1e-12))
    before = {k: v.clone() for k, v in method.state_dict().items()}
    losses = []
    for _ in range(4):
        loss = loss_fn(model(**batch).logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert calls[0] == (1, (8, 5, D), (8, 5 + S, D))
    assert losses[-1] < losses[0], losses
    for key in ("table", "layer_scale", "layer_shift"):
        assert not torch.equal(method.state_dict()[key], before[key]), key


def test_deep_layer_prompt_matches_hidden_scale(tiny_backbone, tiny_batch):
    model = PromptedModel(tiny_backbone(), IPTConfig(prompt_length=4, placement="deep"))
    batch = tiny_batch()
    embed = model.backbone.get_input_embeddings()
    model.method.prepare_inputs(batch["input_ids"], batch["attention_mask"], None, embed)
    hidden = torch.randn(4, 4 + S, D) * 7.0
    out = model.method.layer_prompt(1, hidden)
    rms = out.pow(2).mean(-1).sqrt()
    assert out.shape == (4, 4, D)
    torch.testing.assert_close(rms, torch.full_like(rms, 7.0), rtol=0.15, atol=0)


def test_deep_prompt_gradients_stay_finite_for_inputs_shorter_than_the_prompt(
    tiny_backbone, tiny_batch
):
    # the fixture's rows hold 16, 14, 12, 16 real tokens: with 14 prompt slots row 2 has two
    # padded (all-zero) slots, whose normalisation once sent NaN into the table's gradient
    model = PromptedModel(tiny_backbone(), IPTConfig(prompt_length=14, placement="deep"))
    batch = tiny_batch()
    loss = loss_fn(model(**batch).logits, torch.ones(4, dtype=torch.long))
    loss.backward()
    for name, p in model.method.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# ------------------------------------------------------------------------ counts, budgets

DIMS = BackboneDims(hidden_size=384, num_layers=6, vocab_size=30522, max_length=64)


@pytest.mark.parametrize("placement", ["input", "deep"])
@pytest.mark.parametrize("strategy", ["random", "pretrained", "encoder"])
def test_counts_equal_closed_forms(strategy, placement):
    cfg = IPTConfig(strategy=strategy, placement=placement, num_prompts=5, encoder_width=7)
    deep = (6 - 1) * 2 * 384 if placement == "deep" else 0
    if strategy == "encoder":
        expected = textcnn_encoder_params(384, 7, 5, 384) + deep
    else:
        expected = 30522 * 384 + deep
    assert cfg.num_params(DIMS) == expected
    assert ipt_deep_params(6, 384) == 3840


def test_encoder_width_derived_from_budget():
    budget = 100_000
    cfg = IPTConfig(strategy="encoder", encoder="lstm", num_prompts=4, budget_params=budget)
    resolved = cfg.resolve(DIMS)
    w = resolved.encoder_width
    assert lstm_encoder_params(384, w, 4, 384) <= budget < lstm_encoder_params(384, w + 1, 4, 384)
    assert resolved.derived() == {"encoder_width": w} and cfg.num_params(DIMS) <= budget
    assert resolved.resolve(DIMS) == resolved  # a resolved config is stable
    with pytest.raises(ValueError, match="contradicts"):
        cfg.model_copy(update={"encoder_width": w + 1}).resolve(DIMS)
    options = cfg.budget_options(budget, DIMS)
    assert options[0].settings == {"encoder": "lstm", "encoder_width": w}
    assert [o.settings["encoder"] for o in options] == ["lstm", "textcnn", "mlp"]
    for o in options:
        assert 0 <= o.slack and o.params <= budget
    mlp = options[2]
    w = mlp.settings["encoder_width"]
    assert mlp.params == mlp_encoder_params(384, w, 4, 384) == budget - mlp.slack
    # deep placement costs its (N−1)·2d first
    deep = cfg.model_copy(update={"placement": "deep"}).resolve(DIMS)
    assert deep.encoder_width <= resolved.encoder_width
    with pytest.raises(ValueError, match=r"`budget_params >= \d+` must hold for a lstm encoder"):
        cfg.model_copy(update={"budget_params": 1000}).resolve(DIMS)
    assert cfg.budget_options(1000, DIMS) == []


def test_table_strategies_check_their_budget():
    table = 30522 * 384
    cfg = IPTConfig(strategy="pretrained", budget_params=table)
    assert cfg.resolve(DIMS) == cfg and cfg.derived() == {}
    options = cfg.budget_options(table, DIMS)
    assert options[0].settings == {"prompt_length": 16}
    assert {o.params for o in options} == {table} and {o.slack for o in options} == {0}
    assert all(o.settings["prompt_length"] <= 64 for o in options)
    with pytest.raises(ValueError, match=r"`budget_params >= 11720448` must hold"):
        IPTConfig(strategy="random", budget_params=table - 1).resolve(DIMS)
    # below the table's count, the options are what encoder IPT can do instead
    instead = cfg.budget_options(table - 1, DIMS)
    assert instead and all(o.settings["strategy"] == "encoder" for o in instead)
    assert all(o.params <= table - 1 for o in instead)


def test_config_validation():
    with pytest.raises(ValidationError):
        IPTConfig(utilisation=0)
    with pytest.raises(ValidationError):
        IPTConfig(utilisation=1.5)
    with pytest.raises(ValidationError):
        IPTConfig(strategy="prompt")
    with pytest.raises(ValueError, match=r"`embed_dim == d` must hold .* \(embed_dim=64, d=384\)"):
        IPTConfig(strategy="pretrained", embed_dim=64).resolve(DIMS)
    IPTConfig(strategy="encoder", embed_dim=64).resolve(DIMS)  # the encoder projects e -> d
    one_layer = BackboneDims(hidden_size=8, num_layers=1, vocab_size=50, max_length=8)
    with pytest.raises(ValueError, match="`num_layers >= 2` must hold"):
        IPTConfig(placement="deep").resolve(one_layer)


@pytest.mark.slow
def test_examples_run(tiny_backbone, tiny_batch):
    for cfg in IPTConfig.examples().values():
        model = PromptedModel(tiny_backbone(), cfg)
        assert model(**tiny_batch()).logits.shape == (4, 2)
        assert set(model.param_groups()) == set(cfg.learning_rates()) | {"head"}


def test_encoder_writes_prompt_length_vectors_unless_num_prompts_is_set():
    cfg = IPTConfig(strategy="encoder", encoder="mlp", prompt_length=12, encoder_width=3)
    assert cfg.encoder_spec(DIMS).num_prompts == 12
    assert cfg.num_params(DIMS) == mlp_encoder_params(384, 3, 12, 384)
    assert cfg.model_copy(update={"num_prompts": 2}).encoder_spec(DIMS).num_prompts == 2


@pytest.mark.parametrize("strategy", ["encoder", "random"])
def test_save_load_round_trip(
    tmp_path, tiny_model_cfg, tiny_backbone, tiny_batch, small_corpus, strategy
):
    cfg = _pretrained_cfg(small_corpus, strategy=strategy, placement="deep", encoder="lstm")
    cfg.warm_up(frozen_backbone(tiny_model_cfg))
    model = PromptedModel(tiny_backbone(), cfg)
    with torch.no_grad():
        for p in model.method.parameters():
            p.add_(0.1)
    model.eval()
    batch = tiny_batch()
    expected = model(**batch).logits
    model.save_trainable(tmp_path)
    fresh = PromptedModel(tiny_backbone(), cfg)
    fresh.eval()
    fresh.load_trainable(tmp_path)
    torch.testing.assert_close(fresh(**batch).logits, expected)


def test_method_can_be_copied_after_a_forward(tiny_backbone, tiny_batch):
    import copy

    model = PromptedModel(tiny_backbone(), IPTConfig(prompt_length=4, placement="deep"))
    model(**tiny_batch()).logits.sum().backward()
    clone = copy.deepcopy(model.method)
    assert clone._prompt is None and torch.equal(clone.table, model.method.table)
