"""The benchmark harness: workload generator, replay, and the ``kvnumba bench`` command."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from kvnumba.bench import runner, workloads
from kvnumba.bench.cli import OPT_IN
from kvnumba.bench.workloads import OP_ADMIT, OP_DECODE, OP_FORK, OP_PREFILL, OP_RELEASE
from kvnumba.reference import ReferenceBlockManager

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


# Digests of the reference operation trace of each standard workload at its full length
# (docs/workloads.md: W-decode and W-fork 2000 steps, W-churn 5000, W-micro 50 repetitions of
# k = 1, 16, 256, 4096 one after the other), recorded from the reference trace generator that
# defines the workloads. Each value: (lines of the trace, sha256 of the trace in step order with
# each step's lines sorted; see _step_digest). The workloads batch a step's operations by kind,
# so only the order within a step may differ from the reference.
REFERENCE_TRACES = {
    "decode": (519870, "48de471a0c669b11d0fdbba183396c9e6d4d836fc025f6f6259463decac81132"),
    "fork": (317444, "548f103af7dab5b3b8f1c973b431de7d53443d02c4162f82e688aaa4d99a31b1"),
    "fork-nofork": (318557, "1de2be8790bf5638ac7642a9f2b1dec8a34bcbbd7e5f4bc57436b613b1303997"),
    "churn": (148241, "33204b11fa16bfa71192de52f0de8e428da20be5fbb5b97f55c5f07b15dfb85f"),
    "micro": (800, "1f2c31606a99a33981cef85cd3af2e4b8481b2d5c566a5447d9a7618852ddfd2"),
}


def _step_digest(lines: list[str]) -> tuple[int, str]:
    """(number of lines, sha256 of the steps in order, each step's lines sorted)."""
    steps: list[list[str]] = [[]]
    for line in lines:
        if line == "S":
            steps.append([])
        else:
            steps[-1].append(line)
    digest = hashlib.sha256()
    for step in steps:
        digest.update(("\n".join(sorted(step)) + "\nS\n").encode())
    return len(lines), digest.hexdigest()


def _micro_trace() -> list[str]:
    """The four W-micro workloads as one trace, sequence ids continuing from one to the next."""
    lines, offset = [], 0
    for k in workloads.MICRO_KS:
        wl = workloads.micro(k)
        for line in wl.to_trace():
            op, *args = line.split()
            if args:
                args[0] = str(int(args[0]) + offset)
            lines.append(" ".join([op, *args]))
        offset += wl.num_seqs
    return lines


@pytest.mark.parametrize("name", list(REFERENCE_TRACES))
def test_workloads_replay_the_reference_traces(name):
    standard = workloads.standard()
    lines = _micro_trace() if name == "micro" else standard[name]().to_trace()
    assert _step_digest(lines) == REFERENCE_TRACES[name]


def test_step_digest_sees_a_changed_count_and_a_moved_operation():
    trace = ["N 0", "A 0 5", "S", "A 0 1", "N 1", "A 1 3", "S", "A 0 1", "R 0"]
    same = ["A 0 5", "N 0", "S", "N 1", "A 1 3", "A 0 1", "S", "R 0", "A 0 1"]
    assert _step_digest(trace) == _step_digest(same)  # order within a step does not count
    changed = trace[:5] + ["A 1 4"] + trace[6:]
    moved = trace[:3] + ["N 1", "A 1 3", "S", "A 0 1"] + trace[7:]
    for other in (changed, moved):
        assert _step_digest(other) != _step_digest(trace)


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
    # Every standard workload but those run only when named (decode-window).
    assert names == [n for n in workloads.standard(quick=True) if n not in OPT_IN]
    assert "decode-window" in workloads.standard(quick=True) and "decode-window" in OPT_IN
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


def test_decode_hybrid_runs_every_operation_in_each_group_and_both_implementations_agree():
    """The hybrid decode replays W-decode's operations on one sequence per KV cache group:
    the full-attention group allocates what W-decode does and the sliding-window group what
    decode-window does, from one pool; kvnumba and the reference agree on every counter and
    on the final tables."""
    pytest.importorskip("kvnumba.manager")
    import kvnumba

    plain = workloads.decode(20, 16, num_blocks=4096)
    hybrid = workloads.decode(20, 16, num_blocks=4096, kv_cache_groups=((0, 0), (256, 0)))
    assert hybrid.name == "decode-hybrid" and hybrid.num_blocks == 8192
    assert np.array_equal(plain.ids, hybrid.ids) and np.array_equal(plain.vals, hybrid.vals)
    fast = runner.replay(hybrid, kvnumba.BlockManager, check=True)
    ref = runner.replay(hybrid, ReferenceBlockManager, check=True)
    assert fast[3] == ref[3]
    full = runner.replay(plain, kvnumba.BlockManager)[3]
    assert fast[3].allocations == 2 * full.allocations
    assert "decode-hybrid" in workloads.standard(quick=True) and "decode-hybrid" in OPT_IN


def test_decode_window_releases_blocks_and_both_implementations_agree():
    """The windowed decode replays the same operations as W-decode: as many blocks are
    allocated, the tables differ (released positions), and kvnumba and the reference agree
    on every counter and on the final tables."""
    pytest.importorskip("kvnumba.manager")
    import kvnumba

    plain = workloads.decode(20, 16, num_blocks=4096)
    windowed = workloads.decode(20, 16, num_blocks=4096, sliding_window=256)
    assert windowed.name == "decode-window" and windowed.sliding_window == 256
    assert np.array_equal(plain.ids, windowed.ids) and np.array_equal(plain.vals, windowed.vals)
    fast = runner.replay(windowed, kvnumba.BlockManager, check=True)
    ref = runner.replay(windowed, ReferenceBlockManager, check=True)
    assert fast[3] == ref[3]
    full = runner.replay(plain, kvnumba.BlockManager)[3]
    assert fast[3].allocations == full.allocations
    assert fast[3].final_blocks != full.final_blocks


def test_bench_runs_a_user_policy_named_by_module(monkeypatch, capsys):
    """A test-file priority policy through ``kvnumba bench``: kernels and reference agree on
    every counter of a churning workload."""
    from pathlib import Path

    from kvnumba.bench.cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    argv = ["--quick", "--workload", "churn", "--repeat", "1", "--json"]
    assert main([*argv, "--eviction", "user_policies:AGING_LEAVES"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["eviction"] == "user_policies:AGING_LEAVES"
    (work,) = doc["workloads"]
    assert work["agree"] and work["kvnumba"]["counters"]["evictions"] > 0
    with pytest.raises(SystemExit):
        main([*argv, "--eviction", "fifo"])
    assert "not one of" in capsys.readouterr().err
