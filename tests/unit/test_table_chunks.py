"""A table recorded in chunks: the rest of its grid, run by raypeft's own search, is exactly
what no chunk holds; the chunks join into one table."""

from __future__ import annotations

import dataclasses

import yaml

from benchmarks.search.table_chunks import main
from raypeft.config.loading import validate_experiment
from raypeft.config.space import SEED_KEY
from raypeft.search.simulate import CurveTable
from raypeft.search.study import open_storage, prepare_study, remaining_grid_points
from tests.unit.test_simulate import table  # noqa: F401 - the 36-curve synthetic table


def chunk(whole: CurveTable, keep) -> CurveTable:
    return dataclasses.replace(whole, curves=[c for c in whole.curves if keep(c)])


def test_the_rest_runs_exactly_the_missing_points_and_the_chunks_join(table, tmp_path):  # noqa: F811
    first = chunk(table, lambda c: (c.seed + c.params["method.prompt_length"]) % 3 == 0)
    first.save(tmp_path / "a.json")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rest_file = tmp_path / "rest.yaml"

    assert main(["rest", str(tmp_path / "a.json"), "--tracking-uri", uri,
                 "--out", str(rest_file)]) == 0  # fmt: skip
    rest = validate_experiment(yaml.safe_load(rest_file.read_text()), str(rest_file))
    finished = prepare_study(open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"),
                             rest.name, ["max"])  # fmt: skip
    to_run = remaining_grid_points(rest.grid_points(), finished)  # what the search enqueues
    recorded = [{**c.params, SEED_KEY: c.seed} for c in first.curves]
    expected = [{**c.params, SEED_KEY: c.seed} for c in table.curves if c not in first.curves]
    assert sorted(map(str, to_run)) == sorted(map(str, expected))
    assert rest.search.num_samples == len(expected) == 36 - len(recorded)
    assert rest.search.sampler == "random" and rest.space[SEED_KEY].listed() == [0, 1, 2]
    # a second `rest` (the session ended again) adds nothing twice
    assert main(["rest", str(tmp_path / "a.json"), "--tracking-uri", uri,
                 "--out", str(rest_file)]) == 0  # fmt: skip
    assert len(prepare_study(open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"), rest.name,
                             ["max"])) == len(recorded)  # fmt: skip

    second = chunk(table, lambda c: c not in first.curves)
    second.save(tmp_path / "b.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "all.json")]) == 0  # fmt: skip
    merged = CurveTable.load(tmp_path / "all.json")
    assert sorted(map(str, merged.curves)) == sorted(map(str, table.curves))
    assert [c["trials"] for c in merged.source["chunks"]] == [len(recorded), len(expected)]


def test_a_point_recorded_twice_or_another_experiment_is_refused(table, tmp_path, capsys):  # noqa: F811
    table.save(tmp_path / "a.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "a.json"),
                 "--out", str(tmp_path / "all.json")]) == 2  # fmt: skip
    assert "at seed 0 is in an earlier table too" in capsys.readouterr().err
    other = dataclasses.replace(table, experiment={**table.experiment,
                                                   "model": {"name": "tiny-gpt2"}})  # fmt: skip
    other.save(tmp_path / "b.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "all.json")]) == 2  # fmt: skip
    assert "b.json: not the recording" in capsys.readouterr().err
    assert not (tmp_path / "all.json").exists()


def test_keep_first_keeps_the_earlier_draw_of_a_repeated_pair(table, tmp_path, capsys):  # noqa: F811
    """A resumed chunk that drew a recorded pair again: its draw is left out, and counted."""
    head, tail = table.curves[:3], table.curves[2:]
    repeat = dataclasses.replace(tail[0], values={k: [v + 1.0 for v in vs]
                                                  for k, vs in tail[0].values.items()})  # fmt: skip
    dataclasses.replace(table, curves=head).save(tmp_path / "a.json")
    dataclasses.replace(table, curves=[repeat, *tail[1:]]).save(tmp_path / "b.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--keep-first",
                 "--out", str(tmp_path / "all.json")]) == 0  # fmt: skip
    assert "(1 repeated pairs left out)" in capsys.readouterr().out
    merged = CurveTable.load(tmp_path / "all.json")
    assert sorted(map(str, merged.curves)) == sorted(map(str, table.curves))
    assert [(c["trials"], c["left_out_as_repeats"]) for c in merged.source["chunks"]] == [
        (3, 0), (len(tail) - 1, 1)]  # fmt: skip


def test_chunks_over_other_seeds_join_into_one_recording_over_all_of_them(table, tmp_path):  # noqa: F811
    """MR's table: seeds 0-2 first, then 3 and 4 in a search of their own; the joined table's
    experiment names every seed it holds, and a sample per curve."""

    def over(seeds: list[int]) -> CurveTable:
        search = {**table.experiment["search"], "seeds": seeds, "num_samples": 12 * len(seeds)}
        space = {**table.experiment["space"], SEED_KEY: {"grid": seeds}}  # as the schema writes
        return dataclasses.replace(
            chunk(table, lambda c: c.seed in seeds),
            experiment={**table.experiment, "search": search, "space": space},
        )

    over([0, 1]).save(tmp_path / "a.json")
    over([2]).save(tmp_path / "b.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "all.json")]) == 0  # fmt: skip
    merged = CurveTable.load(tmp_path / "all.json")
    assert merged.config.search.seeds == [0, 1, 2] == merged.seeds()
    assert merged.config.space[SEED_KEY].listed() == [0, 1, 2]
    assert merged.config.search.num_samples == len(merged.curves) == 36


def test_a_chunk_recorded_before_a_section_was_added_is_the_same_recording(table, tmp_path):  # noqa: F811
    """MR's first chunks were recorded before the schema had `replay`: its defaults are no
    difference."""
    older = {k: v for k, v in table.experiment.items() if k != "replay"}
    assert older != table.experiment
    dataclasses.replace(chunk(table, lambda c: c.seed == 0), experiment=older).save(
        tmp_path / "a.json"
    )
    chunk(table, lambda c: c.seed != 0).save(tmp_path / "b.json")
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "all.json")]) == 0  # fmt: skip
