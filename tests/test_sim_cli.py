"""``kvnumba simulate``: exit codes, table and JSON output, plot file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvnumba.cli import main as kvnumba_main
from kvnumba.sim.cli import main
from kvnumba.sim.traces import default_trace_path

AZURE = str(default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"))
ROWS = [
    "requests served",
    "rejected",
    "prefix hit rate, first admissions",
    "ideal hit rate (unbounded pool)",
    "recompute after preemption",
    "blocks used, peak / mean",
    "blocks cached, peak / mean",
    "evictions",
    "preemptions",
    "COW copies",
    "allocator time per step, median / mean",
    "wall time, whole command / replay",
]


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["config"], out["results"]


def test_table_output(capsys):
    assert main(["--limit", "40"]) == 0
    out = capsys.readouterr().out
    for label in ROWS:
        assert label in out
    assert "40 of 40" in out and "mooncake_synthetic_trace.jsonl" in out


def test_json_output_and_options(capsys):
    config, res = run_json(
        capsys, "--limit", "30", "--blocks", "7000", "--block-size", "32", "--max-batch", "8"
    )
    assert config["blocks"] == 7000 and config["block_size"] == 32 and config["max_batch"] == 8
    assert res["served"] == 30 and res["rejected"] == 0
    assert res["peak_blocks_used"] <= 7000 and res["alloc_us_per_step_median"] > 0


def test_default_pool_holds_the_longest_mooncake_request(capsys):
    config, _ = run_json(capsys, "--limit", "1")
    assert config["blocks"] * config["block_size"] >= 192_000
    assert config["max_seq_len"] >= 191_386  # longest prompt + its output


def test_no_prefix_caching_and_azure(capsys):
    _, on = run_json(capsys, "--limit", "60", "--trace", AZURE, "--blocks", "400")
    _, off = run_json(
        capsys, "--limit", "60", "--trace", AZURE, "--blocks", "400", "--no-prefix-caching"
    )
    assert off["prefix_hit_rate_incl_recompute"] == 0.0 and off["served"] == on["served"] == 60


def test_embedded_trace_names(capsys):
    config, res = run_json(capsys, "--trace", "azure", "--limit", "5")
    assert config["trace"] == AZURE and res["served"] == 5
    config, _ = run_json(capsys, "--trace", "mooncake", "--limit", "5")
    assert config["trace"].endswith("mooncake_synthetic_trace.jsonl")


def test_reference_manager_gives_the_same_answer(capsys):
    argv = ["--limit", "40", "--trace", AZURE, "--blocks", "300", "--max-batch", "16"]
    _, fast = run_json(capsys, *argv)
    config, ref = run_json(capsys, *argv, "--reference")
    assert config["manager"] == "reference"
    timing = {"alloc_us_per_step_median", "alloc_us_per_step_mean", "replay_s", "wall_s"}
    assert {k: v for k, v in fast.items() if k not in timing} == {
        k: v for k, v in ref.items() if k not in timing
    }


def test_plot(tmp_path, capsys):
    png = tmp_path / "blocks.png"
    assert main(["--limit", "20", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--blocks", "0"], "must be >= 1"),
        (["--limit", "x"], "invalid"),
        (["--bogus"], "unrecognized"),
        (["--trace", "/nonexistent/trace.jsonl"], "cannot read trace"),
        (["--trace", "trace.parquet"], "cannot read trace"),
        (["--plot", "out.jpg"], "--plot must name a .png"),
        (["--plot", "/nonexistent/dir/out.png", "--limit", "3"], "cannot write plot"),
    ],
)
def test_usage_and_file_errors_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_malformed_trace_exit_2_with_line_number(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
    path.write_text(good + '{"timestamp": 1, "input_length": 5}\n')
    assert main(["--trace", str(path)]) == 2
    assert "line 2" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert main(["--trace", str(empty)]) == 2
    assert "no requests" in capsys.readouterr().err


def test_help_and_dispatch(capsys):
    assert main(["--help"]) == 0
    assert "--max-batch" in capsys.readouterr().out
    assert kvnumba_main(["simulate", "--limit", "5"]) == 0
    assert "5 of 5" in capsys.readouterr().out


def test_console_entry_point_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "kvnumba", "simulate", "--limit", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"]["served"] == 10
    proc = subprocess.run(
        [sys.executable, "-m", "kvnumba", "simulate", "--trace", "missing.csv"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "cannot read trace" in proc.stderr
