"""PT and DePT on the tiny random BERT: shapes, freezing, counts, training, save/load."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from raypeft.config.schema import ExperimentConfig, ModelConfig, TrainConfig
from raypeft.methods import METHODS, BackboneDims, build_method
from raypeft.methods.dept import DePT, DePTConfig
from raypeft.methods.prompt_tuning import PromptTuning, PromptTuningConfig
from raypeft.modeling.prompted import TRAINABLE_FILE, PromptedModel
from raypeft.modeling.prompted import head_loss as loss_fn
from raypeft.training.optimizer import build_optimizer

NUM_LABELS = 2
HEAD_SIZE = 32 * NUM_LABELS + NUM_LABELS  # tiny-bert classifier: d·k + k

METHOD_CONFIGS = {
    "pt": PromptTuningConfig(prompt_length=5, lr=0.05),
    "dept-rank": DePTConfig(prompt_length=3, rank=4, lr_prompt=0.05, lr_lowrank=0.01),
    # tiny-bert d=32, s=16: r = (10−4)·32 // 48 = 4; count 4·32 + 48·4 = 320 = PT's 10·32
    "dept-budget": DePTConfig(
        prompt_length=4, budget_prompt_length=10, lr_prompt=0.05, lr_lowrank=0.01
    ),
}


@pytest.fixture(params=list(METHOD_CONFIGS))
def method_cfg(request):
    return METHOD_CONFIGS[request.param]


def experiment(method_cfg, head_lr: float = 0.01, **train) -> ExperimentConfig:
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=16),
        method=method_cfg,
        train=TrainConfig(head_lr=head_lr, max_steps=10, eval_every=5, **train),
    )


def method_tensors(model: PromptedModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.method.state_dict().items()}


def test_logits_shape(tiny_backbone, tiny_batch, method_cfg):
    model = PromptedModel(tiny_backbone(), method_cfg)
    logits = model(**tiny_batch(batch=5)).logits
    assert logits.shape == (5, NUM_LABELS)
    assert torch.isfinite(logits).all()
    # without token_type_ids too
    batch = tiny_batch(batch=3)
    assert model(batch["input_ids"], batch["attention_mask"]).logits.shape == (3, NUM_LABELS)


def test_only_head_and_method_train(tiny_backbone, method_cfg):
    model = PromptedModel(tiny_backbone(), method_cfg)
    trainable = {n for n, p in model.backbone.named_parameters() if p.requires_grad}
    assert trainable == {"classifier.weight", "classifier.bias"}
    assert all(p.requires_grad for p in model.method.parameters())
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert total == model.method.num_trainable() + HEAD_SIZE
    groups = model.param_groups()
    assert sum(p.numel() for p in groups["head"]) == HEAD_SIZE
    grouped = sum(p.numel() for name, ps in groups.items() if name != "head" for p in ps)
    assert grouped == model.method.num_trainable()
    assert set(groups) == set(method_cfg.learning_rates()) | {"head"}


def test_count_matches_closed_form(tiny_backbone, method_cfg):
    backbone = tiny_backbone()
    model = PromptedModel(backbone, method_cfg)
    expected = method_cfg.num_params(backbone.dims)
    assert model.method.num_trainable() == expected
    d, s = backbone.dims.hidden_size, backbone.dims.max_length
    if isinstance(method_cfg, PromptTuningConfig):
        assert isinstance(model.method, PromptTuning)
        assert expected == method_cfg.prompt_length * d
    else:
        assert isinstance(model.method, DePT)
        r = method_cfg.resolve(backbone.dims).rank
        assert expected == method_cfg.prompt_length * d + (s + d) * r
        assert model.method.lora_a.shape == (s, r) and model.method.lora_b.shape == (r, d)
        if method_cfg.budget_prompt_length is not None:
            assert r == 4 and expected == method_cfg.budget_prompt_length * d  # no slack here


def test_dept_resolve_records_derived_rank(tiny_backbone):
    dims = tiny_backbone().dims
    cfg = METHOD_CONFIGS["dept-budget"]
    assert cfg.rank is None
    assert cfg.resolve(dims).rank == 4 and cfg.resolve(dims).derived() == {"rank": 4}
    assert METHOD_CONFIGS["dept-rank"].derived() == {}
    # a budget that leaves no rank is rejected at resolution (d=32, s=16: 1 token = 32 < 48)
    with pytest.raises(ValueError, match="r >= 1"):
        DePTConfig(prompt_length=9, budget_prompt_length=10).resolve(dims)


def test_dept_resolved_config_is_stable(tiny_backbone, tiny_batch):
    # a resolved config (rank recorded next to its budget, as in a checkpoint) builds the same model
    backbone = tiny_backbone()
    cfg = METHOD_CONFIGS["dept-budget"]
    resolved = cfg.resolve(backbone.dims)
    assert resolved.resolve(backbone.dims) == resolved
    assert resolved.num_params(backbone.dims) == cfg.num_params(backbone.dims) == 320
    a = PromptedModel(backbone, cfg)
    b = PromptedModel(tiny_backbone(), resolved)
    assert all(torch.equal(v, b.method.state_dict()[k]) for k, v in a.method.state_dict().items())
    batch = tiny_batch()
    assert torch.equal(a(**batch).logits, b(**batch).logits)
    with pytest.raises(ValueError, match="rank=3 contradicts"):
        PromptedModel(tiny_backbone(), cfg.model_copy(update={"rank": 3}))


@pytest.mark.parametrize(
    "dept_cfg", [METHOD_CONFIGS["dept-rank"], METHOD_CONFIGS["dept-budget"]], ids=["rank", "budget"]
)
def test_dept_at_init_equals_pt(tiny_backbone, tiny_batch, dept_cfg):
    pt_cfg = PromptTuningConfig(prompt_length=dept_cfg.prompt_length, init_seed=dept_cfg.init_seed)
    dept = PromptedModel(tiny_backbone(), dept_cfg)
    pt = PromptedModel(tiny_backbone(), pt_cfg)
    assert torch.equal(dept.method.lora_b, torch.zeros_like(dept.method.lora_b))
    assert dept.method.lora_a.abs().sum() > 0
    assert torch.equal(dept.method.prompt, pt.method.prompt)
    batch = tiny_batch()
    assert torch.equal(dept(**batch).logits, pt(**batch).logits)


@pytest.mark.parametrize("lowrank_init", ["official", "paper"])
def test_dept_applies_lowrank_offset_for_classification(tiny_backbone, tiny_batch, lowrank_init):
    dept_cfg = METHOD_CONFIGS["dept-rank"].model_copy(update={"lowrank_init": lowrank_init})
    dept = PromptedModel(tiny_backbone(), dept_cfg)
    pt = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=dept_cfg.prompt_length))
    with torch.no_grad():
        dept.method.lora_b.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    batch = tiny_batch()
    assert not torch.allclose(dept(**batch).logits, pt(**batch).logits, atol=1e-4)
    # the offset is exactly A·B added to the word embeddings of the s input positions, scaled
    # by lora_alpha/√r = 8/√4 as DePT's code does (official), or not at all (paper)
    embed = dept.backbone.get_input_embeddings()
    kwargs = dept.method.prepare_inputs(
        batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], embed
    )
    m = dept_cfg.prompt_length
    scale = 4.0 if lowrank_init == "official" else 1.0
    expected = embed(batch["input_ids"]) + scale * (dept.method.lora_a @ dept.method.lora_b)
    torch.testing.assert_close(kwargs["inputs_embeds"][:, m:], expected)
    assert torch.equal(kwargs["inputs_embeds"][0, :m], dept.method.prompt)
    assert kwargs["attention_mask"].shape == (4, m + 16)
    assert (kwargs["attention_mask"][:, :m] == 1).all()
    assert torch.equal(kwargs["attention_mask"][:, m:], batch["attention_mask"])
    assert (kwargs["token_type_ids"][:, :m] == 0).all()


def test_optimizer_groups_learning_rates(tiny_backbone, method_cfg):
    model = PromptedModel(tiny_backbone(), method_cfg)
    opt = build_optimizer(
        model, experiment(method_cfg, head_lr=0.007, weight_decay=0.02, adam_eps=1e-7)
    )
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    if isinstance(method_cfg, PromptTuningConfig):
        assert lrs == {"prompt": method_cfg.lr, "head": 0.007}
    else:
        assert lrs == {
            "prompt": method_cfg.lr_prompt,
            "lowrank": method_cfg.lr_lowrank,
            "head": 0.007,
        }
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["prompt"]["params"] == [model.method.prompt]
    if "lowrank" in by_name:
        assert by_name["lowrank"]["params"] == [model.method.lora_a, model.method.lora_b]
    head_ids = {id(p) for p in by_name["head"]["params"]}
    assert head_ids == {id(model.backbone.classifier.weight), id(model.backbone.classifier.bias)}
    for g in opt.param_groups:
        assert g["weight_decay"] == 0.02 and g["eps"] == 1e-7 and g["betas"] == (0.9, 0.98)
    # no frozen parameter is handed to the optimizer
    assert all(p.requires_grad for g in opt.param_groups for p in g["params"])


def _train_steps(model, cfg, batch, labels, steps):
    opt = build_optimizer(model, cfg)
    model.train()
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(**batch).logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        losses.append(loss_fn(model(**batch).logits, labels).item())
    return losses


# The tiny random BERT's first-position output barely depends on the input (its weights have
# std 0.02 and, with a prompt prepended, position 0 is a prompt token), so the fixed batch has
# one label: the trainable tensors must move the output towards it.
LABELS = torch.ones(8, dtype=torch.long)


def test_training_steps_move_only_trainable_tensors(tiny_backbone, tiny_batch, method_cfg):
    model = PromptedModel(tiny_backbone(), method_cfg)
    frozen = {
        n: p.detach().clone() for n, p in model.backbone.named_parameters() if not p.requires_grad
    }
    head = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if p.requires_grad}
    before = method_tensors(model)
    losses = _train_steps(model, experiment(method_cfg), tiny_batch(batch=8), LABELS, steps=8)
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    for name, value in model.backbone.named_parameters():
        if name in frozen:
            assert torch.equal(value, frozen[name]), name
            assert value.grad is None, name
        else:
            assert not torch.equal(value, head[name]), name
    after = method_tensors(model)
    assert set(after) == set(before)
    for key in before:  # prompt, and DePT's A and B
        assert not torch.equal(after[key], before[key]), key


def test_method_alone_reduces_loss(tiny_backbone, tiny_batch, method_cfg):
    # head learning rate ~0: the fall comes from the prompt (and A·B) through the backbone
    model = PromptedModel(tiny_backbone(), method_cfg)
    losses = _train_steps(
        model, experiment(method_cfg, head_lr=1e-12), tiny_batch(batch=8), LABELS, steps=4
    )
    assert losses[-1] < losses[0] - 0.02, losses


def test_dept_rejects_unpadded_inputs(tiny_backbone, tiny_batch):
    model = PromptedModel(tiny_backbone(), METHOD_CONFIGS["dept-rank"])
    for length in (10, 20):
        with pytest.raises(ValueError, match=rf"exactly s=16 tokens, got {length}"):
            model(**tiny_batch(length=length))
    # PT has no per-position parameter: any length works
    pt = PromptedModel(tiny_backbone(), METHOD_CONFIGS["pt"])
    assert pt(**tiny_batch(length=10)).logits.shape == (4, NUM_LABELS)


def _perturb(model: PromptedModel, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for group in model.param_groups().values():
            for p in group:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def test_save_load_round_trip(tmp_path, tiny_backbone, tiny_batch, method_cfg):
    model = PromptedModel(tiny_backbone(), method_cfg)
    _perturb(model)  # differ from a fresh init everywhere (DePT's B included)
    batch = tiny_batch()
    model.eval()
    expected = model(**batch).logits
    path = model.save_trainable(tmp_path)
    assert path == tmp_path / TRAINABLE_FILE and path.is_file()
    from safetensors.torch import load_file

    saved = load_file(str(path))
    assert set(saved) == {f"method.{k}" for k in model.method.state_dict()} | {
        "head.classifier.weight",
        "head.classifier.bias",
    }
    fresh = PromptedModel(tiny_backbone(), method_cfg)
    fresh.eval()
    assert not torch.equal(fresh(**batch).logits, expected)
    fresh.load_trainable(tmp_path)
    assert torch.equal(fresh(**batch).logits, expected)
    for key, value in fresh.trainable_state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_load_mismatched_keys_raises(tiny_backbone):
    pt = PromptedModel(tiny_backbone(), METHOD_CONFIGS["pt"])
    dept = PromptedModel(tiny_backbone(), METHOD_CONFIGS["dept-rank"])
    before = method_tensors(dept)
    with pytest.raises(ValueError, match=r"missing \['method.lora_a', 'method.lora_b'\]"):
        dept.load_trainable_state_dict(pt.trainable_state_dict())
    state = pt.trainable_state_dict()
    state["head.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unexpected \['head.extra'\]"):
        pt.load_trainable_state_dict(state)
    # nothing was loaded on failure
    assert all(torch.equal(v, before[k]) for k, v in method_tensors(dept).items())


def test_load_mismatched_method_shape_raises(tiny_backbone):
    short = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=4))
    long = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=8))
    # torch's own size check fires (a RuntimeError, not the ValueError of a key mismatch)
    with pytest.raises((ValueError, RuntimeError), match="size mismatch|shape"):
        short.load_trainable_state_dict(long.trainable_state_dict())


def test_load_mismatched_head_shape_raises(tiny_backbone):
    two = PromptedModel(tiny_backbone(num_labels=2), PromptTuningConfig(prompt_length=4))
    one = PromptedModel(
        tiny_backbone(num_labels=1, problem="regression"), PromptTuningConfig(prompt_length=4)
    )
    with pytest.raises(ValueError):
        two.load_trainable_state_dict(one.trainable_state_dict())


def test_regression_head(tiny_backbone, tiny_batch, method_cfg):
    backbone = tiny_backbone(num_labels=1, problem="regression")
    model = PromptedModel(backbone, method_cfg)
    batch = tiny_batch(batch=6)
    logits = model(**batch).logits
    assert logits.shape == (6, 1)
    assert {n for n, p in model.backbone.named_parameters() if p.requires_grad} == {
        "classifier.weight",
        "classifier.bias",
    }
    targets = torch.linspace(0, 5, 6)
    opt = build_optimizer(model, experiment(method_cfg, head_lr=0.05))
    first = loss_fn(model(**batch).logits, targets)
    assert first.item() == pytest.approx(torch.mean((logits.squeeze(-1) - targets) ** 2).item())
    for _ in range(10):
        loss = loss_fn(model(**batch).logits, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss_fn(model(**batch).logits, targets).item() < first.item()


def test_train_mode_runs_the_backbones_dropout(tiny_backbone, tiny_batch):
    # default (backbone_dropout: config): training mode reaches the backbone and its head, whose
    # dropout then runs (tiny-bert's config: 0.1); evaluation is deterministic again
    model = PromptedModel(tiny_backbone(), METHOD_CONFIGS["pt"])
    model.train()
    assert model.training and model.method.training
    assert all(module.training for module in model.backbone.modules())
    batch = tiny_batch()
    assert not torch.equal(model(**batch).logits, model(**batch).logits)
    model.eval()
    assert not model.training and not model.method.training
    assert not any(module.training for module in model.backbone.modules())
    assert torch.equal(model(**batch).logits, model(**batch).logits)


def test_backbone_dropout_zero_keeps_the_backbone_in_eval_mode(tiny_backbone, tiny_batch):
    model = PromptedModel(tiny_backbone(), METHOD_CONFIGS["pt"], backbone_dropout=0.0)
    model.train()
    assert model.training and model.method.training
    # the frozen backbone and its head stay in eval mode: no dropout, no random numbers drawn
    assert not any(module.training for module in model.backbone.modules())
    batch = tiny_batch()
    rng = torch.get_rng_state()
    assert torch.equal(model(**batch).logits, model(**batch).logits)
    assert torch.equal(torch.get_rng_state(), rng)


def test_backbone_is_frozen_and_seeded(tiny_backbone):
    a, b, c = tiny_backbone(seed=0), tiny_backbone(seed=0), tiny_backbone(seed=1)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert [p for p in a.head_params] == [a.model.classifier.weight, a.model.classifier.bias]
    assert not a.model.training
    assert a.dims.hidden_size == 32 and a.dims.num_layers == 2 and a.dims.max_length == 16
    assert a.dims.vocab_size == a.word_embeddings.weight.shape[0]
    copy.deepcopy(a.model)  # a frozen backbone can be copied (used by parallel trials)


# ---------------------------------------------------------------- paper shapes (T5-base)

T5_BASE = BackboneDims(hidden_size=768, num_layers=12, vocab_size=32128, max_length=256)


@pytest.fixture(scope="module")
def t5_base_embeddings():
    return torch.nn.Embedding(T5_BASE.vocab_size, T5_BASE.hidden_size)


def test_pt_module_has_76800_params_at_t5_base_shape(t5_base_embeddings):
    cfg = PromptTuningConfig(prompt_length=100)
    method = build_method(cfg, T5_BASE, t5_base_embeddings)
    assert method.num_trainable() == cfg.num_params(T5_BASE) == 76_800


@pytest.mark.parametrize(("m", "r"), [(20, 60), (40, 45), (60, 30), (80, 15)])
def test_dept_module_has_76800_params_at_t5_base_shape(t5_base_embeddings, m, r):
    cfg = DePTConfig(prompt_length=m, budget_prompt_length=100)
    method = build_method(cfg, T5_BASE, t5_base_embeddings)
    assert method.lora_a.shape == (256, r) and method.lora_b.shape == (r, 768)
    assert method.prompt.shape == (m, 768)
    assert method.num_trainable() == cfg.num_params(T5_BASE) == 76_800


def test_every_module_of_the_methods_package_is_imported_and_registers():
    """A method is one file: the package imports every module in it, so a new method's file
    registers without editing anything else; the built-ins keep their listing order."""
    import raypeft.methods as methods

    folder = Path(methods.__file__).parent
    files = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    assert set(methods._method_modules()) == files | packages
    assert all(f"raypeft.methods.{name}" in sys.modules for name in files | packages)
    assert list(METHODS)[:5] == ["pt", "dept", "prefix", "idpg", "ipt"]


def test_a_kv_prefix_reaches_the_backbone_under_its_own_argument_name(tiny_backbone, tiny_batch):
    """transformers 5.24 renamed the models' past_key_values argument cache (the old name a
    deprecated alias until 5.40): the prefix goes under the name the installed model declares,
    so a kv deep prompt neither warns nor breaks when the alias goes."""
    import inspect
    import warnings

    from raypeft.methods.deep_prompts import DeepPromptConfig
    from raypeft.modeling.backbones import cache_argument

    model = PromptedModel(tiny_backbone(), DeepPromptConfig(style="kv", prompt_length=3))
    declared = inspect.signature(type(model.backbone.base_model).forward).parameters
    assert cache_argument(model.backbone) in declared
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        logits = model(**tiny_batch(batch=3)).logits
    assert logits.shape == (3, NUM_LABELS) and torch.isfinite(logits).all()
