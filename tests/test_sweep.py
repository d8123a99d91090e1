"""``kvnumba sweep`` / ``kvnumba.sim.sweep``: Dask tasks, identical results, resume, bad grids."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import distributed  # the `sweep` extra, part of `test`: CI must fail, not skip, without it
import pytest

from kvnumba.cli import main as kvnumba_main
from kvnumba.eviction import SIMULATOR_POLICIES
from kvnumba.sim import cli as sim_cli
from kvnumba.sim import sweep, sweep_cli, sweeps
from kvnumba.sim.scheduler import DEFAULT_MAX_SEQ_LEN
from kvnumba.sim.sweep_cli import main as sweep_main
from kvnumba.sim.sweeps import (
    CONFIG_COLUMNS,
    TIMING_COLUMNS,
    GridError,
    ResultStore,
    SweepPoint,
    make_grid,
)

# Small slices of the embedded traces: each simulation takes well under a second.
GRID = {
    "traces": ["mooncake", "azure"],
    "blocks": [1500, 6000],
    "prefix_caching": [True, False],
    "limit": 60,
}


@pytest.fixture(scope="module")
def client():
    """A two-worker local cluster of single-threaded processes, as the sweep starts itself."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def metrics(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING_COLUMNS}


def simulate_json(capsys, point) -> dict:
    """The same simulation through ``kvnumba simulate --json``, in this process."""
    argv = ["--trace", point.trace, "--blocks", str(point.blocks), "--json"]
    argv += ["--block-size", str(point.block_size), "--max-batch", str(point.max_batch)]
    argv += ["--step-ms", repr(point.step_ms), "--max-seq-len", str(point.max_seq_len)]
    argv += ["--limit", str(point.limit)] if point.limit else []
    argv += [] if point.prefix_caching else ["--no-prefix-caching"]
    argv += ["--eviction", point.eviction]
    assert sim_cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_on_two_workers_matches_one_by_one_in_process(client, tmp_path, capsys):
    result = sweep(**GRID, out=tmp_path, scheduler=client)
    assert result.workers == 2 and result.ran == 8 and result.skipped == 0
    assert not result.failed and len(result.rows) == 8
    seen_points = set()
    for point, row in zip(make_grid(**GRID), result.rows, strict=True):
        seen_points.add(point.key)
        doc = simulate_json(capsys, point)
        # Every field of `kvnumba simulate --json` is a column; the metrics are identical.
        assert set(doc["results"]) <= set(row)
        assert metrics(doc["results"]) == {k: row[k] for k in metrics(doc["results"])}
        for name in CONFIG_COLUMNS:
            expected = doc["config"].get(name, getattr(point, name))
            if name in ("trace", "trace_format"):
                # The embedded name, resolved on each worker; the format as asked ("auto"),
                # where simulate reports the one it detected.
                expected = getattr(point, name)
            assert row[name] == expected
        assert row["key"] == point.key
    assert len(seen_points) == 8
    # The varying dimensions really vary the results.
    hits = {
        (r["trace"], r["blocks"], r["prefix_caching"]): r["prefix_hit_rate"] for r in result.rows
    }
    assert hits["mooncake", 6000, True] > 0 and hits["mooncake", 6000, False] == 0
    # Both files hold the rows, the CSV with a header.
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    on_disk = sorted((json.loads(line) for line in lines), key=lambda r: r["key"])
    assert on_disk == sorted(result.rows, key=lambda r: r["key"])
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 9 and csv_lines[0].startswith(",".join(CONFIG_COLUMNS))


def test_resume_skips_finished_simulations(client, tmp_path):
    first = sweep(**{**GRID, "blocks": [1500]}, out=tmp_path, scheduler=client)
    assert first.ran == 4
    # Mark the finished rows: if the resumed sweep re-ran them, the marks would be replaced.
    store = tmp_path / "results.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    store.write_text("".join(json.dumps({**r, "served": -1}) + "\n" for r in rows))
    new_rows = []
    second = sweep(**GRID, out=tmp_path, scheduler=client, on_row=new_rows.append)
    assert (second.ran, second.skipped, len(new_rows)) == (4, 4, 4)
    assert {r["blocks"] for r in new_rows} == {6000}
    assert [r["served"] for r in second.rows if r["blocks"] == 1500] == [-1] * 4
    assert len(store.read_text().splitlines()) == 8
    # A third run has nothing left to do and starts no task.
    third = sweep(**GRID, out=tmp_path, scheduler=client, on_row=new_rows.append)
    assert (third.ran, third.skipped, third.workers, len(new_rows)) == (0, 8, 0, 4)


