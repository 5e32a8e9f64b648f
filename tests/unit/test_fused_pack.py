"""A fused pack (raypeft.training.fused) steps its members as the member-by-member pack does.

Step by step: the same members (their own learning rates, weight decay, clipping norms,
batch sizes, prompt lengths and ranks, so the stacks are padded) on the same batches, once
through :func:`raypeft.training.pack_step.packed_step` and once fused, end with the same
tensors and AdamW state; on the heads raypeft meets (BERT's linear classifier, its mean
pooling, RoBERTa's two-layer head). Through :class:`raypeft.training.pack.Pack`, the tests in
test_pack.py and the pack contract run fused wherever a pack can be (on encoders); here a
pack's own fusing: members held back, padding that stays zero, and members that cannot fuse
stepping member by member.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from raypeft.config.schema import ExperimentConfig
from raypeft.methods.ipt.method import IPT, IPTConfig
from raypeft.modeling.backbones import HEAD_MODULE_NAMES, Backbone, backbone_dims
from raypeft.modeling.packed import PackedBackbone, shared_copy
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.fused import FusedPack, fusing_refusal
from raypeft.training.pack import MemberSpec, Pack
from raypeft.training.pack_step import Learner, packed_step
from tests.unit.test_pack import alone, assert_same, experiment, task  # noqa: F401 (fixture)

S = 12
TINY = dict(
    vocab_size=500, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0, num_labels=3,
)  # fmt: skip

# members that pad each other: prompt lengths, DePT ranks, learning rates, weight decay,
# clipping (one clips hard, one not at all), batch sizes
TRAINS = [
    {"weight_decay": 0.01, "max_grad_norm": 1e-3, "batch_size": 4},
    {"weight_decay": 0.0, "max_grad_norm": None, "batch_size": 6, "head_lr": 0.05},
    {"weight_decay": 0.1, "max_grad_norm": 1.0, "batch_size": 4, "warmup_ratio": 0.0},
]
MEMBERS = list(zip([
    {"name": "dept", "prompt_length": 2, "rank": 3, "lr_prompt": 0.3, "lr_lowrank": 0.05},
    {"name": "dept", "prompt_length": 5, "rank": 1, "lr_prompt": 0.1, "lr_lowrank": 0.2},
    {"name": "dept", "prompt_length": 3, "rank": 2, "lr_prompt": 0.05, "lr_lowrank": 0.01},
], TRAINS, strict=True))  # fmt: skip
# deep prompts (hidden style): every layer's prompt replaces its own positions only
DEEP = list(zip([
    {"name": "prefix", "style": "hidden", "prompt_length": 2, "lr": 0.3},
    {"name": "prefix", "style": "hidden", "prompt_length": 5, "lr": 0.1},
    {"name": "prefix", "style": "hidden", "prompt_length": 3, "lr": 0.05, "init": "normal"},
], TRAINS, strict=True))  # fmt: skip
# deep prompts (key/value style): every row's prefix in one cache; prefixes of different
# lengths get each row's encoder positions as alone (KV_EQUAL: one length, none needed)
KV = list(zip([
    {"name": "prefix", "style": "kv", "prompt_length": 2, "lr": 0.3},
    {"name": "prefix", "style": "kv", "prompt_length": 5, "lr": 0.1},
    {"name": "prefix", "style": "kv", "prompt_length": 3, "lr": 0.05, "init_seed": 4},
], TRAINS, strict=True))  # fmt: skip
KV_EQUAL = [({**method, "prompt_length": 3}, train) for method, train in KV]
# IDPG: dense generators of different widths and prompt lengths (M-IDPG, reading the previous
# layer; S-IDPG with A.5's residual and norms), and PHM generators of one shape (version L)
IDPG = {"name": "idpg", "generator": "dnn", "layers": "multi", "version": "M"}
IDPG_DENSE = list(zip([
    {**IDPG, "prompt_length": 2, "generator_hidden": 4, "lr": 0.05},
    {**IDPG, "prompt_length": 4, "generator_hidden": 8, "lr": 0.02},
    {**IDPG, "prompt_length": 3, "generator_hidden": 2, "lr": 0.1, "init_seed": 3},
], TRAINS, strict=True))  # fmt: skip
IDPG_NORMS = [
    ({**method, "layers": "single", "residual": True, "layer_norm": True}, train)
    for method, train in IDPG_DENSE
]
PHM = {"name": "idpg", "generator": "phm", "phm_n": 4, "prompt_length": 3, "generator_hidden": 8,
       "layers": "multi", "version": "L", "generator_input": "sentence"}  # fmt: skip
IDPG_PHM = list(zip([
    {**PHM, "lr": 0.05}, {**PHM, "lr": 0.02, "init_seed": 1}, {**PHM, "lr": 0.1, "init_seed": 2},
], TRAINS, strict=True))  # fmt: skip
# IPT's table strategy: prompt lengths longer than some rows' real tokens (masked), the deep
# placement's per-layer affine maps
IPT_TABLE = list(zip([
    {"name": "ipt", "prompt_length": 3, "lr": 0.05},
    {"name": "ipt", "prompt_length": 8, "lr": 0.02, "init_seed": 1},
    {"name": "ipt", "prompt_length": 5, "lr": 0.1, "init_seed": 2},
], TRAINS, strict=True))  # fmt: skip
IPT_DEEP = [({**method, "placement": "deep"}, train) for method, train in IPT_TABLE]
PT = list(zip([
    {"name": "pt", "prompt_length": 2, "lr": 0.3},
    {"name": "pt", "prompt_length": 5, "lr": 0.1, "init": "normal"},
    {"name": "pt", "prompt_length": 3, "lr": 0.05, "init_seed": 2},
], TRAINS, strict=True))  # fmt: skip
FUSED = {
    "dept": MEMBERS,
    "pt": PT,
    "deep prompts": DEEP,
    "kv prefixes": KV,
    "kv of one length": KV_EQUAL,
    "idpg": IDPG_DENSE,
    "idpg norms": IDPG_NORMS,
    "idpg phm": IDPG_PHM,
    "ipt": IPT_TABLE,
    "ipt deep": IPT_DEEP,
}


def _backbone(model_type: str, **extra) -> Backbone:
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.requires_grad_(False)
    model.eval()
    head = []
    for name, param in model.named_parameters():
        if any(part in HEAD_MODULE_NAMES for part in name.split(".")):
            param.requires_grad_(True)
            head.append(param)
    return Backbone(model=model, dims=backbone_dims(config, S), head_params=head)


def _learners(base: Backbone, members, head_pooling: str) -> list[Learner]:
    learners = []
    for index, (method, train) in enumerate(members):
        cfg = ExperimentConfig.model_validate(
            {
                "name": "fused",
                "model": {"name": "tiny-bert", "max_length": S},
                "method": method,
                "train": {"max_steps": 20, "eval_every": 20, "backbone_dropout": 0, **train},
            }
        )
        torch.manual_seed(index)
        head = [p for p in shared_copy(base.model).parameters() if p.requires_grad]
        model = PromptedModel(
            Backbone(shared_copy(base.model), base.dims, head),
            cfg.method,
            backbone_dropout=0.0,
            head_pooling=head_pooling,
        )
        model.train()
        learners.append(Learner.of(model, cfg, torch.device("cpu")))
    return learners


def _batches(step: int, members=MEMBERS) -> list[dict]:
    """Each member's batch of this step (of its own ``batch_size``), random tokens and
    lengths, the same for both ways of stepping."""
    gen = torch.Generator().manual_seed(step)
    batches = []
    for method, train in members:
        b = train["batch_size"]
        real = torch.randint(4, S + 1, (b,), generator=gen)
        mask = (torch.arange(S)[None, :] < real[:, None]).long()
        batch = {
            "input_ids": torch.randint(5, 500, (b, S), generator=gen) * mask,
            "attention_mask": mask,
            "token_type_ids": torch.zeros(b, S, dtype=torch.long),
            "labels": torch.randint(0, 3, (b,), generator=gen),
        }
        if method["name"] == "idpg":  # its M(x), computed once per example in a search
            width = TINY["hidden_size"]
            batch["features"] = {"sentence": torch.randn(b, width, generator=gen)}
        batches.append(batch)
    return batches


def _state(learners: list[Learner]) -> list[dict[str, torch.Tensor]]:
    """Each learner's trainable tensors and AdamW moments, by name."""
    states = []
    for learner in learners:
        named = {f"p.{n}": p.detach().clone() for n, p in learner.model.named_parameters()
                 if p.requires_grad}  # fmt: skip
        names = {id(p): n for n, p in learner.model.named_parameters()}
        for param, state in learner.optimizer.state.items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                named[f"{key}.{names[id(param)]}"] = state[key].detach().clone()
        states.append(named)
    return states


