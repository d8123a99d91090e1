"""The engine kernels compile ahead of time or in the background, and the manager waits for them.

``kvnumba.integrations.vllm.precompile`` imports neither numba nor vLLM, so these run without vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from kvnumba import kernels
from kvnumba.integrations.vllm import precompile
from kvnumba.integrations.vllm.precompile import PRECOMPILE_ENV, compile_lock, wanted


@pytest.mark.parametrize(
    ("setting", "argv", "expected"),
    [
        ("1", ["vllm", "serve", "m"], True),
        ("0", ["vllm", "serve", "m", "--scheduler-cls", "kvnumba.integrations.vllm.X"], False),
        (None, ["vllm", "serve", "m", "--scheduler-cls", "kvnumba.integrations.vllm.X"], True),
        (None, ["vllm", "serve", "m"], False),
        ("", ["python", "bench.py"], False),
        (None, ["python", "e2e.py", "--model-dir", "/cache/kvnumba-vllm/model"], False),
    ],
)
def test_the_background_compile_runs_when_asked_or_kvnumba_is_named(setting, argv, expected):
    environ = {} if setting is None else {PRECOMPILE_ENV: setting}
    assert wanted(argv, environ) is expected


def test_engine_kernels_are_entry_kernels_in_disjoint_groups():
    assert set(kernels.ENGINE) <= set(kernels.SIGNATURES)
    assert not set(kernels.ENGINE) & kernels.PAGED
    assert len(set(kernels.ENGINE)) == len(kernels.ENGINE)
    assert precompile.NUM_GROUPS == len(kernels.ENGINE_GROUPS)


def test_waiting_blocks_while_a_compile_holds_the_lock():
    returned = threading.Event()
    with compile_lock([1]):
        waiter = threading.Thread(target=lambda: (precompile.wait_for_compile(), returned.set()))
        waiter.start()
        time.sleep(0.3)
        assert not returned.is_set()
    waiter.join(timeout=10)
    assert returned.is_set()


def test_the_lock_is_one_per_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "a"))
    first = precompile.lock_path(0)
    assert precompile.lock_path(1) != first
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "b"))
    assert precompile.lock_path(0) != first


def test_background_compile_fills_the_cache_and_the_manager_waits_for_it(monkeypatch):
    # The suite's NUMBA_CACHE_DIR (conftest) is the child's too.
    monkeypatch.setattr(precompile, "_children", [])
    monkeypatch.setattr(precompile, "_ready", False)
    children = list(precompile.start_background_compile())
    assert len(children) == len(kernels.ENGINE_GROUPS)
    assert precompile.start_background_compile() == children  # once per process
    precompile.load_engine_kernels()
    assert [child.poll() for child in children] == [0] * len(children)
    assert kernels.uncached(kernels.ENGINE) == []
    assert precompile._ready


def test_compile_command_engine_only_and_its_options():
    env = {**os.environ}
    run = [sys.executable, "-m", "kvnumba", "compile"]
    out = subprocess.run([*run, "--engine"], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[:-1]] == list(kernels.ENGINE)
    assert lines[-1].startswith("engine kernels: ")
    quiet = subprocess.run([*run, "--engine", "--quiet"], env=env, capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stdout == ""
    bad = subprocess.run([*run, "--everything"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--everything" in bad.stderr
    group = subprocess.run(
        [*run, "--engine", "--group", "1"], env=env, capture_output=True, text=True
    )
    assert [line.split()[0] for line in group.stdout.splitlines()[:-1]] == list(
        kernels.ENGINE_GROUPS[1]
    )
    for wrong in (["--group", "0"], ["--engine", "--group", "7"]):
        refused = subprocess.run([*run, *wrong], env=env, capture_output=True, text=True)
        assert refused.returncode == 2 and "--group" in refused.stderr
    # With --policies, the policy versions of what an engine calls follow the LRU ones.
    policies = subprocess.run(
        [*run, "--engine", "--policies"], env=env, capture_output=True, text=True
    )
    names = [line.split()[0] for line in policies.stdout.splitlines()[:-1]]
    assert names == [*kernels.ENGINE, *kernels.ENGINE_GROUPED]


def test_a_cold_manager_compiles_one_group_itself_and_the_other_in_a_child(tmp_path):
    # A fresh numba cache needs a fresh process (numba reads NUMBA_CACHE_DIR at import).
    script = (
        "import json\n"
        "from kvnumba import kernels\n"
        "from kvnumba.integrations.vllm import precompile as c\n"
        "c.load_engine_kernels()\n"
        "print(json.dumps({'report': c.report, 'children': [ch.args for ch in c._children],\n"
        "    'codes': [ch.returncode for ch in c._children],\n"
        "    'uncached': kernels.uncached(kernels.ENGINE)}))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(PRECOMPILE_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["report"]["compiled"] == len(kernels.ENGINE)
    assert result["uncached"] == []
    assert result["codes"] == [0]
    assert result["children"][0][-3:] == ["--group", "1", "--quiet"]
    assert f"compiling {len(kernels.ENGINE)} kernels" in out.stderr
    assert "compiled in" in out.stderr


def test_a_plugin_that_cannot_start_its_children_leaves_vllm_starting(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(precompile, "_children", [])
    monkeypatch.setattr(precompile.subprocess, "Popen", refuse)
    monkeypatch.setenv(PRECOMPILE_ENV, "1")
    precompile.plugin()  # vLLM calls plugins unguarded: this must not raise
    assert precompile._children == []
    assert "no background compile" in caplog.text