def test_interrupted_sweep_resumes_where_it_stopped(client, tmp_path):
    calls = []

    def stop_after_two(row):
        calls.append(row["key"])
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(**GRID, out=tmp_path, scheduler=client, on_row=stop_after_two)
    kept = [
        json.loads(line)["key"] for line in (tmp_path / "results.jsonl").read_text().splitlines()
    ]
    assert kept == calls  # written as they finished, before the interruption
    # Nothing of the interrupted sweep is left running on the cluster.
    deadline = time.monotonic() + 30
    while client.processing() and any(client.processing().values()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rerun = []
    result = sweep(**GRID, out=tmp_path, scheduler=client, on_row=lambda r: rerun.append(r["key"]))
    assert (result.ran, result.skipped) == (6, 2)
    assert len(rerun) == 6 and not set(rerun) & set(calls)
    assert sorted(r["key"] for r in result.rows) == sorted(p.key for p in make_grid(**GRID))


def test_cut_short_last_line_is_dropped_other_garbage_is_an_error(tmp_path):
    good = {"key": "a", "served": 1}
    store = tmp_path / "results.jsonl"
    store.write_text(json.dumps(good) + "\n" + '{"key": "b", "serv')
    assert ResultStore(tmp_path).load() == {"a": good}
    assert store.read_text() == json.dumps(good) + "\n"
    assert (tmp_path / "results.csv").read_text().splitlines() == ["key,served", "a,1"]
    store.write_text("not json\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="line 1 is not a sweep result row"):
        ResultStore(tmp_path).load()


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"traces": ["nope"]}, "unknown trace 'nope'"),
        ({"traces": []}, "empty grid: no value for traces"),
        ({"traces": ["azure"], "blocks": []}, "empty grid: no value for blocks"),
        ({"traces": ["azure"], "block_sizes": [16, 0]}, "block_size must be an integer >= 1"),
        ({"traces": ["azure"], "blocks": [0]}, "blocks must be an integer >= 1"),
        ({"traces": ["azure"], "blocks": [True]}, "blocks must be an integer"),
        ({"traces": ["azure"], "step_ms": [float("inf")]}, "step_ms must be a finite number"),
        ({"traces": ["azure"], "step_ms": [float("nan")]}, "step_ms must be a finite number"),
        ({"traces": ["azure"], "max_batch": 0}, "max_batch must be an integer >= 1"),
        ({"traces": ["azure"], "prefix_caching": ["yes"]}, "prefix_caching must be a bool"),
        ({"traces": ["azure"], "limit": 0}, "limit must be an integer >= 1"),
    ],
)
def test_bad_grid_rejected_before_any_task(monkeypatch, tmp_path, grid, message):
    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started for a bad grid")

    monkeypatch.setattr(sweeps, "_dask_client", no_cluster)
    monkeypatch.setattr(sweeps, "warm_kernels", no_cluster)
    with pytest.raises(ValueError, match=message) as info:
        sweep(**grid, out=tmp_path / "out")
    assert isinstance(info.value, GridError)
    assert not (tmp_path / "out").exists()


def test_unreadable_trace_rejected_before_any_task(monkeypatch, tmp_path):
    monkeypatch.setattr(sweeps, "_dask_client", None)  # calling it would fail the test
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(GridError, match=r"bad\.jsonl: line 1"):
        sweep(traces=[str(bad)])
    other = tmp_path / "trace.parquet"
    other.write_text("x")
    with pytest.raises(GridError, match="unknown trace format"):
        sweep(traces=[str(other)])


def _head(trace: str, lines: int, dest: Path) -> str:
    """The first ``lines`` lines of an embedded trace, copied to ``dest``."""
    text = sweeps.resolve_trace(trace).read_text(encoding="utf-8").splitlines(keepends=True)
    dest.write_text("".join(text[:lines]), encoding="utf-8")
    return str(dest)


