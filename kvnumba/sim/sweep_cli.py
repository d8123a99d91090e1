"""``kvnumba sweep``: run a grid of simulations on Dask and tabulate and plot them.

Exit codes: 0 every simulation has a row; 1 some simulations failed (listed; a re-run retries
them); 2 usage error, bad grid, unreadable trace or grid file, no Dask; 130 interrupted
(Ctrl-C; a re-run resumes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvnumba.eviction import SIMULATOR_POLICIES, is_valid_policy
from kvnumba.sim.cli import add_cost_options, interrupted
from kvnumba.sim.scheduler import DEFAULT_MAX_SEQ_LEN, DEFAULT_STEP_MS
from kvnumba.sim.traces import TRACE_FORMATS

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

EPILOG = """\
Each list option takes comma-separated values and may be repeated; a grid file (--config,
TOML) sets the same keys (traces, blocks, block_size, prefix_caching, eviction, sliding_window,
attention_chunk_size, max_batch, step_ms, limit, max_seq_len, max_prefill_tokens, out,
scheduler, workers; the cost profile's prefill_us_per_token, decode_us_per_token,
step_overhead_us and prefill_tokens_per_step), and options given on the command line win.
Example grid file:

    traces = ["mooncake", "azure"]
    limit = 1000
    blocks = [4096, 16384, 65536]
    prefix_caching = [true, false]

A grid of several eviction policies also prints, per pool size, each policy's hit rate and the
share of the gap between LRU and the ideal (unbounded pool) hit rate that it closes; 'oracle'
(the future of the trace, as a reference point) needs traces with hash_ids:

    kvnumba sweep --trace mooncake --limit 2000 --blocks 2048,4096,8192 \
        --eviction lru,lfu,sieve,leaf-lru,oracle

The attention kind is a grid dimension too: 'none' is full attention, and a point never sets
both a sliding window and a chunk size (so this grid is full, two windows, one chunk size at
each pool size; in a grid file, sliding_window = ["none", 1024, 4096]):

    kvnumba sweep --trace mooncake --limit 2000 --blocks 4096,8192 \
        --sliding-window none,1024,4096 --attention-chunk-size none,8192

Without --scheduler the sweep starts a local Dask cluster of one single-threaded worker process
per core. To use other machines, start a scheduler and workers that see the same files and
NUMBA_CACHE_DIR, then pass its address:

    dask scheduler                       # prints tcp://HOST:8786
    dask worker tcp://HOST:8786 --nworkers 8 --nthreads 1
    kvnumba sweep --scheduler tcp://HOST:8786 ...

