"""A pack served to trials in other threads (raypeft.training.pack_host), and the registry's
bookkeeping of seats (raypeft.search.packs.PackBook), without Ray.

The host holds each member after a report until its trial asks for the next one (Tune
accepted the report); a member that leaves frees its slot for the next trial; each member
reports what its trial reports alone. Prompt tuning on the tiny BERT and a synthetic task.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from raypeft.config.schema import ExperimentConfig, ModelConfig, TrainConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.methods import BackboneDims
from raypeft.methods.deep_prompts import DeepPromptConfig
from raypeft.methods.dept import DePTConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.search.packs import PackBook, Place, PromptShape, backbone_group, padding_per_row
from raypeft.training.checkpoints import CONFIG_FILE
from raypeft.training.loop import train
from raypeft.training.pack import MemberSpec
from raypeft.training.pack_host import MemberGone, PackHost, PackRefused
from raypeft.training.result_keys import FAILURE_KEY, PACK_ID_KEY, PACK_SIZE_KEY, PHASE_PREFIX

S = 16
# timings (a trial's phases too: a pack's members do not time theirs), the pack's keys
NOT_COMPARED = ("samples_per_s", "memory", "wall_time", PHASE_PREFIX, "pack_")


def synthetic_split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Random tokens; the label is given by the token right after [CLS]."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, S))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    return {
        "input_ids": ids.astype(np.int64),
        "attention_mask": np.ones((n, S), np.int64),
        "token_type_ids": np.zeros((n, S), np.int64),
        "labels": labels.astype(np.int64),
    }


@pytest.fixture(scope="module")
def task() -> TokenizedTask:
    spec = TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy",))
    splits = {"train": synthetic_split(32, 0), "validation": synthetic_split(8, 1)}
    return TokenizedTask(
        spec=spec, label_names=None, splits={**splits, "test": splits["validation"]}
    )


def experiment(length: int = 4, lr: float = 0.05, **train_kw) -> ExperimentConfig:
    train_kw = {
        "max_steps": 4,
        "eval_every": 2,
        "batch_size": 8,
        "eval_batch_size": 8,
        "head_lr": 1e-2,
        "precision": "fp32",
        "backbone_dropout": 0,  # members equal their trials alone with dropout off
        **train_kw,
    }
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=S),
        method=PromptTuningConfig(prompt_length=length, lr=lr),
        train=TrainConfig(**train_kw),
    )


def alone(cfg, task) -> list[dict]:
    reports: list[dict] = []
    train(cfg, task, lambda m, f: reports.append(dict(m)))
    return reports


def assert_same(expected: list[dict], got: list[dict]) -> None:
    assert len(got) == len(expected)
    for a, p in zip(expected, got, strict=True):
        keys = [k for k in a if not any(part in k for part in NOT_COMPARED)]
        for key in keys:
            want = a[key] if isinstance(a[key], str) else pytest.approx(a[key], rel=1e-4)
            assert p[key] == want, key


@pytest.fixture
def host(task, tmp_path):
    left: list[str] = []
    made = PackHost(
        task,
        capacity=2,
        pack_id="p1",
        on_leave=left.append,
        scratch=str(tmp_path),
        poll_s=0.05,
        full_wait_s=0.2,  # a join that finds the pack full is refused soon
    ).start()
    made.left = left
    yield made
    made.close()


def relay(host: PackHost, key: str, stop_after: int | None = None) -> list[dict]:
    """What a trial does: fetch reports until the last (or leave after ``stop_after``)."""
    got = []
    while True:
        report = host.next_report(key, timeout=60)
        got.append(report.metrics)
        assert report.folder is None or (Path(report.folder) / CONFIG_FILE).is_file()
        if report.final or len(got) == stop_after:
            host.leave(key)
            return got


def test_each_member_reports_what_its_trial_reports_alone(task, host):
    cfgs = {"a": experiment(2, 0.05), "b": experiment(5, 0.1, batch_size=4, max_steps=6)}
    for key, cfg in cfgs.items():
        host.join(MemberSpec(key, cfg))
    got: dict[str, list[dict]] = {}
    threads = [
        threading.Thread(target=lambda k=k: got.__setitem__(k, relay(host, k))) for k in cfgs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for key, cfg in cfgs.items():
        assert_same(alone(cfg, task), got[key])
    assert {r[PACK_ID_KEY] for r in got["b"]} == {"p1"}
    assert got["a"][0][PACK_SIZE_KEY] == 2
    assert sorted(host.left) == ["a", "b"]  # each slot freed once its trial ended


def test_a_member_waits_for_its_trial_to_accept_each_report(host):
    """After a report, a member takes no step until its trial asks for the next report; the
    other members train on meanwhile; the acknowledged report's checkpoint is removed."""
    host.join(MemberSpec("slow", experiment(3, max_steps=8)))
    host.join(MemberSpec("fast", experiment(4, max_steps=8)))
    first = host.next_report("slow", timeout=60)
    assert first.metrics["step"] == 2 and Path(first.folder).is_dir()
    relay(host, "fast")  # fast runs to its end while slow's report is not acknowledged
    assert host.pack.member("slow").loop.step == 2
    second = host.next_report("slow", timeout=60)  # acknowledges the first
    assert second.metrics["step"] == 4
    assert not Path(first.folder).exists()


