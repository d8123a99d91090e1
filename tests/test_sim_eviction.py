"""Eviction policies in the simulator: the option, the oracle's hints, unreachable blocks, the
policy table and the sweep plot."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import numpy as np
import pytest

from kvnumba.eviction import EVICTION_POLICIES, SIMULATOR_POLICIES
from kvnumba.sim import cli as sim_cli
from kvnumba.sim.hindsight import Hints, next_use
from kvnumba.sim.ideal import block_keys
from kvnumba.sim.report import format_policy_table, plot_sweep, policy_table
from kvnumba.sim.scheduler import (
    SimConfig,
    Simulator,
    default_manager_factory,
    policy_arguments,
    reference_manager_factory,
    simulate,
)
from kvnumba.sim.sweeps import SweepPoint
from kvnumba.sim.traces import Request, default_trace_path, load_trace
from kvnumba.sim.unreachable import Census, parent_keys

FACTORIES = {"kernels": default_manager_factory, "reference": reference_manager_factory}
TIMING = {"alloc_us_per_step_median", "alloc_us_per_step_mean", "replay_s", "wall_s"}
AZURE = str(default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"))


def mooncake_file(tmp_path, rows, name="hand.jsonl"):
    path = tmp_path / name
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, r, strict=True))) + "\n" for r in rows))
    return path


# Five requests a second apart, each done before the next arrives. Block size 512 makes one
# manager block per hash block. Full prompt blocks and their keys (A = [1], B = [1, 2],
# C = [1, 3], D = [4]):
#   r0 [1, 2]  1024 tokens  A B      next uses: A -> r1, B -> r3
#   r1 [1, 3]  1024 tokens  A C                 A -> r3, C -> never
#   r2 [4, 5]   600 tokens  D                   D -> r4
#   r3 [1, 2]  1024 tokens  A B                 A -> never, B -> never
#   r4 [4, 6]   700 tokens  D                   D -> never
HAND = [
    (0, 1024, 1, [1, 2]),
    (1000, 1024, 1, [1, 3]),
    (2000, 600, 1, [4, 5]),
    (3000, 1024, 1, [1, 2]),
    (4000, 700, 1, [4, 6]),
]
HAND_NEXT = [[1, 3], [3, -1], [4], [-1, -1], [-1]]


class HintRecorder:
    """An oracle manager stand-in: an LRU manager that records the hints it is given."""

    def __init__(self, mgr, eviction):
        self.mgr, self.eviction, self.calls = mgr, eviction, []

    def set_next_use(self, blocks, values):
        blocks, values = np.asarray(blocks), np.asarray(values)
        assert blocks.shape == values.shape and np.unique(blocks).size == blocks.size
        self.calls.append(dict(zip(blocks.tolist(), values.tolist(), strict=True)))

    def __getattr__(self, name):
        return getattr(self.mgr, name)


def hint_recording(built):
    def factory(num_blocks, block_size, *, eviction="lru", _hindsight=False, **kw):
        built.append((eviction, _hindsight))
        return HintRecorder(default_manager_factory(num_blocks, block_size, **kw), eviction)

    return factory


# --- the option ---------------------------------------------------------------------------


def test_cli_lists_every_policy_and_defaults_to_lru(capsys):
    (action,) = [a for a in sim_cli.build_parser()._actions if a.dest == "eviction"]
    assert action.default == "lru" and action.metavar == "POLICY"
    for name in SIMULATOR_POLICIES:
        assert action.type(name) == name
    with pytest.raises(argparse.ArgumentTypeError, match="module:attribute"):
        action.type("fifo")
    assert sim_cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--eviction" in text and all(name in text for name in SIMULATOR_POLICIES)
    assert "oracle" in text
    assert sim_cli.main(["--eviction", "fifo"]) == 2
    assert "'fifo' is not one of" in capsys.readouterr().err


def test_oracle_on_a_trace_without_hash_ids_is_a_clear_error(capsys):
    assert sim_cli.main(["--trace", AZURE, "--limit", "5", "--eviction", "oracle"]) == 2
    err = capsys.readouterr().err
    assert "--eviction oracle needs a trace with hash_ids" in err
    with pytest.raises(ValueError, match="needs to know when each block is used again"):
        Simulator(load_trace(AZURE, limit=5), SimConfig(eviction="oracle"))


def test_unknown_policy_is_a_value_error():
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'"):
        Simulator(load_trace(limit=3), SimConfig(eviction="fifo"))


def test_policy_arguments():
    assert policy_arguments("lru") == {}
    for name in EVICTION_POLICIES[1:]:
        assert policy_arguments(name) == {"eviction": name}
    assert policy_arguments("oracle") == {"eviction": "oracle", "_hindsight": True}


@pytest.mark.parametrize("policy", SIMULATOR_POLICIES)
def test_simulator_builds_its_managers_with_the_policy(tmp_path, policy):
    built = []
    sim = Simulator(
        load_trace(mooncake_file(tmp_path, HAND)),
        SimConfig(num_blocks=64, block_size=512, eviction=policy),
        hint_recording(built),
    )
    res = sim.run()
    # The warm-up manager and the run's manager, both with the policy.
    assert built == [(policy, policy == "oracle")] * 2
    assert sim.manager.eviction == policy and res.summary()["eviction"] == policy
    assert bool(sim.manager.calls) == (policy == "oracle")


# --- oracle hints -------------------------------------------------------------------------


def test_next_use_on_a_hand_made_trace(tmp_path):
    reqs = load_trace(mooncake_file(tmp_path, HAND))
    keys = block_keys(reqs, 512)
    assert keys.owner.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    assert next_use(keys).tolist() == [v for row in HAND_NEXT for v in row]
    # At block size 256 each hash block is two manager blocks, keyed apart by position:
    # r2 (600 tokens) holds D's two blocks, r4 (700 tokens) too.
    keys = block_keys(reqs, 256)
    expected = [[1, 1, 3, 3], [3, 3, -1, -1], [4, 4], [-1, -1, -1, -1], [-1, -1]]
    assert next_use(keys).tolist() == [v for row in expected for v in row]


def test_simulator_hands_each_admission_its_next_uses(tmp_path):
    reqs = load_trace(mooncake_file(tmp_path, HAND))
    sim = Simulator(
        reqs, SimConfig(num_blocks=64, block_size=512, eviction="oracle"), hint_recording([])
    )
    res = sim.run()
    assert res.served == 5 and res.preemptions == 0
    calls = sim.manager.calls
    assert [sorted(c.values()) for c in calls] == [sorted(v) for v in HAND_NEXT]
    r0, r1, _, r3, _ = calls
    # The blocks are those of the admitted prompts' tables: r1 and r3 hit r0's first block.
    (a,) = [b for b, v in r0.items() if v == 1]
    assert r1[a] == 3 and r3[a] == -1
    # r3 may not reuse its last prompt token's block (B): it computes its own copy.
    (b,) = [b for b, v in r0.items() if v == 3]
    assert b not in r3


def test_hint_is_the_next_use_after_the_latest_holder(tmp_path):
    reqs = load_trace(mooncake_file(tmp_path, HAND))
    hints = Hints(block_keys(reqs, 512))
    # r3 admitted first (r0 preempted and re-admitted after it, say): A and B are not used
    # again after r3, whichever request holds them now.
    assert hints.values(np.array([5, 6])).tolist() == [-1, -1]
    assert hints.values(np.array([0, 1])).tolist() == [-1, -1]
    assert hints.values(np.array([2, 3])).tolist() == [-1, -1]  # r1: A -> r3 passed; C never
    assert hints.values(np.array([4])).tolist() == [4]


# --- unreachable cached blocks ------------------------------------------------------------


@pytest.mark.parametrize("kind", FACTORIES)
def test_unreachable_counts_cached_blocks_whose_parent_is_gone(kind):
    # r0: one 64-token prompt, four blocks of 16, a chain A <- B <- C <- D; r1: A alone.
    reqs = [Request(0, 0.0, 64, 1, np.array([7])), Request(1, 0.0, 16, 1, np.array([7]))]
    keys = block_keys(reqs, 16)
    assert parent_keys(keys).tolist() == [-1, *keys.keys[:3].tolist(), -1]
    assert keys.keys[4] == keys.keys[0]
    mgr = FACTORIES[kind](16, 16, max_seqs=4, max_seq_len=128)
    census = Census(keys, 16)

    def admit(request):
        res = mgr.admit(reqs[request].tokens(), [reqs[request].prompt_len], atomic=False)
        table = mgr.block_tables(res.ids)
        census.after_admit(mgr, np.array([request]), table)
        return res.ids, table[0]

    ids, table = admit(0)
    census.sample(mgr)  # in use: nothing cached
    mgr.release(ids)
    census.sample(mgr)  # all four cached, every parent registered
    mgr.evict([int(table[0])])
    census.sample(mgr)  # A gone: B cannot be hit (C and D have their parents: not counted)
    assert census.unreachable == [0, 0, 1] and census.cached == [0, 4, 3]
    # A's block handed out again for other content is not read as A: B stays unreachable.
    res = mgr.admit(np.arange(1000, 1016), [16], atomic=False)
    assert mgr.block_tables(res.ids)[0, 0] == table[0]
    census.sample(mgr)
    assert census.unreachable[-1] == 1
    # r1 computes A again (a prompt never hits its last token's block): B is reachable again.
    admit(1)
    census.sample(mgr)
    assert census.unreachable[-1] == 0


def test_unreachable_fields_in_summary_and_report(tmp_path, capsys):
    res = simulate(load_trace(limit=40), SimConfig(num_blocks=2500))
    fields = res.summary()
    assert res.unreachable.size >= 2  # about one sample per 1% of the requests, and the end
    assert fields["unreachable_cached_final"] == res.unreachable[-1]
    assert fields["unreachable_cached_mean"] == round(float(res.unreachable.mean()), 1)
    assert 0 <= fields["unreachable_fraction_final"] <= 1
    azure = simulate(load_trace(AZURE, limit=20), SimConfig(num_blocks=2500)).summary()
    assert azure["unreachable_cached_mean"] is None and azure["unreachable_fraction_mean"] is None
    assert sim_cli.main(["--limit", "20"]) == 0
    assert "unreachable cached blocks, mean / final" in capsys.readouterr().out
    assert sim_cli.main(["--trace", AZURE, "--limit", "5"]) == 0
    assert "n/a (the trace has no hash_ids" in capsys.readouterr().out


# --- every policy, end to end (the managers' policies) -------------------------------------


@pytest.mark.parametrize("policy", SIMULATOR_POLICIES)
def test_every_policy_kernels_and_reference_agree(policy):
    reqs = load_trace(limit=60)
    cfg = SimConfig(num_blocks=2500, max_batch=32, step_ms=300, eviction=policy)
    a = Simulator(reqs, cfg, default_manager_factory)
    b = Simulator(reqs, cfg, reference_manager_factory)
    ra, rb = a.run(), b.run()
    assert a.manager.eviction == b.manager.eviction == policy
    a.manager.check()
    b.manager.check()
    sa, sb = ra.summary(), rb.summary()
    assert sa["eviction"] == policy and sa["evictions"] > 0
    assert {k: v for k, v in sa.items() if k not in TIMING} == {
        k: v for k, v in sb.items() if k not in TIMING
    }
    assert np.array_equal(ra.cached, rb.cached)


def test_cli_names_the_policy(capsys):
    assert (
        sim_cli.main(["--limit", "30", "--blocks", "3000", "--eviction", "oracle", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["eviction"] == out["results"]["eviction"] == "oracle"
    assert sim_cli.main(["--limit", "10", "--eviction", "sieve"]) == 0
    assert "eviction policy" in capsys.readouterr().out


# --- the policy table and the plot ----------------------------------------------------------


def row(blocks, eviction, hit, ideal, trace="mooncake"):
    point = SweepPoint(trace, 100, blocks, 16, True, eviction, 256, 30.0, 196_608, None)
    out = {**asdict(point), "prefix_hit_rate": hit, "ideal_prefix_hit_rate": ideal}
    out.update(preemptions=0, peak_blocks_used=blocks, rejected=0)
    if eviction is None:
        del out["eviction"]  # a row of a sweep made before policies: LRU
    return out


ROWS = [
    row(200, "oracle", 0.6, 0.6),
    row(100, "sieve", 0.3, 0.6),
    row(100, None, 0.2, 0.6),
    row(100, "oracle", 0.4, 0.6),
    row(200, "lru", 0.5, 0.6),
    row(200, "sieve", 0.45, 0.6),
    row(300, "lru", 0.6, 0.6),
    row(300, "leaf-lru", 0.6, 0.6),
    row(100, "lfu", 0.25, None, trace="azure"),
]


def test_policy_table_numbers():
    table = policy_table(ROWS)
    assert [(t["trace"], t["blocks"]) for t in table] == [
        ("mooncake", 100),
        ("mooncake", 200),
        ("mooncake", 300),
        ("azure", 100),
    ]
    first, second, third, azure = table
    assert list(first["hit_rate"]) == ["lru", "sieve", "oracle"]  # policy order, not row order
    assert first["hit_rate"] == {"lru": 0.2, "sieve": 0.3, "oracle": 0.4}
    # The gap is 0.6 - 0.2 = 0.4: sieve closes 0.1 of it, the oracle 0.2.
    assert first["gap_closed"] == pytest.approx({"lru": 0.0, "sieve": 0.25, "oracle": 0.5})
    assert second["gap_closed"] == pytest.approx({"lru": 0.0, "sieve": -0.5, "oracle": 1.0})
    assert third["gap_closed"] == {"lru": None, "leaf-lru": None}  # LRU is at the ideal
    assert azure["gap_closed"] == {"lfu": None} and azure["ideal_prefix_hit_rate"] is None
    assert first["block_size"] == 16 and first["limit"] == 100 and "eviction" not in first
    text = format_policy_table(table)
    lines = text.splitlines()
    assert lines[0].split() == [
        "trace",
        "blocks",
        "ideal",
        "lru",
        "lfu",
        "sieve",
        "leaf-lru",
        "oracle",
    ]
    assert "30.0% (+25% of gap)" in lines[1] and "40.0% (+50% of gap)" in lines[1]
    assert "45.0% (-50% of gap)" in lines[2]


def test_plot_sweep_one_line_per_policy(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    rows = [r for r in ROWS if r["trace"] == "mooncake"]
    fig = plot_sweep(rows)
    hit = fig.axes[0]
    lines = {line.get_label(): line for line in hit.get_lines()}
    for name in ("lru", "sieve", "leaf-lru", "oracle"):
        assert f"eviction {name}" in lines
    assert lines["eviction oracle"].get_linestyle() == "--"
    assert lines["eviction lru"].get_linestyle() == "-"
    assert lines["eviction lru"].get_xdata().tolist() == [100, 200, 300]
    assert any(label.startswith("ideal (unbounded pool)") for label in lines)
    png = tmp_path / "sweep.png"
    plot_sweep(rows, png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    # One policy other than LRU is still named.
    only = plot_sweep([r for r in rows if r.get("eviction") == "sieve"])
    assert [line.get_label() for line in only.axes[0].get_lines()][0] == "eviction sieve"


def test_a_factory_that_drops_the_policy_is_caught(tmp_path):
    def lru_only(num_blocks, block_size, *, eviction="lru", _hindsight=False, **kw):
        return HintRecorder(default_manager_factory(num_blocks, block_size, **kw), "lru")

    reqs = load_trace(mooncake_file(tmp_path, HAND))
    with pytest.raises(ValueError, match="built a manager with eviction 'lru', not 'sieve'"):
        Simulator(reqs, SimConfig(num_blocks=64, block_size=512, eviction="sieve"), lru_only)


@pytest.mark.parametrize("policy", ["lru", "oracle"])
def test_cli_loads_the_kernels_of_its_policy_first(monkeypatch, capsys, policy):
    from kvnumba import kernels

    calls = []
    real = kernels.prepare
    monkeypatch.setattr(
        kernels, "prepare", lambda names, **kw: calls.append((names, kw)) or real(names, **kw)
    )
    assert sim_cli.main(["--limit", "3", "--eviction", policy]) == 0
    ((names, kw),) = calls
    other = policy != "lru"
    assert names == (kernels.POLICY if other else kernels.PLAIN) and kw["policy"] == other


def test_policy_table_shows_what_the_hits_are_worth():
    rows = [
        {**row(100, "lru", 0.2, 0.6), "prefill_tokens_computed": 3_000_000, "ttft_p99_ms": 2500.0},
        {**row(100, "t-lru", 0.3, 0.6), "prefill_tokens_computed": 2_500_000, "ttft_p99_ms": 900},
    ]
    (entry,) = policy_table(rows)
    assert entry["tokens_computed"] == {"lru": 3_000_000, "t-lru": 2_500_000}
    assert entry["ttft_p99_ms"] == {"lru": 2500.0, "t-lru": 900}
    tokens = format_policy_table([entry], "tokens_computed").splitlines()
    assert tokens[0].split()[-2:] == ["lru", "t-lru"] and tokens[1].split()[-2:] == ["3.00", "2.50"]
    ttft = format_policy_table([entry], "ttft_p99_ms").splitlines()
    assert ttft[1].split()[-2:] == ["2.50", "0.90"]
    with pytest.raises(ValueError, match="metric"):
        format_policy_table([entry], "latency")
