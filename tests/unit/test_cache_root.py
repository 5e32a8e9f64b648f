"""raypeft's one cache folder: ``$RAYPEFT_CACHE_DIR``, else XDG's, else ``~/.cache/raypeft``;
every place that caches lives under it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from raypeft.config.cache_root import cache_root


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No cache variable set (the tests' conftest sets one), a home of our own."""
    for name in ("RAYPEFT_CACHE_DIR", "RAYPEFT_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_the_default_is_xdgs_cache_folder_else_the_homes(clean, tmp_path):
    assert cache_root() == tmp_path / "home" / ".cache" / "raypeft"
    clean.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "raypeft"
    clean.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the XDG spec: ignored
    assert cache_root() == tmp_path / "home" / ".cache" / "raypeft"


def test_raypeft_cache_dir_moves_every_cache(clean, tmp_path):
    from raypeft.methods.ipt.pretrain import cache_dir
    from raypeft.search.gpu_probe import cache_file

    clean.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    clean.setenv("RAYPEFT_CACHE_DIR", "~/mine")
    assert cache_root() == tmp_path / "home" / "mine"
    assert cache_dir() == cache_root() / "ipt"
    assert cache_file() == cache_root() / "gpu_probe.json"


def test_the_old_variable_is_read_with_a_warning_until_the_new_one_is_set(clean):
    clean.setenv("RAYPEFT_CACHE", "/old")
    with pytest.warns(FutureWarning, match="RAYPEFT_CACHE is deprecated: set RAYPEFT_CACHE_DIR"):
        assert cache_root() == Path("/old")
    clean.setenv("RAYPEFT_CACHE_DIR", "/new")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_root() == Path("/new")
