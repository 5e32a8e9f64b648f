"""The bad-input suite itself: big enough, and its real processes watched where Ray would start."""

from __future__ import annotations

import pytest

THEMES = {
    "test_data.py",
    "test_files.py",
    "test_keys.py",
    "test_model.py",
    "test_resources.py",
    "test_stores.py",
}
CLI_TEST = "test_bad_input_is_one_line_exit_2_and_touches_nothing"


def test_the_suite_is_big_enough(request):
    """The cases of every theme together: 30 or more, each id once."""
    items = [i for i in request.session.items if getattr(i, "originalname", None) == CLI_TEST]
    if {i.path.name for i in items} != THEMES:
        pytest.skip("counts the cases of every theme: run the whole bad_input folder")
    case_ids = [i.callspec.id for i in items]
    assert len(case_ids) >= 30 and len(set(case_ids)) == len(case_ids)


def test_ray_tmpdir_is_where_ray_would_start(tmp_path, monkeypatch):
    """The in-process cases watch RAY_TMPDIR: make sure Ray puts its session there."""
    from ray._common.utils import get_default_ray_temp_dir

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    assert get_default_ray_temp_dir() == str(tmp_path / "raytmp" / "ray")
