"""A search killed while Ray copied its callback state into the experiment's folder leaves the
file empty or cut short; resuming sets it aside instead of failing in ``Tuner.restore``."""

from __future__ import annotations

from ray.tune.callback import CallbackList

from raypeft.search.tuner import CALLBACK_STATES, set_aside_damaged_callback_states


class Counting:
    """A callback with state, saved as Tune saves its callbacks' state."""

    def __init__(self, seen: int = 0):
        self.seen = seen

    def get_state(self) -> dict:
        return {"seen": self.seen}

    def set_state(self, state: dict) -> None:
        self.seen = state["seen"]


def test_only_unreadable_callback_states_are_set_aside(tmp_path):
    CallbackList([Counting(3)]).save_to_dir(str(tmp_path), session_str="2026-11-26_14-00-00")
    intact = tmp_path / "callback-states-2026-11-26_14-00-00.pkl"
    assert intact.is_file()
    empty = tmp_path / "callback-states-2026-11-26_15-00-00.pkl"
    empty.write_bytes(b"")  # the copy was killed before a byte arrived
    cut = tmp_path / "callback-states-2026-11-26_16-00-00.pkl"
    cut.write_bytes(intact.read_bytes()[:-5])

    assert set_aside_damaged_callback_states(str(tmp_path)) == [empty, cut]
    assert sorted(p.name for p in tmp_path.glob(CALLBACK_STATES)) == [intact.name]
    assert (tmp_path / f"{cut.name}.damaged").is_file()
    restored = Counting()
    CallbackList([restored]).restore_from_dir(str(tmp_path))  # what Tuner.restore does
    assert restored.seen == 3


def test_remote_and_missing_folders_are_left_alone(tmp_path):
    assert set_aside_damaged_callback_states("s3://bucket/experiment") == []
    assert set_aside_damaged_callback_states(str(tmp_path / "none")) == []


class Planted:
    """A pickle that, were it loaded, would create a file."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_checking_a_state_file_never_runs_it(tmp_path):
    import pickle  # noqa: PLC0415 - only to write the planted file; raypeft never imports it

    planted = tmp_path / "callback-states-2026-11-26_17-00-00.pkl"
    planted.write_bytes(pickle.dumps(Planted(tmp_path / "ran")))
    foreign = tmp_path / "callback-states-2026-11-26_18-00-00.pkl"
    foreign.write_text("hello")

    assert set_aside_damaged_callback_states(str(tmp_path)) == [foreign]
    assert not (tmp_path / "ran").exists()
