"""What ``kvnumba simulate`` reports and accepts.

Hit rate of first admissions apart from recompute, the ideal hit rate and the eviction hint,
the whole command's wall time, the plot, input gaps (BOM, CRLF, binary files, Ctrl-C,
non-finite step) and the bench command naming no file the package does not ship.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from outside_paths import outside_references

from kvnumba.bench.cli import main as bench_main
from kvnumba.sim import cli as sim_cli
from kvnumba.sim.ideal import IdealHits, block_keys, ideal_prefix_hit_rate, ideal_prefix_hits
from kvnumba.sim.report import eviction_hint, result_fields, save_timeline, timeline_title
from kvnumba.sim.scheduler import SimConfig, Simulator, simulate
from kvnumba.sim.traces import Request, load_trace

AZURE_ROWS = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,0",
]


def mooncake_file(tmp_path, rows, name="hand.jsonl"):
    path = tmp_path / name
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    path.write_text(
        "".join(json.dumps(dict(zip(keys, r, strict=True))) + "\n" for r in rows),
        encoding="utf-8",
    )
    return path


def run_json(capsys, *argv):
    assert sim_cli.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["config"], out["results"]


# --- input gaps --------------------------------------------------------------------------


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_csv_with_bom_or_crlf_is_accepted(tmp_path, capsys, bom, newline):
    path = tmp_path / "excel.csv"
    path.write_bytes(bom + newline.join(AZURE_ROWS).encode() + newline.encode())
    reqs = load_trace(path)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(374, 44), (396, 109), (879, 0)]
    assert reqs[1].arrival_ms == pytest.approx(4314.579)
    _, res = run_json(capsys, "--trace", str(path))
    assert res["served"] == 3


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_jsonl_with_bom_and_crlf_is_accepted(tmp_path, bom):
    line = '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [4, 5]}'
    path = tmp_path / "t.jsonl"
    path.write_bytes(bom + (line + "\r\n").encode() * 3)
    reqs = load_trace(path)
    assert len(reqs) == 3 and reqs[0].hash_ids.tolist() == [4, 5]


def test_binary_file_error_names_file_and_line(tmp_path, capsys):
    png = tmp_path / "picture.csv"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert sim_cli.main(["--trace", str(png)]) == 2
    err = capsys.readouterr().err
    assert str(png) in err and "line 1" in err and "not UTF-8" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # Further down the file: the line where the bytes stop being text.
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\r\n'
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(good.encode() * 2 + b"\xff\xfe\x00garbage\n" + good.encode())
    with pytest.raises(ValueError, match=rf"{mixed.name}: line 3: not UTF-8"):
        load_trace(mixed)
    assert sim_cli.main(["--trace", str(mixed)]) == 2
    assert "line 3" in capsys.readouterr().err


@pytest.mark.parametrize("step", ["inf", "-inf", "nan", "0", "-5", "1e400"])
def test_non_finite_or_non_positive_step_rejected(capsys, step):
    assert sim_cli.main(["--limit", "3", "--step-ms", step]) == 2
    assert "--step-ms" in capsys.readouterr().err


def test_non_finite_step_rejected_by_the_simulator():
    for step in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="invalid simulation config"):
            Simulator([Request(0, 0.0, 5, 1)], SimConfig(num_blocks=8, step_ms=step))


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Simulator, "run", interrupted)
    assert sim_cli.main(["--limit", "5"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "kvnumba simulate: interrupted\n"
    assert captured.out == ""


def test_ctrl_c_inside_a_kernel_callback_exits_130(monkeypatch, capsys):
    # SIGINT while a numba kernel calls back into Python surfaces as a SystemError caused by
    # the KeyboardInterrupt (seen in the real-process test below); still Ctrl-C.
    def interrupted_in_numba(self):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError("returned a result with an exception set") from exc

    monkeypatch.setattr(Simulator, "run", interrupted_in_numba)
    assert sim_cli.main(["--limit", "5"]) == 130
    assert capsys.readouterr().err == "kvnumba simulate: interrupted\n"
    assert not sim_cli.interrupted(SystemError("a real bug"))

    def crash(self):
        raise SystemError("a real bug")

    monkeypatch.setattr(Simulator, "run", crash)
    with pytest.raises(SystemError, match="a real bug"):
        sim_cli.main(["--limit", "5"])


def test_ctrl_c_in_a_real_process_exits_130_without_traceback():
    # The whole embedded trace on a tiny pool keeps the replay busy for many seconds.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvnumba", "simulate", "--blocks", "13000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background jobs with SIGINT ignored; undo that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(3.0)
        assert proc.poll() is None, "the replay ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err == "kvnumba simulate: interrupted\n" and out == ""


# --- hit rates ---------------------------------------------------------------------------


def test_first_admissions_and_recompute_are_reported_apart():
    # Two requests with unique content (no hash ids) that cannot run together in 30 blocks:
    # the newer is preempted and recomputed from prompt + generated tokens, which hit its
    # own just-released blocks. That is recompute, not prefix sharing.
    reqs = [Request(0, 0.0, 100, 200), Request(1, 0.0, 100, 200)]
    res = simulate(reqs, SimConfig(num_blocks=30, max_batch=4))
    assert res.preemptions == 1
    assert res.first_admit_tokens == 200 and res.first_admit_cached == 0
    assert res.prefix_hit_rate == 0.0
    assert res.recompute_tokens == res.admitted_tokens - 200 > 100
    assert 0 < res.recompute_cached < res.recompute_tokens
    assert res.prefix_hit_rate_incl_recompute == pytest.approx(
        res.recompute_cached / (200 + res.recompute_tokens)
    )
    s = res.summary()
    assert s["prefix_hit_rate"] == 0.0 and s["first_admit_prompt_tokens"] == 200
    assert s["recompute_tokens"] == res.recompute_tokens
    assert s["recompute_cached_tokens"] == res.recompute_cached
    assert s["prefix_hit_rate_incl_recompute"] == round(res.prefix_hit_rate_incl_recompute, 4)
    assert "prefix_hit_rate_tokens" not in s  # the ambiguous old name is gone


def test_azure_under_pressure_shows_no_prefix_hits(capsys):
    # Azure carries no sharing: hits that came from recomputing preempted requests must not
    # count as prefix hits.
    _, res = run_json(capsys, "--trace", "azure", "--limit", "150", "--blocks", "500")
    assert res["preemptions"] > 0 and res["recompute_cached_tokens"] > 0
    assert res["prefix_hit_rate"] == 0.0 and res["prefix_hit_rate_incl_recompute"] > 0.01
    assert res["ideal_prefix_hit_rate"] is None  # no hash_ids: no ideal to compute


HAND = [(0, 1024, 3, [1, 2]), (1000, 600, 2, [1, 3]), (2000, 1000, 4, [1, 2])]


@pytest.mark.parametrize(
    ("block_size", "cached"),
    [
        # A: nothing cached yet. B: hash block 1 shared with A: 512 tokens. C: all of A's
        # prefix, but never its last token: (1000 - 1) // 16 = 62 blocks = 992 tokens.
        (16, 0 + 512 + 992),
        # 48 does not divide 512: B reuses the 10 blocks inside hash block 1 (480 tokens;
        # block 10 straddles ids 1 and 3); C reuses (1000 - 1) // 48 = 20 of A's 21.
        (48, 0 + 480 + 960),
        # One block = one hash block: B 1 block, C 1 block (the second holds C's last token).
        (512, 0 + 512 + 512),
    ],
)
def test_ideal_hit_rate_on_a_hand_made_trace(tmp_path, block_size, cached):
    reqs = load_trace(mooncake_file(tmp_path, HAND))
    ideal = ideal_prefix_hit_rate(reqs, block_size)
    assert (ideal.cached_tokens, ideal.prompt_tokens) == (cached, 2624)
    assert ideal.rate == cached / 2624


def test_ideal_hit_rate_order_and_rules(tmp_path):
    reqs = load_trace(mooncake_file(tmp_path, HAND))
    keys = block_keys(reqs, 16)
    # Without B, only C reuses A's blocks.
    assert ideal_prefix_hits(keys, [0, 2]).cached_tokens == 992
    # C first: B still shares hash block 1 (with C now), A reuses all 62 of C's full blocks.
    assert ideal_prefix_hits(keys, [2, 1, 0]).cached_tokens == 512 + 992
    # Arrival order, not file order: C arrives first here.
    late = [(5000, *HAND[0][1:]), HAND[1], HAND[2]]
    reqs = load_trace(mooncake_file(tmp_path, late, "late.jsonl"))
    assert (
        ideal_prefix_hit_rate(reqs, 16).cached_tokens
        == ideal_prefix_hits(block_keys(reqs, 16), [1, 2, 0]).cached_tokens
    )
    # A request longer than max_seq_len is never admitted, so it neither hits nor fills.
    reqs = load_trace(mooncake_file(tmp_path, HAND, "again.jsonl"))
    assert ideal_prefix_hit_rate(reqs, 16, max_seq_len=1010) == ideal_prefix_hits(keys, [1, 2])
    # A repeated 1024-token prompt reuses 63 of its 64 blocks: the last holds its last token.
    again = [(0, 1024, 1, [1, 2]), (1, 1024, 1, [1, 2])]
    reqs = load_trace(mooncake_file(tmp_path, again, "twice.jsonl"))
    assert ideal_prefix_hit_rate(reqs, 16).cached_tokens == 63 * 16
    # A prompt of one block never hits: its last token is in it.
    one = load_trace(mooncake_file(tmp_path, [(0, 16, 1, [7]), (1, 16, 1, [7])], "one.jsonl"))
    assert ideal_prefix_hit_rate(one, 16).cached_tokens == 0
    assert ideal_prefix_hit_rate([], 16) == IdealHits(0, 0)


def test_ideal_is_none_without_hash_ids():
    assert ideal_prefix_hit_rate([Request(0, 0.0, 40, 1)], 16) is None


def test_unbounded_pool_reaches_the_ideal_exactly():
    # With an unbounded pool the simulator serves exactly what the trace's hash_ids allow.
    reqs = load_trace(limit=300)
    cfg = SimConfig(num_blocks=1 << 21)
    res = simulate(reqs, cfg)
    ideal = ideal_prefix_hit_rate(reqs, 16)
    assert res.evictions == 0 and res.preemptions == 0
    assert (res.first_admit_cached, res.first_admit_tokens) == (
        ideal.cached_tokens,
        ideal.prompt_tokens,
    )
    fields = result_fields(res, reqs, cfg)
    assert fields["ideal_prefix_hit_rate"] == fields["prefix_hit_rate"] > 0.04
    assert fields["prefix_hit_rate_if_no_evictions"] == fields["prefix_hit_rate"]
    assert eviction_hint(fields) is None


def test_evictions_gap_and_hint(capsys):
    _, res = run_json(capsys, "--limit", "300", "--blocks", "20000")
    assert res["evictions"] > 0 and res["preemptions"] == 0
    # Same admissions without evictions would have reached the ideal: evictions are the gap.
    assert res["prefix_hit_rate"] < res["prefix_hit_rate_if_no_evictions"]
    assert res["prefix_hit_rate_if_no_evictions"] == res["ideal_prefix_hit_rate"]
    assert sim_cli.main(["--limit", "300", "--blocks", "20000"]) == 0
    out = capsys.readouterr().out
    assert "ideal hit rate (unbounded pool)" in out
    (hint,) = [line for line in out.splitlines() if line.startswith("hint:")]
    assert "evictions cost" in hint and "--blocks" in hint
    # No hint when the pool holds everything, nor without prefix caching.
    assert sim_cli.main(["--limit", "300", "--blocks", "2000000"]) == 0
    assert "hint:" not in capsys.readouterr().out
    assert sim_cli.main(["--limit", "300", "--blocks", "20000", "--no-prefix-caching"]) == 0
    assert "hint:" not in capsys.readouterr().out


def test_hint_only_when_evictions_are_most_of_the_gap():
    base = {"prefix_hit_rate": 0.10, "ideal_prefix_hit_rate": 0.40}
    assert eviction_hint({**base, "prefix_hit_rate_if_no_evictions": 0.40}) is not None
    assert eviction_hint({**base, "prefix_hit_rate_if_no_evictions": 0.20}) is None
    assert eviction_hint({**base, "prefix_hit_rate_if_no_evictions": 0.40}, False) is None
    close = {"prefix_hit_rate": 0.395, "ideal_prefix_hit_rate": 0.40}
    assert eviction_hint({**close, "prefix_hit_rate_if_no_evictions": 0.40}) is None


# --- wall time and plots -----------------------------------------------------------------


def test_wall_time_covers_the_whole_command(monkeypatch, capsys):
    real = sim_cli.load_trace

    def slow_load(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(sim_cli, "load_trace", slow_load)
    _, res = run_json(capsys, "--limit", "20")
    assert res["wall_s"] >= 0.5 + res["replay_s"] - 0.01
    assert res["replay_s"] < 0.5


def test_timeline_plot_units_legend_and_log_scale():
    reqs = load_trace(limit=40)
    cfg = SimConfig(num_blocks=100_000, step_ms=50)
    res = simulate(reqs, cfg)
    title = timeline_title("mooncake_synthetic_trace.jsonl", cfg)
    assert "block size 16 tokens" in title and "100,000 blocks" in title
    fig = save_timeline(res, cfg.blocks, None, title, log_y=True)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "trace time (s)"
    # x is trace seconds: the last step of a 50 ms step is at steps[-1] * 0.05 s.
    assert ax.get_xlim()[1] >= res.steps[-1] * 0.05 * 0.99
    assert np.allclose(res.time_s, res.steps * 0.05)
    # The legend sits right of the axes, so it covers no data.
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1
    linear = save_timeline(res, cfg.blocks, None, title)
    assert linear.axes[0].get_yscale() == "linear"


def test_plot_flag_with_log_y(tmp_path, capsys):
    png = tmp_path / "blocks.png"
    assert sim_cli.main(["--limit", "20", "--plot", str(png), "--log-y"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- no reference to files the package does not ship ------------------------------------
# outside_paths.outside_references: absolute paths of a machine, folders beside the checkout
# and the notes kept there (the same rules test_repository_paths applies to tracked files).


def test_bench_help_and_output_name_no_unshipped_file(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--help"])
    text = capsys.readouterr().out
    assert bench_main(["--quick", "--workload", "micro-1", "--workload", "decode"]) == 0
    captured = capsys.readouterr()
    text += captured.out + captured.err
    assert "budgets" in text
    assert outside_references(text) == []


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_help_names_no_unshipped_file(command):
    proc = subprocess.run(
        [sys.executable, "-m", "kvnumba", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert outside_references(proc.stdout) == []