def test_a_stopped_member_leaves_and_the_next_trial_takes_its_slot(host):
    host.join(MemberSpec("a", experiment(2)))
    host.join(MemberSpec("b", experiment(3)))
    with pytest.raises(PackRefused, match="full"):
        host.join(MemberSpec("c", experiment(4)))
    assert relay(host, "a", stop_after=1)[0]["step"] == 2  # its scheduler stopped it
    host.join(MemberSpec("c", experiment(4)))  # a's slot
    assert host.pack.member("c").slot == 0
    with pytest.raises(MemberGone):
        host.next_report("a", timeout=5)
    assert [r["step"] for r in relay(host, "c")] == [2, 4]
    assert host.left.count("a") == 1


def test_a_member_made_to_fail_leaves_and_its_trial_gets_the_reason(host):
    """What watches a member's trial found it cannot go on (PackHost.fail): the member
    leaves, its slot is free, and its trial's next report raises the reason, never a bare
    MemberGone; the other member trains on."""
    host.join(MemberSpec("a", experiment(2, max_steps=8)))
    host.join(MemberSpec("b", experiment(3, max_steps=8)))
    host.next_report("a", timeout=60)  # a is held at its first report
    host.fail("a", RuntimeError("its actor cannot be asked"))
    with pytest.raises(RuntimeError, match="^its actor cannot be asked$"):
        host.next_report("a", timeout=60)
    assert [r["step"] for r in relay(host, "b")] == [2, 4, 6, 8]
    assert host.left == ["a", "b"]  # a's slot was freed once, as it failed


def test_a_join_waits_for_the_slot_of_a_trial_that_is_leaving(task):
    """A trial seated by the registry may arrive before the leave of the trial whose slot
    it takes: it waits for that slot rather than being refused."""
    host = PackHost(task, capacity=1, poll_s=0.05).start()
    try:
        host.join(MemberSpec("a", experiment(2)))
        host.next_report("a", timeout=60)
        joined = threading.Thread(target=host.join, args=(MemberSpec("b", experiment(3)),))
        joined.start()
        time.sleep(0.2)
        assert joined.is_alive()  # the pack is full: b waits
        host.leave("a")
        joined.join(60)
        assert [m.key for m in host.pack.members] == ["b"]
    finally:
        host.close()


def test_a_trial_that_cannot_share_the_backbone_is_refused(host):
    host.join(MemberSpec("a", experiment()))
    # a randomly initialised test model's weights come from its seed: another backbone
    with pytest.raises(PackRefused, match="frozen backbone differs"):
        host.join(MemberSpec("b", experiment(seed=7)))
    assert host.left == ["b"]


def test_a_diverging_member_fails_alone(task, host):
    """Its last report carries the failure (its trial ends as a diverged one does alone); the
    other member is untouched."""
    bad = experiment(3, lr=1e30, max_grad_norm=None, warmup_ratio=0.0, max_steps=6)
    good = experiment(2, max_steps=6)
    host.join(MemberSpec("bad", bad))
    host.join(MemberSpec("good", good))
    got: dict[str, list[dict]] = {}
    worker = threading.Thread(target=lambda: got.__setitem__("bad", relay(host, "bad")))
    worker.start()
    got["good"] = relay(host, "good")
    worker.join(60)
    assert FAILURE_KEY in got["bad"][-1]
    assert FAILURE_KEY in alone(bad, task)[-1]
    assert_same(alone(good, task), got["good"])


def test_a_trial_that_resumed_at_its_last_step_has_nothing_to_report(task, host, tmp_path):
    cfg = experiment(3, max_steps=2)
    folders = []

    def keep(metrics, folder):
        import shutil  # why: only this test copies a checkpoint

        folders.append(shutil.copytree(folder, tmp_path / "last"))

    train(cfg, task, keep)
    host.join(MemberSpec("done", cfg, resume_from=folders[-1]))
    report = host.next_report("done", timeout=30)
    assert report.metrics is None and report.final
    assert host.left == ["done"] and not host.pack.members


def test_a_restarted_trial_replaces_its_earlier_run(host):
    host.join(MemberSpec("a", experiment(2)))
    host.next_report("a", timeout=60)
    host.join(MemberSpec("a", experiment(2)))  # Ray restarted the trial
    assert len(host.pack.members) == 1
    # the registry seated the restarted trial already: replacing its earlier run must not
    # tell it the slot is free (the next trial would then find the pack full, and train alone)
    assert host.left == []
    assert host.next_report("a", timeout=60).metrics["step"] == 2


