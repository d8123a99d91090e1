"""Windowed attention in the simulator: sliding window and chunked local attention against
full attention, both managers, the ``simulate`` comparison and the sweep's window dimensions."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvnumba import NULL_BLOCK
from kvnumba.sim import cli as sim_cli
from kvnumba.sim.ideal import ideal_prefix_hit_rate
from kvnumba.sim.report import plot_sweep, result_fields, window_comparison
from kvnumba.sim.scheduler import (
    SimConfig,
    Simulator,
    compare_window,
    default_manager_factory,
    full_attention,
    reference_manager_factory,
    simulate,
)
from kvnumba.sim.sweep_cli import UsageError, format_rows, grid_arguments
from kvnumba.sim.sweep_cli import build_parser as sweep_parser
from kvnumba.sim.sweeps import GridError, SweepPoint, make_grid
from kvnumba.sim.traces import Request, load_trace

TIMING = {"alloc_us_per_step_median", "alloc_us_per_step_mean", "replay_s", "wall_s"}
WINDOWS = {
    "sliding": {"sliding_window": 256},
    "chunked": {"attention_chunk_size": 128},
}


def staggered(n=8, prompt=1024, output=64, gap_ms=30.0):
    """``n`` long prompts, one arriving per 30 ms step, each decoding ``output`` tokens."""
    return [Request(i, gap_ms * i, prompt, output) for i in range(n)]


def pressure():
    """Eight sequences that outgrow a 60-block pool: preemptions and recomputes."""
    return [Request(i, 10.0 * i, 100 + 20 * i, 300) for i in range(8)]


def without_timing(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMING}


# --- memory -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", WINDOWS)
def test_window_uses_less_peak_memory_than_full_attention_on_long_prompts(kind):
    # Prompts of 1,024 tokens (64 blocks), windows of 256 / 128 tokens: a sequence keeps about
    # a window's blocks once it decodes; under full attention it keeps all of them.
    config = SimConfig(num_blocks=2048, max_batch=16, **WINDOWS[kind])
    windowed, full = compare_window(config, staggered())
    assert windowed.served == full.served == 8 and not windowed.rejected.any()
    assert windowed.preemptions == full.preemptions == 0
    assert full.used.max() >= 8 * 64  # every sequence held its whole prompt at once
    assert windowed.used.max() < full.used.max() / 2
    assert windowed.used.mean() < full.used.mean() / 2
    # The blocks that left the windows are cached, not lost: used + cached stays in the pool.
    assert np.all(windowed.used + windowed.cached <= config.blocks)


def test_compare_window_runs_the_same_config_without_the_window():
    config = SimConfig(num_blocks=2048, max_batch=16, sliding_window=256, eviction="sieve")
    assert full_attention(config) == dataclasses.replace(config, sliding_window=None)
    assert not full_attention(config).windowed and config.windowed
    windowed, full = compare_window(config, staggered(4))
    alone = simulate(staggered(4), full_attention(config))
    assert without_timing(full.summary()) == without_timing(alone.summary())
    with pytest.raises(ValueError, match="needs a config with sliding_window"):
        compare_window(full_attention(config), staggered(2))


def test_manager_built_with_the_window_and_released_blocks_are_null():
    sim = Simulator(staggered(2, output=200), SimConfig(num_blocks=512, sliding_window=64))
    assert sim.manager.sliding_window == 64 and sim.manager.attention_chunk_size is None
    res = sim.run()
    assert res.served == 2
    sim.manager.check()
    chunked = Simulator(staggered(1), SimConfig(num_blocks=512, attention_chunk_size=256))
    assert chunked.manager.attention_chunk_size == 256


def test_a_request_bigger_than_the_pool_is_still_rejected_under_a_window():
    # The simulator prefills (and recomputes) a request in one admit, which claims a block for
    # every position it computes: a request must fit the pool whole, window or not.
    reqs = [Request(0, 0.0, 100, 2000), Request(1, 0.0, 100, 10)]
    res = simulate(reqs, SimConfig(num_blocks=60, sliding_window=64))
    assert res.rejected.tolist() == [True, False]


def test_windowed_run_has_no_unreachable_census():
    # A windowed hit skips the blocks below its window: "parent gone" no longer means
    # "unreachable", so the count is not taken.
    reqs = load_trace(limit=20)
    fields = simulate(reqs, SimConfig(num_blocks=3000, sliding_window=1024)).unreachable_fields()
    assert set(fields.values()) == {None}


# --- kernels and reference ----------------------------------------------------------------


@pytest.mark.parametrize("kind", WINDOWS)
def test_kernels_and_reference_give_identical_rows_with_a_window(kind):
    # Under pressure: preemptions, recomputes that hit their own released blocks (with
    # NULL_BLOCK entries below the hit's window), evictions.
    reqs = pressure()
    config = SimConfig(num_blocks=60, max_batch=8, **WINDOWS[kind])
    a = Simulator(reqs, config, default_manager_factory)
    b = Simulator(reqs, config, reference_manager_factory)
    ra, rb = a.run(), b.run()
    a.manager.check()
    b.manager.check()
    assert without_timing(result_fields(ra, reqs, config)) == without_timing(
        result_fields(rb, reqs, config)
    )
    assert np.array_equal(ra.used, rb.used) and np.array_equal(ra.cached, rb.cached)
    assert ra.evictions > 0 and ra.served == 8


def test_kernels_and_reference_agree_on_a_shared_prefix_trace_with_a_window():
    # Mooncake prompts share prefixes: windowed hits, whose leading entries are NULL_BLOCK.
    reqs = load_trace(limit=60)
    config = SimConfig(num_blocks=2000, max_batch=32, step_ms=100, sliding_window=1000)
    a, b = (simulate(reqs, config, f) for f in (default_manager_factory, reference_manager_factory))
    assert without_timing(a.summary()) == without_timing(b.summary())
    assert np.array_equal(a.used, b.used) and np.array_equal(a.cached, b.cached)
    assert a.first_admit_cached > 0


def test_oracle_hints_skip_the_null_entries_of_windowed_hits():
    seen = {"null": 0, "hints": 0}

    class Checked:
        def __init__(self, mgr):
            self.mgr = mgr

        def block_tables(self, ids):
            tables = self.mgr.block_tables(ids)
            seen["null"] += int((tables == NULL_BLOCK).sum())
            return tables

        def set_next_use(self, blocks, values):
            assert np.all(np.asarray(blocks) >= 0)
            seen["hints"] += len(blocks)
            return self.mgr.set_next_use(blocks, values)

        def __getattr__(self, name):
            return getattr(self.mgr, name)

    def factory(*args, **kwargs):
        return Checked(default_manager_factory(*args, **kwargs))

    reqs = load_trace(limit=60)
    config = SimConfig(
        num_blocks=2000, max_batch=32, step_ms=100, sliding_window=1000, eviction="oracle"
    )
    sim = Simulator(reqs, config, factory)
    res = sim.run()
    sim.manager.check()
    assert res.served + int(res.rejected.sum()) == 60
    assert seen["null"] > 0 and seen["hints"] > 0


@pytest.mark.parametrize(
    "kind",
    [{}, {"sliding_window": 1024}, {"sliding_window": 1}, {"attention_chunk_size": 2048}],
)
def test_unbounded_windowed_pool_reaches_its_ideal_exactly(kind):
    # A sliding window (W >= 2) has full attention's ideal; chunked local attention counts the
    # tokens below a prompt's last chunk as cached, so its ideal is its own.
    reqs = load_trace(limit=300)
    config = SimConfig(num_blocks=1 << 21, **kind)
    res = simulate(reqs, config)
    ideal = ideal_prefix_hit_rate(reqs, 16, **kind)
    assert res.evictions == 0 and res.preemptions == 0
    assert (res.first_admit_cached, res.first_admit_tokens) == (
        ideal.cached_tokens,
        ideal.prompt_tokens,
    )
    fields = result_fields(res, reqs, config)
    assert fields["ideal_prefix_hit_rate"] == fields["prefix_hit_rate"]
    assert fields["prefix_hit_rate_if_no_evictions"] == fields["prefix_hit_rate"]
    full = ideal_prefix_hit_rate(reqs, 16).rate
    if kind.get("attention_chunk_size") or kind.get("sliding_window") == 1:
        assert ideal.rate > full
    else:
        assert ideal.rate == full


# --- kvnumba simulate ---------------------------------------------------------------------


def test_simulate_sliding_window_prints_both_runs(capsys):
    assert sim_cli.main(["--limit", "40", "--blocks", "4000", "--sliding-window", "1024"]) == 0
    out = capsys.readouterr().out
    assert "sliding window 1,024 tokens" in out
    assert "the same trace without the window (full attention):" in out
    comparison = out.split("the same trace without the window")[1]
    for label in (
        "window / full",
        "blocks used, peak",
        "blocks used, mean",
        "prefix hit rate, first admissions",
        "cached prompt tokens, first admissions",
        "preemptions",
    ):
        assert label in comparison


def test_simulate_json_holds_both_runs_and_their_ratios(capsys):
    argv = ["--limit", "40", "--blocks", "4000", "--attention-chunk-size", "2048", "--json"]
    assert sim_cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["attention_chunk_size"] == 2048 and doc["config"]["sliding_window"] is None
    assert doc["window_vs_full"] == window_comparison(doc["results"], doc["full_attention"])
    peak = doc["window_vs_full"]["peak_blocks_used"]
    assert peak["window"] == doc["results"]["peak_blocks_used"]
    assert peak["full"] == doc["full_attention"]["peak_blocks_used"]
    assert peak["ratio"] == round(peak["window"] / peak["full"], 4) < 1
    # Without a window: one run, no comparison.
    assert sim_cli.main(["--limit", "5", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "full_attention" not in plain and plain["config"]["sliding_window"] is None


def test_window_comparison_ratio_is_none_when_full_is_zero():
    row = {
        "peak_blocks_used": 10,
        "mean_blocks_used": 5.0,
        "peak_blocks_cached": 0,
        "mean_blocks_cached": 0.0,
        "prefix_hit_rate": 0.5,
        "first_admit_cached_tokens": 16,
        "preemptions": 0,
        "evictions": 0,
    }
    out = window_comparison(row, {**row, "peak_blocks_used": 20, "preemptions": 0})
    assert out["peak_blocks_used"] == {"window": 10, "full": 20, "ratio": 0.5}
    assert out["preemptions"]["ratio"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sliding-window", "64", "--attention-chunk-size", "64"], "not allowed with"),
        (["--sliding-window", "0"], "must be >= 1"),
        (["--attention-chunk-size", "100"], "invalid pool: attention_chunk_size=100"),
    ],
)
def test_simulate_bad_window_exits_2(capsys, argv, message):
    assert sim_cli.main(["--limit", "3", *argv]) == 2
    assert message in capsys.readouterr().err


# --- kvnumba sweep ------------------------------------------------------------------------


def test_sweep_resume_key_differs_for_two_windows():
    base = SweepPoint("mooncake", 10, 3000, 16, True, "lru", 8, 30.0, 196_608, None)
    keys = {
        dataclasses.replace(base, **kind).key
        for kind in (
            {},
            {"sliding_window": 1024},
            {"sliding_window": 4096},
            {"attention_chunk_size": 1024},
        )
    }
    assert len(keys) == 4
    assert json.loads(dataclasses.replace(base, sliding_window=1024).key)["sliding_window"] == 1024


def test_grid_of_windows_never_combines_both_kinds():
    points = make_grid(
        "mooncake",
        blocks=[100, 200],
        sliding_window=[None, 1024],
        attention_chunk_size=[None, 8192],
        limit=5,
    )
    kinds = [(p.sliding_window, p.attention_chunk_size, p.blocks) for p in points]
    assert kinds == [
        (None, None, 100),
        (None, None, 200),
        (None, 8192, 100),
        (None, 8192, 200),
        (1024, None, 100),
        (1024, None, 200),
    ]
    assert points[4].sim_config().sliding_window == 1024
    assert points[2].sim_config().attention_chunk_size == 8192
    with pytest.raises(GridError, match="multiple of the block size"):
        make_grid("mooncake", block_sizes=[16, 48], attention_chunk_size=[64])
    with pytest.raises(GridError, match="sets both sliding_window and attention_chunk_size"):
        make_grid("mooncake", sliding_window=1024, attention_chunk_size=8192)
    with pytest.raises(GridError, match="sliding_window must be an integer >= 1 or None"):
        make_grid("mooncake", sliding_window=[0])


def test_sweep_cli_and_grid_file_take_windows(tmp_path):
    args = sweep_parser().parse_args(
        ["--trace", "mooncake", "--sliding-window", "none,1024", "--sliding-window", "4096"]
    )
    assert grid_arguments(args)["sliding_window"] == [None, 1024, 4096]
    grid = tmp_path / "grid.toml"
    grid.write_text('traces = ["mooncake"]\nattention_chunk_size = ["none", 8192]\n')
    args = sweep_parser().parse_args(["--config", str(grid)])
    assert grid_arguments(args)["attention_chunk_size"] == [None, 8192]
    args = sweep_parser().parse_args(["--trace", "azure", "--sliding-window", "wide"])
    with pytest.raises(UsageError, match="--sliding-window: 'wide' is not an integer or none"):
        grid_arguments(args)


def test_sweep_rows_table_and_plot_show_the_window(tmp_path):
    base = {
        "trace": "mooncake",
        "blocks": 100,
        "block_size": 16,
        "prefix_caching": True,
        "eviction": "lru",
        "max_batch": 8,
        "step_ms": 30.0,
        "prefix_hit_rate": 0.1,
        "ideal_prefix_hit_rate": 0.2,
        "preemptions": 0,
        "rejected": 0,
        "peak_blocks_used": 50,
        "evictions": 0,
        "unreachable_cached_mean": None,
        "replay_s": 0.1,
    }
    rows = [
        base,  # a row of an older sweep: no window columns, full attention
        {**base, "sliding_window": 1024, "peak_blocks_used": 20},
        {**base, "attention_chunk_size": 8192, "ideal_prefix_hit_rate": 0.9},
    ]
    table = format_rows(rows)
    assert "full" in table and "sw 1024" in table and "chunk 8192" in table
    fig = plot_sweep(rows)
    labels = fig.axes[0].get_legend_handles_labels()[1] + fig.axes[2].get_legend().texts
    text = " ".join(t if isinstance(t, str) else t.get_text() for t in labels)
    assert "sliding window 1,024" in text and "chunks of 8,192" in text