def test_trace_files_of_any_suffix_give_the_rows_of_the_embedded_trace(tmp_path):
    # A copy of 40 requests of each embedded trace under a name without a known suffix: the
    # format comes from the first line, and the rows equal those of the embedded trace.
    files = {
        "mooncake": _head("mooncake", 40, tmp_path / "mooncake-trace"),
        "azure": _head("azure", 41, tmp_path / "azure.log"),  # the header and 40 requests
    }
    for name, path in files.items():
        grid = {"blocks": [900], "limit": 40}
        (copy,) = make_grid(traces=[path], **grid)
        (embedded,) = make_grid(traces=[name], **grid)
        assert copy.trace == str(Path(path).resolve()) and copy.trace_format == "auto"
        sweeps.check_traces([copy])
        row, ref = sweeps.run_point(copy), sweeps.run_point(embedded)
        assert row["served"] == ref["served"] > 0
        drop = {"trace", "key", *TIMING_COLUMNS}
        assert {k: v for k, v in row.items() if k not in drop} == {
            k: v for k, v in ref.items() if k not in drop
        }


def test_trace_format_given_is_used_and_checked_before_any_task(monkeypatch, tmp_path):
    monkeypatch.setattr(sweeps, "_dask_client", None)  # calling it would fail the test
    azure = _head("azure", 31, tmp_path / "conv")
    mooncake = _head("mooncake", 30, tmp_path / "turns")
    (point,) = make_grid(traces=[azure, "mooncake"], limit=30, trace_format="azure")[:1]
    assert point.trace_format == "azure"
    embedded = make_grid(traces=["mooncake"], limit=30, trace_format="azure")[0]
    assert embedded.trace_format == "auto"  # an embedded trace is read in its own format
    sweeps.check_traces([point])
    ref = sweeps.run_point(make_grid(traces=["azure"], limit=30)[0])
    row = sweeps.run_point(point)
    drop = {"trace", "trace_format", "key", *TIMING_COLUMNS}
    assert {k: v for k, v in row.items() if k not in drop} == {
        k: v for k, v in ref.items() if k not in drop
    }
    assert row["served"] > 0
    with pytest.raises(GridError, match=r"turns: line 1: expected header"):
        sweep(traces=[mooncake], trace_format="azure")
    with pytest.raises(GridError, match="trace_format must be one of auto, mooncake"):
        make_grid(traces=[azure], trace_format="parquet")


def test_resume_key_leaves_out_the_automatic_trace_format(tmp_path):
    # Rows written before the trace format existed keep their key: "auto" is not in it.
    path = _head("azure", 11, tmp_path / "a.csv")
    (auto,) = make_grid(traces=[path], limit=10)
    (given,) = make_grid(traces=[path], limit=10, trace_format="azure")
    values = dataclasses.asdict(auto)
    del values["trace_format"]
    assert auto.key == json.dumps(values, sort_keys=True, separators=(",", ":"))
    assert given.key != auto.key and '"trace_format":"azure"' in given.key


def test_trace_format_from_the_command_line_and_the_grid_file(monkeypatch, tmp_path, capsys):
    parse = sweep_cli.build_parser().parse_args
    args = parse(["--trace", "a.log", "--trace-format", "burstgpt"])
    assert sweep_cli.grid_arguments(args)["trace_format"] == "burstgpt"
    assert "trace_format" not in sweep_cli.grid_arguments(parse(["--trace", "a.log"]))
    grid = tmp_path / "grid.toml"
    grid.write_text('traces = ["a.log"]\ntrace_format = "azure"\n')
    assert sweep_cli.read_grid_file(grid)["trace_format"] == "azure"
    monkeypatch.setattr(sweeps, "_dask_client", None)
    assert sweep_main(["--trace", "azure", "--trace-format", "csv"]) == 2
    assert "invalid choice: 'csv'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "nope"], "bad grid: unknown trace 'nope'"),
        ([], "empty grid: no trace"),
        (["--trace", "azure", "--block-size", "0"], "block_size must be an integer >= 1"),
        (["--trace", "azure", "--step-ms", "inf"], "step_ms must be a finite number > 0"),
        (["--trace", "azure", "--blocks", "x"], "--blocks: 'x' is not an integer"),
        (["--trace", "azure", "--prefix-caching", "maybe"], "is not on/off"),
        (["--trace", "azure", "--workers", "0"], "--workers must be >= 1"),
        (["--trace", "azure", "--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_grid_cli_exit_2(monkeypatch, tmp_path, capsys, argv, message):
    monkeypatch.setattr(sweeps, "_dask_client", None)
    assert sweep_main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_with_grid_file_on_a_running_cluster(client, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'traces = ["mooncake"]\nlimit = 40\nblocks = [2000, 8000]\nprefix_caching = true\n'
        f'out = "{tmp_path / "from-file"}"\n'
    )
    address = client.scheduler.address
    out = tmp_path / "out"
    argv = ["--config", str(grid), "--scheduler", address, "--out", str(out), "--max-batch", "64"]
    assert kvnumba_main(["sweep", *argv]) == 0
    text = capsys.readouterr().out
    assert "ran 2 simulations on 2 workers" in text and "sweep.png" in text
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["blocks"] for r in rows) == [2000, 8000]
    assert {r["max_batch"] for r in rows} == {64} and {r["limit"] for r in rows} == {40}
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "from-file").exists()  # --out wins over the file
    # Run again: everything is there already.
    assert sweep_main(argv) == 0
    assert "ran 0 simulations" in capsys.readouterr().out
    grid.write_text('traces = ["azure"]\ncolour = "blue"\n')
    assert sweep_main(["--config", str(grid)]) == 2
    assert "unknown key(s) colour" in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("NUMBA_CACHE_DIR"), reason="needs NUMBA_CACHE_DIR")