Rows are appended to OUT/results.jsonl and OUT/results.csv as each simulation finishes; run the
same command again after an interruption and the finished ones are skipped."""

#: Keys a grid file may set (``traces`` and ``block_size`` also in their other spelling).
CONFIG_KEYS = {
    "traces": "traces",
    "trace": "traces",
    "blocks": "blocks",
    "block_size": "block_sizes",
    "block_sizes": "block_sizes",
    "prefix_caching": "prefix_caching",
    "eviction": "eviction",
    "sliding_window": "sliding_window",
    "attention_chunk_size": "attention_chunk_size",
    "max_batch": "max_batch",
    "step_ms": "step_ms",
    "limit": "limit",
    "max_seq_len": "max_seq_len",
    "max_prefill_tokens": "max_prefill_tokens",
    "prefill_us_per_token": "prefill_us_per_token",
    "decode_us_per_token": "decode_us_per_token",
    "step_overhead_us": "step_overhead_us",
    "prefill_tokens_per_step": "prefill_tokens_per_step",
    "trace_format": "trace_format",
    "out": "out",
    "scheduler": "scheduler",
    "workers": "n_workers",
}

_BOOL = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False}
_BOOL.update({"no": False, "0": False})


class UsageError(ValueError):
    """A command-line or grid-file value that cannot be parsed (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvnumba sweep``."""
    p = argparse.ArgumentParser(
        prog="kvnumba sweep",
        description="Replay traces through the block manager for every point of a grid\n"
        "(traces x pool sizes x block sizes x prefix caching x eviction policies x sliding\n"
        "windows x attention chunk sizes x max batch x step length), one Dask task per\n"
        "simulation, one table row per simulation; then\n"
        "plot hit rate, preemptions, peak blocks used, prompt tokens computed and the\n"
        "modeled TTFT and TPOT against pool size.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="GRID.toml", help="grid file (TOML)")
    lists = [
        (
            "--trace",
            "NAME",
            "traces: 'mooncake', 'azure' (embedded) or trace files of any suffix (Mooncake, "
            "Azure LLM inference 2023/2024, BurstGPT; the format is read from the first line "
            "unless --trace-format says it)",
        ),
        ("--blocks", "N", "pool sizes in blocks ('default': 2**19 tokens / block size)"),
        ("--block-size", "N", "tokens per block (default 16)"),
        ("--prefix-caching", "on|off", "prefix caching (default on)"),
        (
            "--eviction",
            "NAME",
            f"eviction policies: {', '.join(SIMULATOR_POLICIES)}, or 'module:attribute' naming "
            "a PriorityPolicy of your own (default lru)",
        ),
        (
            "--sliding-window",
            "W|none",
            "sliding windows in tokens, 'none' for full attention (default none)",
        ),
        (
            "--attention-chunk-size",
            "C|none",
            "chunked local attention, chunk sizes in tokens (multiples of the block size), "
            "'none' for full attention (default none)",
        ),
        ("--max-batch", "N", "most running sequences at once (default 256)"),
        ("--step-ms", "MS", f"trace milliseconds per decode step (default {DEFAULT_STEP_MS:g})"),
    ]
    for flag, metavar, text in lists:
        p.add_argument(flag, action="append", metavar=metavar, help=text)
    p.add_argument("--limit", metavar="N", help="replay only the first N requests of each trace")
    p.add_argument(
        "--trace-format",
        choices=TRACE_FORMATS,
        default=None,
        help="format of the trace files given by path; 'auto' reads each file's from its first "
        "line (default: auto; the embedded traces are always read in their own)",
    )
    p.add_argument(
        "--max-seq-len", metavar="N", help=f"longest sequence (default {DEFAULT_MAX_SEQ_LEN})"
    )
    p.add_argument("--max-prefill-tokens", metavar="N", help="prompt tokens per admit call")
    add_cost_options(p, parse=False)
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output folder: results.jsonl, results.csv, sweep.png (default sweep-results)",
    )
    p.add_argument("--scheduler", metavar="ADDRESS", help="use a running Dask cluster")
    p.add_argument("--workers", metavar="N", help="local cluster workers (default: one per core)")
    p.add_argument("--no-plot", action="store_true", help="do not write sweep.png")
    return p


def _int(text, flag: str) -> int | None:
    if isinstance(text, str) and text.strip().lower() == "default":
        return None
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: {text!r} is not an integer") from None


def _float(text, flag: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: {text!r} is not a number") from None


def _bool(text, flag: str) -> bool:
    value = _BOOL.get(str(text).strip().lower())
    if value is None:
        raise UsageError(f"{flag}: {text!r} is not on/off")
    return value


def _window(text, flag: str) -> int | None:
    """A window or chunk size in tokens; ``none`` (also ``off``, ``full``) for full attention."""
    if isinstance(text, str) and text.strip().lower() in ("none", "off", "full"):
        return None
    if isinstance(text, bool):  # TOML's true is not a window
        raise UsageError(f"{flag}: {text!r} is not an integer or none")
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: {text!r} is not an integer or none") from None


def _token_limit(text, flag: str) -> int | None:
    """The cost model's prompt tokens per pass; ``none`` for no limit."""
    if isinstance(text, str) and text.strip().lower() == "none":
        return None
    if isinstance(text, bool):  # TOML's true is not a token count
        raise UsageError(f"{flag}: {text!r} is not an integer or none")
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: {text!r} is not an integer or none") from None


def _policy(text, flag: str) -> str:
    name = str(text).strip()
    if ":" not in name:  # a built-in or shipped name; "module:attribute" keeps its case
        name = name.lower()
    if not is_valid_policy(name):
        raise UsageError(
            f"{flag}: {text!r} is not one of {', '.join(SIMULATOR_POLICIES)} nor "
            "'module:attribute' naming a PriorityPolicy"
        )
    return name


def _split(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _traces(values: list[str]) -> list[str]:
    out = []
    for item in values:
        # A file whose name holds a comma is one trace; anything else is a comma list.
        out += [item] if Path(item).is_file() else _split([item])
    return out


def read_grid_file(path: Path) -> dict:
    """Read a TOML grid file into :func:`kvnumba.sim.sweep` keyword arguments.

    Parameters
    ----------
    path : pathlib.Path
        The file.

    Returns
    -------
    dict

    Raises
    ------
    UsageError
        Unreadable, not TOML, or an unknown key.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, from PyPI
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read grid file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not a TOML file ({exc})") from None
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(
            f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}"
        )
    kwargs = {CONFIG_KEYS[k]: v for k, v in data.items()}
    if "blocks" in kwargs:  # "default" stands for the default pool, as on the command line
        b = kwargs["blocks"]
        kwargs["blocks"] = [
            None if x == "default" else x for x in (b if isinstance(b, list) else [b])
        ]
    for key in ("sliding_window", "attention_chunk_size"):  # "none": full attention
        if key in kwargs:
            w = kwargs[key]
            kwargs[key] = [_window(x, key) for x in (w if isinstance(w, list) else [w])]
    if "prefill_tokens_per_step" in kwargs:  # "none": no limit
        kwargs["prefill_tokens_per_step"] = _token_limit(
            kwargs["prefill_tokens_per_step"], "prefill_tokens_per_step"
        )
    if "out" in kwargs:
        kwargs["out"] = Path(kwargs["out"])
    return kwargs


def grid_arguments(args: argparse.Namespace) -> dict:
    """The :func:`kvnumba.sim.sweep` keyword arguments of a command line.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed by :func:`build_parser`.

    Returns
    -------
    dict
        The grid file's keys (if any), overridden by the options given.

    Raises
    ------
    UsageError
        A value that does not parse, or no trace at all.
    """
    kwargs = read_grid_file(args.config) if args.config else {}
    if args.trace:
        kwargs["traces"] = _traces(args.trace)
    conv = [
        ("blocks", "blocks", _int),
        ("block_size", "block_sizes", _int),
        ("prefix_caching", "prefix_caching", _bool),
        ("eviction", "eviction", _policy),
        ("sliding_window", "sliding_window", _window),
        ("attention_chunk_size", "attention_chunk_size", _window),
        ("max_batch", "max_batch", _int),
        ("step_ms", "step_ms", _float),
    ]
    for attr, key, parse in conv:
        values = getattr(args, attr)
        if values:
            flag = "--" + attr.replace("_", "-")
            kwargs[key] = [parse(v, flag) for v in _split(values)]
    for attr, key in (("limit", "limit"), ("max_seq_len", "max_seq_len")):
        if getattr(args, attr) is not None:
            kwargs[key] = _int(getattr(args, attr), "--" + attr.replace("_", "-"))
    if args.trace_format is not None:
        kwargs["trace_format"] = args.trace_format
    if args.max_prefill_tokens is not None:
        kwargs["max_prefill_tokens"] = _int(args.max_prefill_tokens, "--max-prefill-tokens")
    for attr in ("prefill_us_per_token", "decode_us_per_token", "step_overhead_us"):
        if getattr(args, attr) is not None:
            kwargs[attr] = _float(getattr(args, attr), "--" + attr.replace("_", "-"))
    if args.prefill_tokens_per_step is not None:
        kwargs["prefill_tokens_per_step"] = _token_limit(
            args.prefill_tokens_per_step, "--prefill-tokens-per-step"
        )
    if args.workers is not None:
        kwargs["n_workers"] = _int(args.workers, "--workers")
        if kwargs["n_workers"] is None or kwargs["n_workers"] < 1:
            raise UsageError(f"--workers must be >= 1, got {args.workers!r}")
    if args.out is not None:
        kwargs["out"] = args.out
    if args.scheduler is not None:
        kwargs["scheduler"] = args.scheduler
    if "traces" not in kwargs:
        raise UsageError("empty grid: no trace (give --trace NAME or traces in a grid file)")
    kwargs.setdefault("out", Path("sweep-results"))
    return kwargs


def _unreachable(row: dict) -> str:
    # Rows of older sweeps and of traces without hash_ids have no census.
    mean = row.get("unreachable_cached_mean")
    return "n/a" if mean is None else f"{mean:,.1f}"


def _attention(row: dict) -> str:
    # Rows of older sweeps have no window columns: full attention.
    if row.get("sliding_window") is not None:
        return f"sw {row['sliding_window']}"
    if row.get("attention_chunk_size") is not None:
        return f"chunk {row['attention_chunk_size']}"
    return "full"


def _computed(row: dict) -> str:
    # Rows of older sweeps have no cost model fields.
    value = row.get("prefill_tokens_computed")
    if value is None:
        return "n/a"
    return f"{value / 1e6:,.2f}M" if value >= 1_000_000 else f"{value:,}"


def _p50_p99(row: dict, name: str) -> str:
    values = [row.get(f"{name}_p50_ms"), row.get(f"{name}_p99_ms")]
    if all(v is None for v in values):
        return "n/a"
    return "/".join("n/a" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}" for v in values)


def format_rows(rows: list[dict]) -> str:
    """A compact table of sweep rows: config, hit rates, modeled cost, preemptions, peak
    blocks, time.

    ``unreachable`` is the mean count of cached blocks no prompt could hit (see
    :mod:`kvnumba.sim.unreachable`; ``n/a`` for a windowed run). ``window`` is the attention
    kind: ``full``, ``sw W`` (sliding window of ``W`` tokens) or ``chunk C``. ``computed`` is
    the prompt tokens computed (not served from the cache, recomputes included), ``ttft ms``
    and ``tpot ms`` the modeled p50/p99 under the rows' cost profile (:mod:`kvnumba.sim.cost`);
    ``n/a`` for rows of a sweep made before the cost model.

    Parameters
    ----------
    rows : list of dict
        Sweep rows.

    Returns
    -------
    str
    """
    head = ["trace", "blocks", "bs", "caching", "eviction", "window", "batch", "step", "hit"]
    head += ["ideal"]
    head += ["computed", "ttft ms", "tpot ms"]
    head += ["preempt"]
    head += ["rejected", "peak used", "evictions", "unreachable", "replay s"]
    table = [head]
    for r in rows:
        ideal = r["ideal_prefix_hit_rate"]
        table.append(
            [
                Path(str(r["trace"])).name,
                f"{r['blocks']:,}",
                str(r["block_size"]),
                "on" if r["prefix_caching"] else "off",
                r.get("eviction") or "lru",
                _attention(r),
                str(r["max_batch"]),
                f"{r['step_ms']:g}",
                f"{r['prefix_hit_rate']:.1%}",
                "n/a" if ideal is None else f"{ideal:.1%}",
                _computed(r),
                _p50_p99(r, "ttft"),
                _p50_p99(r, "tpot"),
                f"{r['preemptions']:,}",
                f"{r['rejected']:,}",
                f"{r['peak_blocks_used']:,}",
                f"{r['evictions']:,}",
                _unreachable(r),
                f"{r['replay_s']:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    return "\n".join(lines)


def _rows_on_disk(out: Path) -> int:
    from kvnumba.sim.sweeps import RESULTS_JSONL

    try:
        with (out / RESULTS_JSONL).open("rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``kvnumba sweep``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after ``sweep``; ``sys.argv[2:]`` by default.

    Returns
    -------
    int
        0, 1 (some simulations failed), 2 (usage or grid error) or 130 (interrupted).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    except SystemExit as exc:  # argparse already printed usage (or --help)
        return int(exc.code or 0)
    try:
        kwargs = grid_arguments(args)
    except UsageError as exc:
        print(f"kvnumba sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out: Path = kwargs["out"]
    from kvnumba.sim.sweeps import GridError, sweep

    try:
        result = sweep(**kwargs)
    except GridError as exc:
        print(f"kvnumba sweep: bad grid: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # an output folder holding something else
        print(f"kvnumba sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        print(f"kvnumba sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # the output folder, or the scheduler address
        print(f"kvnumba sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BaseException as exc:  # Ctrl-C, possibly wrapped by numba (see `interrupted`)
        if not interrupted(exc):
            raise
        print(
            f"kvnumba sweep: interrupted; {_rows_on_disk(out)} rows kept in "
            f"{out / 'results.jsonl'}; run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED

    if result.rows:
        print(format_rows(result.rows))
        from kvnumba.sim.cost import COST_FIELDS, CostModel
        from kvnumba.sim.report import cost_label

        profiles = {
            tuple(r[c] for c in COST_FIELDS)
            for r in result.rows
            if all(c in r for c in COST_FIELDS)
        }
        if len(profiles) == 1:
            print(f"modeled ttft and tpot: {cost_label(CostModel(*profiles.pop()))}")
        if len({r.get("eviction") or "lru" for r in result.rows}) > 1:
            from kvnumba.sim.report import format_policy_table, policy_table

            print("\nhit rate of first admissions per eviction policy (gap closed: the share")
            print("of the gap between lru and the ideal, unbounded pool, that a policy closes)")
            table = policy_table(result.rows)
            print(format_policy_table(table))
            print("\nprompt tokens computed (millions) per eviction policy")
            print(format_policy_table(table, "tokens_computed"))
            print("\nmodeled time to first token, p99 (seconds) per eviction policy")
            print(format_policy_table(table, "ttft_p99_ms"))
    ran = f"ran {result.ran} simulation{'s' if result.ran != 1 else ''}"
    if result.ran:
        ran += f" on {result.workers} worker{'s' if result.workers != 1 else ''}"
    print(
        f"\n{ran} in {result.elapsed_s:.1f} s; {result.skipped} already in {out / 'results.jsonl'}"
    )
    print(f"results: {out / 'results.jsonl'}, {out / 'results.csv'}")
    if result.rows and not args.no_plot:
        try:
            from kvnumba.sim.report import plot_sweep

            plot_sweep(result.rows, out / "sweep.png")
            print(f"plot: {out / 'sweep.png'}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install 'kvnumba[sweep]')")
    for point, error in result.failed:
        print(f"kvnumba sweep: failed: {point.key}: {error}", file=sys.stderr)
    return EXIT_FAILED if result.failed else 0