def test_closing_the_host_ends_waiting_trials(task):
    host = PackHost(task, capacity=1, poll_s=0.05).start()
    host.join(MemberSpec("a", experiment(max_steps=40, eval_every=40)))
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            host.next_report("a")
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            ended.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    host.close()
    waiter.join(10)
    assert [type(e) for e in ended] == [MemberGone]


# ----------------------------------------------------------------------------- the registry


def test_the_book_fills_the_fullest_pack_of_a_place_first():
    here, there = Place("g", "node-1"), Place("g", "node-2")
    book = PackBook(capacity=2)
    assert book.place("t1", here, "actor-1") == (None, [])
    book.open("p1", here)
    book.sit("t1", "p1")
    book.open("p2", here)
    assert book.place("t2", here, "actor-2") == ("p1", [])  # the fuller one
    assert book.place("t3", here, "actor-3") == ("p2", [])
    assert book.place("t4", there, "actor-4") == (None, [])  # another node
    assert book.place("t5", here, "actor-5")[0] == "p2"
    assert book.place("t6", here, "actor-6")[0] is None  # every slot taken
    assert book.count(here) == 2 and book.count(there) == 0


def test_the_book_seats_a_trial_where_it_adds_the_least_padding():
    here = Place("g", "node-1")
    m20, m40, m80 = PromptShape(20), PromptShape(40), PromptShape(80)  # DePT's m
    book = PackBook(capacity=4)
    book.open("short", here)
    book.sit("a", "short", m20)
    book.open("long", here)
    book.sit("b", "long", m80)
    book.sit("c", "long", m80)
    # the fuller pack would pad it by 40; the emptier one adds nothing
    assert book.place("t1", here, "actor-1", m20) == ("short", [])
    # no pack of its length: where the padding grows least (20 against 40 + 40)
    assert book.place("t2", here, "actor-2", PromptShape(60)) == ("long", [])
    # exact: only a slot that adds no padding, else none (the registry opens a pack)
    assert book.place("t3", here, "actor-3", m40, exact=True) == (None, [])
    assert book.place("t4", here, "actor-4", m80, exact=True) == ("long", [])


def test_padding_per_row_pads_each_prompt_and_prefix_to_the_longest():
    assert padding_per_row([]) == 0 and padding_per_row([PromptShape(40)]) == 0
    assert padding_per_row([PromptShape(20), PromptShape(80), PromptShape(40)]) == 60 + 40
    assert padding_per_row([PromptShape(0, 8), PromptShape(10, 2)]) == 10 + 6


def test_a_trial_s_prompt_shape_is_its_resolved_prompt_and_prefix():
    dims = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)
    assert PromptShape.of(PromptTuningConfig(prompt_length=7), dims) == PromptShape(7, 0)
    dept = DePTConfig(budget_params=32 * 100, prompt_length=60)  # r derived from the budget
    assert PromptShape.of(dept, dims) == PromptShape(60, 0)
    kv = DeepPromptConfig(style="kv", prompt_length=3)
    assert PromptShape.of(kv, dims) == PromptShape(0, 3)


def test_the_book_frees_stale_seats_and_dead_packs():
    here = Place("g", "node-1")
    book = PackBook(capacity=2)
    book.open("p1", here)
    assert book.place("t1", here, "actor-1") == ("p1", [])
    # a restarted trial: its earlier seat is freed first
    assert book.place("t1", here, "actor-9") == ("p1", [("p1", "t1")])
    # a reused actor runs its next trial: the trial it ran before is gone
    assert book.place("t2", here, "actor-9") == ("p1", [("p1", "t1")])
    assert book.release("t2", "p-other") is None  # only from the pack it sits in
    assert book.release("t2") == "p1" and book.release("t2") is None
    book.place("t3", here, "actor-3")
    book.forget("p1")
    assert book.seat_of == {} and book.count(here) == 0


def test_trials_share_a_backbone_group_only_with_the_same_frozen_weights():
    base = experiment()
    assert backbone_group(base) == backbone_group(experiment(9, lr=0.5, max_steps=8))
    # a test model's weights come from its seed; another precision is another backbone
    assert backbone_group(base) != backbone_group(experiment(seed=7))
    assert backbone_group(base) != backbone_group(experiment(precision="bf16"))
    # one backbone runs one dropout for all its members
    assert backbone_group(base) != backbone_group(experiment(backbone_dropout="config"))
    minilm = base.model_copy(update={"model": ModelConfig(name="minilm", max_length=S)})
    other_seed = minilm.model_copy(
        update={"train": TrainConfig(seed=3, precision="fp32", backbone_dropout=0)}
    )
    assert backbone_group(minilm) == backbone_group(other_seed)
