"""The benchmark harness: workload generator, replay, and the ``kvnumba bench`` command."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kvnumba.bench import runner, workloads
from kvnumba.bench.workloads import OP_ADMIT, OP_DECODE, OP_FORK, OP_PREFILL, OP_RELEASE
from kvnumba.reference import ReferenceBlockManager

GEN_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "gen_trace.py"
FIELDS = ("op_kind", "op_ptr", "step_ptr", "ids", "vals", "prompt_len", "out_len")


def _ops_of(wl, kind):
    return [ids for k, ids, _, _ in wl.ops() if k == kind]


@pytest.mark.parametrize("name", list(workloads.standard(quick=True)))
def test_generator_is_deterministic(name):
    make = workloads.standard(quick=True)[name]
    a, b = make(), make()
    for f in FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def test_decode_matches_workloads_md():
    wl = workloads.decode(2000)
    assert (wl.num_blocks, wl.block_size, wl.num_steps) == (65536, 16, 2000)
    assert wl.prompt_len.min() >= 128 and wl.prompt_len.max() <= 2048
    assert wl.out_len.min() >= 32 and wl.out_len.max() <= 512
    # 256 sequences decode at every step, each exactly out_len times, then are released.
    assert [len(ids) for ids in _ops_of(wl, OP_DECODE)] == [256] * 2000
    decodes = np.bincount(np.concatenate(_ops_of(wl, OP_DECODE)), minlength=wl.num_seqs)
    released = np.concatenate(_ops_of(wl, OP_RELEASE))
    assert np.array_equal(decodes[released], wl.out_len[released])
    assert np.all(decodes <= wl.out_len)
    assert wl.max_seqs == 256


def test_fork_matches_workloads_md():
    wl = workloads.fork(300)
    assert wl.fork_n == 7 and (wl.num_blocks, wl.block_size) == (65536, 16)
    roots = np.concatenate(_ops_of(wl, OP_FORK))
    assert len(roots) * 8 == wl.num_seqs  # every group: one prompt sequence plus 7 forks
    assert len(_ops_of(wl, OP_DECODE)[0]) == 32 * 8
    assert np.all(np.diff(wl.prompt_len.reshape(-1, 8), axis=1) == 0)  # samples share the prompt
    assert wl.prompt_len.min() >= 128 and wl.prompt_len.max() <= 2048
    assert wl.out_len.min() >= 32 and wl.out_len.max() <= 512
    base = workloads.fork(300, share=False)
    assert base.fork_n == 0 and not _ops_of(base, OP_FORK)
    assert np.array_equal(base.prompt_len, wl.prompt_len)  # the same draws
    assert np.array_equal(base.out_len, wl.out_len)


def test_churn_and_micro_match_workloads_md():
    wl = workloads.churn(800)
    assert (wl.num_blocks, wl.num_steps, wl.atomic) == (4096, 800, False)
    assert wl.prompt_len.min() >= 256 and wl.prompt_len.max() <= 4096
    assert wl.out_len.min() >= 16 and wl.out_len.max() <= 256
    assert not _ops_of(wl, OP_PREFILL) and _ops_of(wl, OP_ADMIT)
    for k in workloads.MICRO_KS:
        micro = workloads.micro(k)
        assert micro.num_steps == 50 and micro.num_blocks == 65536
        prefills = [vals for kind, _, vals, _ in micro.ops() if kind == OP_PREFILL]
        assert [v.tolist() for v in prefills] == [[k * 16]] * 50


def _trace_steps(lines):
    steps = [Counter()]
    for line in lines:
        if line == "S":
            steps.append(Counter())
        else:
            steps[-1][line] += 1
    return steps


@pytest.mark.skipif(not GEN_TRACE.exists(), reason="shared/bench/gen_trace.py not beside the repo")
@pytest.mark.parametrize("name", ["decode", "fork", "fork_nofork", "churn"])
def test_same_operations_as_gen_trace(name):
    spec = importlib.util.spec_from_file_location("gen_trace", GEN_TRACE)
    gen_trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_trace)
    steps = 400
    ours = {
        "decode": lambda: workloads.decode(steps),
        "fork": lambda: workloads.fork(steps),
        "fork_nofork": lambda: workloads.fork(steps, share=False),
        "churn": lambda: workloads.churn(steps),
    }[name]()
    theirs: list[str] = []
    {
        "decode": lambda: gen_trace.decode(theirs, S=steps),
        "fork": lambda: gen_trace.fork(theirs, S=steps),
        "fork_nofork": lambda: gen_trace.fork(theirs, S=steps, share=False),
        "churn": lambda: gen_trace.churn(theirs, S=steps),
    }[name]()
    # Per step, the same operations (batching only regroups them within the step).
    assert _trace_steps(ours.to_trace()) == _trace_steps(theirs)


def test_kvnumba_and_reference_agree_on_a_short_run():
    pytest.importorskip("kvnumba.manager")
    from kvnumba import BlockManager

    for wl in (
        workloads.decode(30),
        workloads.fork(60),
        workloads.churn(800),
        workloads.micro(256, reps=3),
    ):
        fast = runner.run(wl, BlockManager, repeat=1)
        ref = runner.run(wl, ReferenceBlockManager, repeat=1)
        assert fast.counters == ref.counters, wl.name
    # The short runs exercise copy-on-write, eviction and failed appends.
    assert runner.replay(workloads.fork(60), BlockManager)[3].cow_copies > 0
    churned = runner.replay(workloads.churn(800), BlockManager)[3]
    assert churned.evictions > 0 and churned.failures > 0


def test_bench_quick_json_exits_zero():
    pytest.importorskip("kvnumba.manager")
    proc = subprocess.run(
        [sys.executable, "-m", "kvnumba", "bench", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["agree"] and doc["quick"]
    names = [row["workload"] for row in doc["workloads"]]
    assert names == list(workloads.standard(quick=True))
    for row in doc["workloads"]:
        assert row["kvnumba"]["median_ns"] > 0 and row["reference"]["median_ns"] > 0
    assert {b["budget"] for b in doc["budgets"]} >= {
        "W-decode time per step",
        "1-request admit (8 hits)",
        "1-request append",
    }
    engine = doc["engine"]
    assert engine["agree"] and engine["kvnumba"]["calls"] == engine["reference"]["calls"]
    # The cached prompt's 8 full blocks are hits; one token goes into the partial ninth block.
    assert engine["kvnumba"]["outcome"]["cached_tokens"] == 128
    assert engine["kvnumba"]["outcome"]["append"] == [9, 9, -1, -1]


def test_bench_engine_alone_runs_no_workload(capsys):
    from kvnumba.bench.cli import main

    assert main(["--workload", "engine", "--repeat", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workloads"] == [] and doc["engine"]["agree"]
    assert [b["budget"] for b in doc["budgets"]] == ["1-request admit (8 hits)", "1-request append"]


def test_bench_engine_disagreement_fails_the_command(monkeypatch, capsys):
    from kvnumba.bench import cli

    class Forgetful(ReferenceBlockManager):
        def admit_one(self, *args, **kwargs):
            seq, _ = super().admit_one(*args, **kwargs)
            return seq, 0  # claims to have reused nothing

    monkeypatch.setattr(cli, "_load_impl", lambda name: Forgetful)
    assert cli.main(["--workload", "engine", "--repeat", "1"]) == cli.EXIT_DISAGREE
    assert "agree NO" in capsys.readouterr().out


def test_bench_rejects_unknown_workload(capsys):
    from kvnumba.bench.cli import main

    assert main(["--workload", "nope"]) == 2
    assert "unknown workload" in capsys.readouterr().err


def test_bench_exits_nonzero_when_the_implementations_disagree(monkeypatch, capsys):
    from kvnumba.bench import cli

    class Miscounting(ReferenceBlockManager):
        def stats(self):
            st = super().stats()
            return type(st)(**{**vars(st), "cow_copies": st.cow_copies + 1})

    monkeypatch.setattr(cli, "_load_impl", lambda name: Miscounting)
    assert cli.main(["--quick", "--workload", "micro-16"]) == cli.EXIT_DISAGREE
    assert "DISAGREE" in capsys.readouterr().out