@pytest.mark.parametrize(
    ("model_type", "head_pooling", "members"),
    [
        ("bert", "first", "dept"),
        ("bert", "mean", "dept"),
        ("roberta", "first", "dept"),
        ("bert", "mean", "pt"),
        ("bert", "first", "deep prompts"),
        ("roberta", "mean", "deep prompts"),
        ("bert", "first", "kv prefixes"),
        ("roberta", "mean", "kv prefixes"),
        ("bert", "mean", "kv of one length"),
        ("bert", "first", "idpg"),
        ("roberta", "mean", "idpg"),
        ("bert", "first", "idpg norms"),
        ("bert", "mean", "idpg phm"),
        ("bert", "first", "ipt"),
        ("roberta", "mean", "ipt deep"),
    ],
)
def test_a_fused_step_is_the_member_by_member_step(model_type, head_pooling, members):
    """Eight steps of three padded members (DePT; PT; deep prompts, hidden and key/value; IDPG's
    generators; IPT's tables), fused and member by member, from the same start on the same
    batches: the same losses, tensors, moments and learning rates."""
    members = FUSED[members]
    extra = {"pad_token_id": 1} if model_type == "roberta" else {}
    base = _backbone(model_type, **extra)
    pack = PackedBackbone(shared_copy(base.model), "encoder", "fp32", 0.0, head_pooling)
    ours = _learners(base, members, head_pooling)
    theirs = _learners(base, members, head_pooling)  # the same seeds: the same start
    for learner in ours + theirs:
        pack.check_member(learner.model)
    assert fusing_refusal(pack, ours) is None
    fused = FusedPack(pack, ours)
    for step in range(8):
        a = fused.step(range(3), _batches(step, members))
        b = packed_step(pack, theirs, _batches(step, members))
        assert a.losses == pytest.approx(b.losses, rel=1e-5)
        assert a.shape == b.shape
    fused.write_back()
    for mine, want in zip(_state(ours), _state(theirs), strict=True):
        assert mine.keys() == want.keys()
        for key, tensor in want.items():
            torch.testing.assert_close(mine[key], tensor, rtol=1e-4, atol=1e-6, msg=key)
    for x, y in zip(ours, theirs, strict=True):
        assert x.scheduler.get_last_lr() == y.scheduler.get_last_lr()
        assert x.scheduler.state_dict() == y.scheduler.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("members", "head_pooling"),
    [
        ("dept", "first"),
        ("pt", "first"),
        ("deep prompts", "first"),
        ("kv prefixes", "first"),
        ("idpg", "first"),
        # mean, as its eager case above: with the first token's pooling, PHM's fused einsums
        # drift from the member's own by ~1e-5 in five steps, eager as well as compiled
        ("idpg phm", "mean"),
        ("ipt", "first"),
        # first, where compiled differs only by float rounding: with mean pooling one table
        # entry lands 2.2e-6 off (1.01x the tolerance), eager fused within it
        ("ipt deep", "first"),
    ],
)
def test_a_compiled_fused_step_is_the_member_by_member_step(members, head_pooling):
    """``resources.compile_packs``: the fused step compiled with ``torch.compile`` (static
    shapes: every slot a full batch of rows, blanks weighted 0; prompts in buckets), a member
    held back for two steps, agrees with the eager member-by-member step: DePT, PT, deep
    prompts (hidden and key/value), IDPG (dense and PHM) and IPT's tables (input and deep)."""
    members = FUSED[members]
    base = _backbone("bert")
    pack = PackedBackbone(shared_copy(base.model), "encoder", "fp32", 0.0, head_pooling)
    ours, theirs = (_learners(base, members, head_pooling) for _ in range(2))
    rows = max(train["batch_size"] for _, train in members)
    fused = FusedPack(pack, ours, compile_rows=rows)
    for step in range(5):
        slots = [0, 2] if step in (2, 3) else [0, 1, 2]  # member 1 held back
        batches = [_batches(step, members)[s] for s in slots]
        # after the first step's compilation, any recompile (a member held back changing a
        # shape) raises: one graph serves the whole membership (torch's public stance API)
        stance = "fail_on_recompile" if step else "default"
        with torch.compiler.set_stance(stance):
            a = fused.step(slots, batches)
        b = packed_step(pack, [theirs[s] for s in slots], batches)
        assert a.losses == pytest.approx(b.losses, rel=1e-5)
    fused.write_back()
    for mine, want in zip(_state(ours), _state(theirs), strict=True):
        for key, tensor in want.items():
            torch.testing.assert_close(mine[key], tensor, rtol=1e-4, atol=1e-6, msg=key)


