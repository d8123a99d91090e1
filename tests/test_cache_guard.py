"""Cached kernels compiled from other sources are dropped before the first kernel is loaded,
and importing the package touches no file."""

from __future__ import annotations

import kvnumba._kernels as kernels


def test_stale_cache_files_are_dropped_once(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "append.run_append-300.py311.nbi").write_bytes(b"index")
    (cache / "append.run_append-300.py311.1.nbc").write_bytes(b"code")
    (cache / kernels._MARKER).write_text("digest of older sources")
    (cache / "keep.txt").write_text("not numba's")
    monkeypatch.setattr(kernels, "_cache_dirs", lambda: [cache])

    assert kernels.drop_stale_cache() == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted([kernels._MARKER, "keep.txt"])
    (cache / "entry.k_append-40.py311.nbi").write_bytes(b"index compiled from these sources")
    assert kernels.drop_stale_cache() == 0  # the marker now matches: nothing to drop
    assert (cache / "entry.k_append-40.py311.nbi").exists()


def test_with_numba_cache_dir_set_only_that_cache_counts(tmp_path, monkeypatch):
    # numba looks only under NUMBA_CACHE_DIR when it is set: kernels compiled next to the
    # sources must not make a cold cache look warm (no compile notice would be printed).
    from numba.core import config

    from kvnumba import kernels as entry_kernels

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    dirs = kernels._cache_dirs()
    assert len(dirs) == 1 and tmp_path in dirs[0].parents
    assert not entry_kernels.is_cached("k_append")
    monkeypatch.setattr(config, "CACHE_DIR", "")
    assert kernels._cache_dirs() == [kernels._HERE / "__pycache__"]


def test_importing_kvnumba_touches_no_file(tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "numba-cache"
    code = (
        "import kvnumba, kvnumba.manager, kvnumba.pages.pool, kvnumba.kernels, "
        "kvnumba.state, kvnumba.sim, kvnumba.bench"
    )
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
    # numba makes the (empty) cache folders when it decorates; no kernel is compiled or loaded.
    assert not [path for path in cache.rglob("*") if path.is_file()]
