"""What a hit is worth: the cost model's arithmetic, its clock, and where its fields show up."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from kvnumba.sim import cli as sim_cli
from kvnumba.sim import sweep_cli, sweeps
from kvnumba.sim.cost import (
    COST_FIELDS,
    DEFAULT_COST,
    LATENCY_FIELDS,
    CostModel,
    model_latency,
    modeled_clock,
    step_starts,
)
from kvnumba.sim.report import plot_sweep, result_fields, save_timeline
from kvnumba.sim.scheduler import SimConfig, Simulator, simulate
from kvnumba.sim.sweeps import ResultStore, SweepPoint, make_grid, run_point
from kvnumba.sim.traces import Request, default_trace_path, load_trace

AZURE = str(default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"))
#: Round numbers for hand arithmetic: 10 us a prompt token, 100 us a decoded token, 1 ms a pass.
HAND = CostModel(
    prefill_us_per_token=10,
    decode_us_per_token=100,
    step_overhead_us=1000,
    prefill_tokens_per_step=50,
)


def run_json(capsys, *argv):
    assert sim_cli.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["config"], out["results"]


def loop_clock(start, duration):
    """The modeled clock written as the loop it replaces."""
    end, out = -math.inf, []
    for s, d in zip(start, duration, strict=True):
        end = max(end, s) + d
        out.append(end)
    return np.array(out)


# --- the arithmetic, by hand ----------------------------------------------------------------


def test_step_durations_by_hand():
    prefill = np.array([60, 0, 20, 0, 0, 150])
    decoded = np.array([0, 1, 1, 2, 0, 3])
    # ceil(60 / 50) = 2 passes; a decode step is one; a step that computes nothing is none.
    assert HAND.passes(prefill, decoded).tolist() == [2, 1, 1, 1, 0, 3]
    assert HAND.step_duration_ms(prefill, decoded).tolist() == pytest.approx(
        [2.6, 1.1, 1.3, 1.2, 0.0, 4.8]
    )
    unlimited = CostModel(10, 100, 1000, None)
    assert unlimited.passes(prefill, decoded).tolist() == [1, 1, 1, 1, 0, 1]
    assert unlimited.step_duration_ms(prefill, decoded)[-1] == pytest.approx(2.8)


def test_ttft_and_tpot_of_a_hand_made_step_sequence():
    # Four steps of 10 ms. A (arrives 0 ms, 60-token prompt, 3 output tokens) is admitted in
    # step 0 and decodes in steps 1 to 3; B (arrives 15 ms, so it joins at step 1, 20-token
    # prompt, 1 output token) waits a step, is admitted in step 2 and decodes in step 3.
    # Durations (HAND): 2 passes + 60 x 10 us = 2.6 ms; 1 ms + 100 us = 1.1 ms;
    # 1 ms + 200 us + 100 us = 1.3 ms; 1 ms + 2 x 100 us = 1.2 ms.
    # Starts: 0; max(2.6, 10, B's arrival 15) = 15; max(16.1, 20) = 20; max(21.3, 30) = 30.
    steps = np.array([0, 1, 2, 3])
    start = step_starts(steps, 10.0, np.array([0.0, 15.0]))
    assert start.tolist() == [0.0, 15.0, 20.0, 30.0]
    lat = model_latency(
        HAND,
        step_start_ms=start,
        prefill_tokens=np.array([60, 0, 20, 0]),
        decoded=np.array([0, 1, 1, 2]),
        arrival_ms=np.array([0.0, 15.0]),
        output_len=np.array([3, 1]),
        first_admit_index=np.array([0, 2]),
        finish_index=np.array([3, 3]),
    )
    assert lat.step_end_ms.tolist() == pytest.approx([2.6, 16.1, 21.3, 31.2])
    assert lat.ttft_ms.tolist() == pytest.approx([2.6, 21.3 - 15.0])
    assert lat.tpot_ms[0] == pytest.approx((31.2 - 2.6) / 2)
    assert np.isnan(lat.tpot_ms[1])  # one output token: no time per output token
    assert lat.prefill_tokens_computed == 80
    fields = lat.fields()
    assert list(fields) == list(LATENCY_FIELDS)
    assert fields["ttft_p50_ms"] == pytest.approx((2.6 + 6.3) / 2)
    assert fields["tpot_p50_ms"] == fields["tpot_p99_ms"] == pytest.approx(14.3)


def test_a_simulated_run_by_hand():
    # The same arithmetic through the simulator: A (0 ms, 100-token prompt, 3 tokens) and B
    # (25 ms, 50 tokens, 2 tokens), 10 ms steps, no prefill limit.
    cost = CostModel(10, 100, 1000, None)
    reqs = [Request(0, 0.0, 100, 3), Request(1, 25.0, 50, 2)]
    res = simulate(reqs, SimConfig(num_blocks=64, step_ms=10.0, cost=cost))
    assert res.cached_tokens == 0 and res.steps.tolist() == [0, 1, 2, 3, 4]
    assert res.prefill_computed.tolist() == [100, 0, 50, 0, 0]
    assert res.decoded.tolist() == [0, 1, 1, 2, 1]
    assert res.first_admit_index.tolist() == [0, 2]
    assert res.finish_index.tolist() == [3, 4]
    lat = res.latency()
    # 2 ms; 10 + 1.1; max(11.1, 20, 25) + 1 + 0.5 + 0.1; 30 + 1.2; 40 + 1.1.
    assert lat.step_end_ms.tolist() == pytest.approx([2.0, 11.1, 26.6, 31.2, 41.1])
    assert lat.ttft_ms.tolist() == pytest.approx([2.0, 1.6])
    assert lat.tpot_ms.tolist() == pytest.approx([(31.2 - 2.0) / 2, 41.1 - 26.6])
    s = res.summary()
    assert s["ttft_p50_ms"] == pytest.approx(1.8) and s["prefill_tokens_computed"] == 150
    # Another profile re-times the same schedule.
    assert res.latency(HAND).step_end_ms[0] == pytest.approx(3.0)  # 2 passes + 1 ms of prefill


# --- the clock ------------------------------------------------------------------------------


def test_the_clock_jumps_over_idle_stretches_and_queues_behind_long_steps():
    # Step 2 comes after a 980 ms idle stretch: it starts at its trace time, not after step 1.
    start = np.array([0.0, 10.0, 1000.0, 1010.0])
    end = modeled_clock(start, np.array([5.0, 5.0, 5.0, 5.0]))
    assert end.tolist() == [5.0, 15.0, 1005.0, 1015.0]
    # A 50 ms step pushes the next ones behind the trace until an idle stretch absorbs it.
    end = modeled_clock(start, np.array([50.0, 5.0, 5.0, 5.0]))
    assert end.tolist() == [50.0, 55.0, 1005.0, 1015.0]
    # The vectorized clock is the loop it replaces.
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 1000, 500))
    duration = rng.exponential(3.0, 500) * (rng.random(500) < 0.8)
    assert np.allclose(modeled_clock(start, duration), loop_clock(start, duration))
    assert modeled_clock(np.zeros(0), np.zeros(0)).size == 0


def test_a_step_does_not_start_before_the_requests_it_takes_in():
    # Requests joining at step 2 (20 to 30 ms) arrive at 21 and 28 ms; the rejected one at
    # 29 ms is not taken in. Steps a request only waits in keep their trace time.
    start = step_starts(
        np.array([0, 2, 3, 9]),
        10.0,
        np.array([28.0, 21.0, 29.0, 0.0]),
        joined=np.array([True, True, False, True]),
    )
    assert start.tolist() == [0.0, 28.0, 30.0, 90.0]
    # With idle stretches skipped, a run's TTFT is never negative.
    res = simulate(load_trace(AZURE, limit=40), SimConfig(num_blocks=3000))
    lat = res.latency(CostModel(0, 0, 0, None))  # free work: TTFT is the wait for the step
    assert np.nanmin(lat.ttft_ms) >= 0 and np.nanmax(lat.ttft_ms) < 30.0


# --- what the scheduler records ------------------------------------------------------------


def test_a_preempted_request_keeps_its_first_ttft_and_pays_its_recompute():
    # Two requests that cannot run together in 30 blocks: the newer is preempted, then
    # re-admitted with its prompt plus what it had generated, hitting its own old blocks.
    reqs = [Request(0, 0.0, 100, 200), Request(1, 0.0, 100, 200)]
    res = simulate(reqs, SimConfig(num_blocks=30, max_batch=4))
    assert res.preemptions == 1 and res.preempted_count.tolist() == [0, 1]
    assert res.first_admit_index.tolist() == [0, 0]  # both admitted in the first step
    lat = res.latency()
    assert lat.ttft_ms[1] == lat.ttft_ms[0] == pytest.approx(lat.step_end_ms[0])
    # Computed tokens: both prompts in step 0, then the recompute (minus its hits) in the step
    # that re-admits request 1, after request 0 has finished.
    (again,) = np.flatnonzero(res.prefill_computed[1:]) + 1
    assert res.prefill_computed[0] == 200
    assert res.prefill_computed[again] == res.recompute_tokens - res.recompute_cached > 0
    assert res.finish_index[0] <= again < res.finish_index[1]
    # Its TPOT spans the wait in the queue.
    assert lat.tpot_ms[1] == pytest.approx(
        (lat.step_end_ms[res.finish_index[1]] - lat.step_end_ms[0]) / 199
    )
    assert lat.tpot_ms[1] > lat.tpot_ms[0]


def test_tokens_computed_are_admitted_minus_cached_and_every_token_is_decoded_once():
    reqs = load_trace(limit=60)
    res = simulate(reqs, SimConfig(num_blocks=5000))
    assert res.preemptions > 0 and res.first_admit_cached > 0 and res.recompute_cached > 0
    s = res.summary()
    assert s["prefill_tokens_computed"] == res.admitted_tokens - res.cached_tokens
    assert s["prefill_tokens_computed"] == (
        s["first_admit_prompt_tokens"]
        - s["first_admit_cached_tokens"]
        + s["recompute_tokens"]
        - s["recompute_cached_tokens"]
    )
    served = res.served_count > 0
    assert res.decoded.sum() == sum(r.output_len for r, ok in zip(reqs, served, strict=True) if ok)
    assert np.all(res.first_admit_index[served] < res.finish_index[served])
    assert res.prefill_computed.size == res.decoded.size == res.steps.size


def test_more_cache_never_computes_more_prompt_tokens():
    reqs = load_trace(limit=80)
    computed = []
    for blocks in (4000, 8000, 16000, 64000):
        s = simulate(reqs, SimConfig(num_blocks=blocks)).summary()
        assert s["rejected"] == 0  # the same requests at every pool size
        computed.append(s["prefill_tokens_computed"])
    assert computed == sorted(computed, reverse=True) and computed[0] > computed[-1]


# --- the profile and its options ------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefill_us_per_token": -1},
        {"decode_us_per_token": float("nan")},
        {"step_overhead_us": float("inf")},
        {"step_overhead_us": True},
        {"prefill_us_per_token": "40"},
        {"prefill_tokens_per_step": 0},
        {"prefill_tokens_per_step": 8.5},
    ],
)
def test_invalid_profiles_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        CostModel(**kwargs)


def test_the_default_profile_and_a_config_without_a_cost_model():
    assert DEFAULT_COST == CostModel() and list(DEFAULT_COST.fields()) == list(COST_FIELDS)
    assert SimConfig().cost is DEFAULT_COST
    with pytest.raises(ValueError, match="invalid simulation config"):
        Simulator([Request(0, 0.0, 5, 1)], SimConfig(num_blocks=8, cost=None))


def test_simulate_options_reach_the_model(capsys):
    argv = ["--trace", "azure", "--limit", "40", "--blocks", "3000"]
    cost = ["--prefill-us-per-token", "100", "--decode-us-per-token", "10"]
    cost += ["--step-overhead-us", "2500", "--prefill-tokens-per-step", "none"]
    config, res = run_json(capsys, *argv, *cost)
    expected = CostModel(100, 10, 2500, None)
    assert {k: config[k] for k in COST_FIELDS} == expected.fields()
    direct = simulate(load_trace(AZURE, limit=40), SimConfig(num_blocks=3000, cost=expected))
    assert {k: res[k] for k in LATENCY_FIELDS} == {k: direct.summary()[k] for k in LATENCY_FIELDS}
    default_config, default = run_json(capsys, *argv)
    assert {k: default_config[k] for k in COST_FIELDS} == DEFAULT_COST.fields()
    assert default["ttft_p50_ms"] != res["ttft_p50_ms"]
    # The profile changes no decision of the replay.
    assert default["prefill_tokens_computed"] == res["prefill_tokens_computed"]
    assert sim_cli.main([*argv, *cost]) == 0
    out = capsys.readouterr().out
    assert "prefill 100 us/token, decode 10 us/token" in out and "no prefill limit" in out
    for label in ("prompt tokens computed", "modeled TTFT, p50 / p99", "modeled TPOT"):
        assert label in out
    assert sim_cli.main(["--limit", "3", "--prefill-us-per-token", "-1"]) == 2
    assert "--prefill-us-per-token" in capsys.readouterr().err


def test_sweep_options_and_grid_file_reach_the_points(monkeypatch, tmp_path, capsys):
    argv = ["--trace", "azure", "--prefill-us-per-token", "100", "--decode-us-per-token", "10"]
    argv += ["--step-overhead-us", "2500", "--prefill-tokens-per-step", "none"]
    kwargs = sweep_cli.grid_arguments(sweep_cli.build_parser().parse_args(argv))
    kwargs.pop("out")
    (point,) = make_grid(**kwargs)
    assert point.cost == CostModel(100, 10, 2500, None)
    assert point.sim_config().cost == point.cost
    assert point.key != dataclasses.replace(point, decode_us_per_token=11.0).key
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["azure"]\ndecode_us_per_token = 12.5\nprefill_tokens_per_step = "none"\n'
    )
    args = sweep_cli.build_parser().parse_args(["--config", str(grid), "--step-overhead-us", "0"])
    kwargs = sweep_cli.grid_arguments(args)
    assert kwargs["decode_us_per_token"] == 12.5 and kwargs["prefill_tokens_per_step"] is None
    assert kwargs["step_overhead_us"] == 0.0
    monkeypatch.setattr(sweeps, "_dask_client", None)  # calling it would fail the test
    bad = ["--trace", "azure", "--out", str(tmp_path / "o"), "--prefill-us-per-token", "nan"]
    assert sweep_cli.main(bad) == 2
    assert "prefill_us_per_token must be a finite number >= 0" in capsys.readouterr().err
    assert sweep_cli.main([*bad[:4], "--prefill-tokens-per-step", "many"]) == 2
    assert "--prefill-tokens-per-step" in capsys.readouterr().err


# --- where the fields show up ---------------------------------------------------------------


def finite(row: dict) -> bool:
    return all(isinstance(row[k], (int, float)) and math.isfinite(row[k]) for k in LATENCY_FIELDS)


def test_summary_sweep_row_table_csv_and_plots_carry_the_fields(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    reqs = load_trace(limit=40)
    config = SimConfig(num_blocks=3000)
    res = simulate(reqs, config)
    fields = result_fields(res, reqs, config)
    assert finite(fields)
    names = list(fields)
    assert names.index("prefix_hit_rate") < names.index("prefill_tokens_computed")
    # A sweep row (run in this process, as a Dask task runs it), its table and its CSV.
    rows = [
        run_point(SweepPoint("mooncake", 40, blocks, 16, True, "lru", 256, 30.0, 196_608, None))
        for blocks in (3000, 12000)
    ]
    for row in rows:
        assert finite(row) and {k: row[k] for k in COST_FIELDS} == DEFAULT_COST.fields()
    assert {k: rows[0][k] for k in LATENCY_FIELDS} == {k: fields[k] for k in LATENCY_FIELDS}
    table = sweep_cli.format_rows(rows).splitlines()
    assert table[0].split()[10:15] == ["computed", "ttft", "ms", "tpot", "ms"]
    old = {k: v for k, v in rows[0].items() if k not in LATENCY_FIELDS and k not in COST_FIELDS}
    assert sweep_cli.format_rows([old]).count("n/a") >= 3  # a row of an older sweep
    store = ResultStore(tmp_path)
    store.load()
    for row in rows:
        store.append(row)
    with (tmp_path / "results.csv").open(newline="") as fh:
        header = next(csv.reader(fh))
    assert set(LATENCY_FIELDS) | set(COST_FIELDS) <= set(header)
    # The sweep plot's second row: prompt tokens computed, TTFT and TPOT (p50 and p99).
    fig = plot_sweep(rows)
    computed, ttft, tpot = fig.axes[3:6]
    assert computed.get_lines()[0].get_ydata().tolist() == [
        r["prefill_tokens_computed"] for r in rows
    ]
    assert len(ttft.get_lines()) == len(tpot.get_lines()) == 2
    assert fig.axes[2].get_legend() is not None  # the legend stays beside the first row
    fig = plot_sweep([old])  # no modeled points, no error
    assert not fig.axes[4].get_lines()
    # The timeline keeps one axes; the modeled numbers sit beside it.
    fig = save_timeline(res, config.blocks, None, "t")
    (ax,) = fig.axes
    assert any("TTFT p50 / p99" in t.get_text() for t in ax.texts)