def test_padding_in_the_stacks_stays_zero():
    """A rank or prompt shorter than the pack's longest is zero-padded in the stacks, and the
    padding never moves: its gradient is exactly zero, so weight decay and AdamW keep it."""
    base = _backbone("bert")
    pack = PackedBackbone(shared_copy(base.model), "encoder", "fp32", 0.0, "first")
    fused = FusedPack(pack, _learners(base, MEMBERS, "first"))
    for step in range(5):
        fused.step(range(3), _batches(step))
    a, b, prompt = (fused.params[f"method.{n}"] for n in ("lora_a", "lora_b", "prompt"))
    assert a.shape[2] == b.shape[1] == 3 and prompt.shape[1] == 5  # the largest rank, length
    for slot, (method, _) in enumerate(MEMBERS):
        r, m = method["rank"], method["prompt_length"]
        assert torch.count_nonzero(a[slot, :, r:]) == 0
        assert torch.count_nonzero(b[slot, r:]) == 0
        assert torch.count_nonzero(prompt[slot, m:]) == 0
        assert torch.count_nonzero(prompt[slot, :m]) > 0


def test_a_member_held_back_keeps_its_state_while_the_others_step(task):  # noqa: F811
    """A pack server holds a member until its trial's report is acknowledged: its tensors,
    moments and schedule do not move while its mates step, and it then trains as alone."""
    cfgs = {"a": experiment(2, 0.05, max_steps=6), "b": experiment(4, 0.1, max_steps=6)}
    pack = Pack(task, capacity=2)
    for key, cfg in cfgs.items():
        pack.add(MemberSpec(key, cfg))
    reports: dict[str, list[dict]] = {}
    held = {"b"}
    for _ in range(3):  # a steps alone: b is held
        pack.step(keys={"a"})
        for key, metrics in pack.evaluate([k for k in pack.due() if k not in held]).items():
            reports.setdefault(key, []).append(metrics)
    assert pack.not_fused is None
    assert pack.member("b").loop.step == 0
    while any(not m.finished for m in pack.members):
        pack.step()
        for key, metrics in pack.evaluate(pack.due()).items():
            reports.setdefault(key, []).append(metrics)
    for key, cfg in cfgs.items():
        assert_same(alone(cfg, task), reports[key])