def test_workers_load_the_kernels_and_compile_nothing(client, tmp_path):
    # Warm every kernel here first (as the sweep does in its client), so that a cold cache is
    # filled before the snapshot; then a worker that compiled would write to the cache.
    sweeps.warm_kernels()
    cache = Path(os.environ["NUMBA_CACHE_DIR"])
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    result = sweep(traces=["azure"], blocks=[700, 900, 1100, 1300], limit=30, scheduler=client)
    assert result.ran == 4
    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert after == before


def test_warm_kernels_compiles_every_entry_kernel(monkeypatch):
    from kvnumba import kernels

    seen = []
    monkeypatch.setattr(kernels, "compiled", lambda name, policy=False: seen.append((name, policy)))
    sweeps.warm_kernels()
    lru = [name for name in kernels.SIGNATURES if name not in kernels.POLICY_ONLY]
    assert list(kernels.LRU) == lru
    assert seen == [(name, False) for name in lru]
    # A grid with a policy other than LRU: also the policy versions its simulations run.
    seen.clear()
    sweeps.warm_kernels(policy=True)
    assert seen[len(lru) :] == [
        (name, True) for name in kernels.POLICY if name not in kernels.ONE_REQUEST
    ]


def test_ctrl_c_stops_a_local_sweep_with_status_130(tmp_path):
    out = tmp_path / "out"
    # One quick simulation, then long ones (a small pool preempts a lot) keep both workers busy.
    argv = ["sweep", "--trace", "mooncake", "--limit", "1000", "--blocks", "16000,2000,4000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvnumba", *argv, "--workers", "2", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        rows = out / "results.jsonl"
        while not (rows.exists() and rows.read_text().strip()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # Ctrl-C in a terminal signals the whole foreground group: client and workers.
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert stderr.startswith("kvnumba sweep: interrupted; 1 rows kept in")
    assert len(rows.read_text().splitlines()) == 1


def test_a_failing_simulation_is_reported_and_retried_later(client, monkeypatch, tmp_path, capsys):
    # Skip the client's check so that the malformed trace reaches a worker and fails there.
    monkeypatch.setattr(sweeps, "check_traces", lambda points: None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    grid = {"traces": ["azure", str(bad)], "blocks": [800], "limit": 20}
    result = sweep(**grid, out=tmp_path / "out", scheduler=client)
    assert result.ran == 1 and len(result.rows) == 1
    ((point, error),) = result.failed
    assert point.trace == str(bad.resolve()) and "line 1" in error
    argv = ["--trace", f"azure,{bad}", "--blocks", "800", "--limit", "20"]
    argv += ["--out", str(tmp_path / "out"), "--scheduler", client.scheduler.address]
    assert sweep_main(argv) == 1  # the failed point has no row, so it runs (and fails) again
    captured = capsys.readouterr()
    assert "ran 0 simulations" in captured.out and "failed:" in captured.err


def test_progress_bar_without_tqdm(monkeypatch):
    from kvnumba.sim import _progress

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    with _progress.progress_bar(3, "sim", "sweep") as bar:
        bar.update()
        bar.set_postfix_str("x")
    assert isinstance(bar, _progress.NoBar)


def test_worker_adopts_the_client_cache_dir_only_when_it_has_none(monkeypatch, tmp_path):
    from numba.core import config

    reloads = []
    # Record instead of reloading: this test process must keep its own cache directory.
    monkeypatch.setattr(config, "reload_config", lambda: reloads.append(1))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    sweeps._adopt_cache_dir(str(tmp_path / "elsewhere"))  # not on this machine: ignored
    assert "NUMBA_CACHE_DIR" not in os.environ and not reloads
    sweeps._adopt_cache_dir(str(tmp_path))
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path) and reloads == [1]
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/own/dir")
    sweeps._adopt_cache_dir(str(tmp_path))
    assert os.environ["NUMBA_CACHE_DIR"] == "/own/dir" and reloads == [1]


def test_grid_accepts_numpy_values_and_drops_duplicates():
    import numpy as np

    points = make_grid(
        "azure",
        blocks=np.array([4096, 8192, 4096]),
        prefix_caching=np.array([True, False]),
        step_ms=np.float32(30),
        limit=np.int64(20),
    )
    assert [(p.blocks, p.prefix_caching) for p in points] == [
        (4096, True),
        (8192, True),
        (4096, False),
        (8192, False),
    ]
    assert all(type(p.blocks) is int and type(p.limit) is int for p in points)
    assert json.loads(points[0].key)["step_ms"] == 30.0
    # The default pool (None) and its explicit size are one simulation.
    assert len(make_grid("azure", blocks=[None, 2**19 // 16])) == 1


# --- the resume key covers every dimension ------------------------------------------------

#: A small point, and for every field of SweepPoint another value. The trace is given as a file
#: (the embedded Mooncake trace's), so that a trace format can be asked for.
BASE = SweepPoint(
    trace=str(sweeps.resolve_trace("mooncake").resolve()),
    limit=12,
    blocks=3000,
    block_size=16,
    prefix_caching=True,
    eviction="lru",
    max_batch=8,
    step_ms=30.0,
    max_seq_len=DEFAULT_MAX_SEQ_LEN,
    max_prefill_tokens=None,
)
OTHER = {
    "trace": "azure",
    "limit": 13,
    "blocks": 3100,
    "block_size": 32,
    "prefix_caching": False,
    "eviction": "sieve",
    "max_batch": 9,
    "step_ms": 40.0,
    "max_seq_len": 100_000,
    "max_prefill_tokens": 50_000,
    "sliding_window": 1024,
    "attention_chunk_size": 8192,
    "prefill_us_per_token": 20.0,
    "decode_us_per_token": 60.0,
    "step_overhead_us": 4000.0,
    "prefill_tokens_per_step": 2048,
    "trace_format": "mooncake",
}
#: The sweep() argument of each field, where it is not spelled as the field.
ARGUMENT = {"trace": "traces", "block_size": "block_sizes"}
#: Fields that take a list of values in one grid.
LISTS = (
    "trace",
    "blocks",
    "block_size",
    "prefix_caching",
    "eviction",
    "max_batch",
    "step_ms",
    "sliding_window",
    "attention_chunk_size",
)


def grid_of(point: SweepPoint, **values) -> dict:
    """sweep() arguments whose grid is ``point`` (a field given in ``values`` takes those)."""
    out = {}
    for f in dataclasses.fields(SweepPoint):
        value = values.get(f.name, getattr(point, f.name))
        out[ARGUMENT.get(f.name, f.name)] = value
    return out


def test_every_field_has_another_value():
    # A new field (grid dimension) must be given one here, so that the test below covers it.
    assert set(OTHER) == {f.name for f in dataclasses.fields(SweepPoint)}
    assert set(CONFIG_COLUMNS) == set(OTHER)


@pytest.mark.parametrize("name", list(OTHER))
def test_points_that_differ_in_one_field_each_run_and_keep_their_row(client, tmp_path, name):
    variant = dataclasses.replace(BASE, **{name: OTHER[name]})
    assert BASE.key != variant.key
    (point,) = make_grid(**grid_of(variant))
    assert point == variant  # grid_of builds exactly that point
    # One sweep, then a resumed one with the other value: nothing of the first is reused.
    first = sweep(**grid_of(BASE), out=tmp_path, scheduler=client)
    second = sweep(**grid_of(variant), out=tmp_path, scheduler=client)
    assert (first.ran, second.ran, second.skipped) == (1, 1, 0)
    assert not first.failed and not second.failed
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len({r["key"] for r in rows}) == 2
    assert sorted(str(r[name]) for r in rows) == sorted(
        str(getattr(p, name)) for p in (BASE, variant)
    )
    # Both values in one grid: two points, two simulations, two rows.
    if name in LISTS:
        both = grid_of(BASE, **{name: [getattr(BASE, name), OTHER[name]]})
        assert len(make_grid(**both)) == 2
        result = sweep(**both, scheduler=client)
        assert result.ran == 2 and len(result.rows) == 2 and not result.failed


# --- eviction policies --------------------------------------------------------------------


def test_grid_of_policies():
    points = make_grid("mooncake", blocks=[100, 200], eviction=["lru", "oracle"], limit=5)
    assert [(p.eviction, p.blocks) for p in points] == [
        ("lru", 100),
        ("lru", 200),
        ("oracle", 100),
        ("oracle", 200),
    ]
    assert points[2].sim_config().eviction == "oracle"
    assert CONFIG_COLUMNS.index("eviction") < CONFIG_COLUMNS.index("max_batch")


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"eviction": ["lru", "fifo"]}, "eviction must be one of lru, lfu, sieve"),
        ({"eviction": [3]}, "eviction must be one of"),
        ({"eviction": "oracle"}, "eviction oracle needs a trace with hash_ids"),
    ],
)
def test_bad_policy_grid_rejected_before_any_task(monkeypatch, tmp_path, grid, message):
    monkeypatch.setattr(sweeps, "_dask_client", None)  # calling it would fail the test
    with pytest.raises(GridError, match=message):
        sweep(traces=["azure"], limit=5, **grid, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_policy_option_and_grid_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sweeps, "_dask_client", None)
    argv = ["--trace", "azure", "--eviction", "lru,fifo", "--out", str(tmp_path / "o")]
    assert sweep_main(argv) == 2
    assert (
        "--eviction: 'fifo' is not one of lru, lfu, sieve, leaf-lru, t-lru, rlt, leaf-lfu, gdsf"
        in (capsys.readouterr().err)
    )
    grid = tmp_path / "grid.toml"
    grid.write_text('traces = ["azure"]\neviction = ["lru", "oracle"]\n')
    assert sweep_main(["--config", str(grid), "--out", str(tmp_path / "o")]) == 2
    assert "needs a trace with hash_ids" in capsys.readouterr().err
    args = sweep_cli.build_parser().parse_args(["--config", str(grid), "--eviction", "sieve"])
    assert sweep_cli.grid_arguments(args)["eviction"] == ["sieve"]  # the command line wins
    assert sweep_main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--eviction" in text and all(name in text for name in SIMULATOR_POLICIES)


def test_cli_prints_the_policy_table(client, tmp_path, capsys):
    argv = ["--trace", "mooncake", "--limit", "40", "--blocks", "2000,3000"]
    argv += ["--eviction", "lru,oracle", "--scheduler", client.scheduler.address]
    assert sweep_main([*argv, "--out", str(tmp_path), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "hit rate of first admissions per eviction policy" in out
    heads = [line for line in out.splitlines() if line.split()[:3] == ["trace", "blocks", "ideal"]]
    # Hit rate, then prompt tokens computed, then TTFT p99: one table each, same columns.
    assert [head.split()[3:] for head in heads] == [["lru", "oracle"]] * 3
    assert "prompt tokens computed (millions)" in out and "time to first token, p99" in out
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["eviction"], r["blocks"]) for r in rows) == [
        ("lru", 2000),
        ("lru", 3000),
        ("oracle", 2000),
        ("oracle", 3000),
    ]
    assert all(r["unreachable_cached_final"] is not None for r in rows)
    # One policy: no policy table.
    assert (
        sweep_main(
            ["--trace", "azure", "--limit", "5", "--out", str(tmp_path / "one")]
            + ["--scheduler", client.scheduler.address, "--no-plot"]
        )
        == 0
    )
    assert "per eviction policy" not in capsys.readouterr().out


def test_sweep_takes_exactly_the_keywords_of_make_grid():
    """``sweep(traces, **grid)`` passes ``grid`` on to ``make_grid``: its declared keywords
    (``GridOptions``) are ``make_grid``'s, with the same types, so neither list can drift."""
    params = inspect.signature(sweeps.make_grid).parameters
    keywords = [name for name, p in params.items() if p.kind is p.KEYWORD_ONLY]
    hints = typing.get_type_hints(sweeps.make_grid)
    assert list(sweeps.GridOptions.__annotations__) == keywords
    assert typing.get_type_hints(sweeps.GridOptions) == {name: hints[name] for name in keywords}
    with pytest.raises(TypeError, match="block_size"):
        sweep("mooncake", block_size=16)  # make_grid's name is block_sizes
