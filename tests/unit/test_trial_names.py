"""Trial names in Tune's table and folders carry each trial's own method."""

from __future__ import annotations

from types import SimpleNamespace

from raypeft.search.tuner import TrialNamer


def test_trial_name_is_the_chosen_method():
    namer = TrialNamer("pt")  # the file's method section
    chosen = SimpleNamespace(trial_id="3f2a1_00004", config={"method.name": "idpg"})
    fixed = SimpleNamespace(trial_id="3f2a1_00005", config={"method.lr": 0.3})
    assert namer(chosen) == "idpg_3f2a1_00004"  # a comparison: the space chose IDPG
    assert namer(fixed) == "pt_3f2a1_00005"