def test_members_a_stack_cannot_hold_are_refused():
    """IDPG members whose generators differ in structure, or PHM ones in shape, and IPT's
    encoder strategy have no fused form: the pack says why (and steps them one by one)."""
    base = _backbone("bert")
    pack = PackedBackbone(shared_copy(base.model), "encoder", "fp32", 0.0, "first")
    wider = [IDPG_PHM[0], ({**PHM, "generator_hidden": 12, "phm_n": 4}, TRAINS[1])]
    why = fusing_refusal(pack, _learners(base, wider, "first"))
    assert why == "its IDPG members' generators differ in generator_hidden"
    versions = [IDPG_DENSE[0], ({**IDPG_DENSE[1][0], "version": "S"}, TRAINS[1])]
    why = fusing_refusal(pack, _learners(base, versions, "first"))
    assert why == "its IDPG members' generators differ in version"
    encoder = SimpleNamespace(config=IPTConfig(strategy="encoder", encoder="lstm"))
    assert IPT.fusing_limitation([encoder]) == (
        "IPT's encoder strategy has no fused form (its encoders run member by member)"
    )


def test_members_of_different_methods_step_member_by_member(task):  # noqa: F811
    """A pack whose members' methods differ has no fused form: it says why and steps its
    members one by one, as before (the pack contract holds them to their trials alone)."""
    dept = {"name": "dept", "prompt_length": 2, "rank": 2, "lr_prompt": 0.05, "lr_lowrank": 0.01}
    cfg = ExperimentConfig.model_validate({**experiment().model_dump(mode="json"), "method": dept})
    pack = Pack(task, capacity=2)
    pack.add(MemberSpec("a", experiment()))
    pack.add(MemberSpec("b", cfg))
    pack.step()
    assert pack.not_fused == "its members use different methods"


def test_fusing_can_be_turned_off(task):  # noqa: F811
    """``Pack(fuse=False)`` steps member by member (the reference the fused step is held to)."""
    pack = Pack(task, capacity=2, fuse=False)
    pack.add(MemberSpec("a", experiment(3, 0.05, max_steps=2)))
    pack.step()
    assert pack.not_fused == "fusing is off"
