"""``kvnumba simulate``: replay a serving trace through the block manager and report.

Exit codes: 0 success; 2 usage error, unreadable or malformed trace, unwritable plot; 130
interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from kvnumba.eviction import SIMULATOR_POLICIES, is_valid_policy, needs_future
from kvnumba.sim._progress import progress_bar
from kvnumba.sim.cost import DEFAULT_COST, CostModel
from kvnumba.sim.report import (
    attention_label,
    cost_label,
    eviction_hint,
    result_fields,
    save_timeline,
    timeline_title,
    window_comparison,
)
from kvnumba.sim.scheduler import (
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_POOL_TOKENS,
    DEFAULT_STEP_MS,
    SimConfig,
    Simulator,
    full_attention,
    reference_manager_factory,
)
from kvnumba.sim.traces import TRACE_FORMATS, default_trace_path, detect_format, load_trace

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

EPILOG = """\
The default trace is the Mooncake synthetic trace (Qin et al., FAST'25; Apache-2.0) shipped in
kvnumba/data with the Azure LLM inference trace (Patel et al., ISCA'24; CC-BY-4.0; use
--trace azure); see kvnumba/data/README.md for attribution. --trace also reads the other
Mooncake traces, the Azure LLM inference traces 2023 and 2024 and BurstGPT files (format read
from the first line; kvnumba/data/README.md lists them)."""


#: Short names for the traces shipped in ``kvnumba/data`` (``--trace azure``).
EMBEDDED = {
    "mooncake": default_trace_path(),
    "azure": default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"),
}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    # float() accepts "inf" and "nan"; neither is a step length.
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _eviction_policy(text: str) -> str:
    if not is_valid_policy(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(SIMULATOR_POLICIES)} nor 'module:attribute' "
            "naming a PriorityPolicy"
        )
    return text


def _token_limit(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    return _positive(text)


def add_cost_options(p: argparse.ArgumentParser, parse: bool = True) -> None:
    """Add the cost model's options (:mod:`kvnumba.sim.cost`) to a parser, in their own group.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser of ``kvnumba simulate`` or ``kvnumba sweep``.
    parse : bool
        Give each option its type and its :data:`kvnumba.sim.cost.DEFAULT_COST` default (the
        simulate command); ``False`` leaves them strings defaulting to ``None`` (the sweep
        command parses them itself, after its grid file).
    """
    d = DEFAULT_COST
    group = p.add_argument_group(
        "cost model",
        "what a step costs, to model TTFT and TPOT (the schedule does not change); the "
        "defaults are an assumption, a dense 8B model on one H100 (docs/eviction.md, 'What a "
        "hit is worth')",
    )
    options = [
        (
            "--prefill-us-per-token",
            "US",
            _non_negative_float,
            d.prefill_us_per_token,
            "microseconds per prompt token computed (not served from the cache)",
        ),
        (
            "--decode-us-per-token",
            "US",
            _non_negative_float,
            d.decode_us_per_token,
            "microseconds per token decoded (one per running sequence a step)",
        ),
        (
            "--step-overhead-us",
            "US",
            _non_negative_float,
            d.step_overhead_us,
            "microseconds per forward pass, whatever its size",
        ),
        (
            "--prefill-tokens-per-step",
            "N|none",
            _token_limit,
            d.prefill_tokens_per_step,
            "most prompt tokens one pass computes; a step with more runs ceil(tokens / N) "
            "passes; 'none' for no limit",
        ),
    ]
    for flag, metavar, kind, default, text in options:
        shown = "none" if default is None else f"{default:g}"
        # Without parsing (a sweep's flags), the raw text is kept and no default is filled in.
        parsing = {"type": kind, "default": default} if parse else {"default": None}
        group.add_argument(flag, metavar=metavar, help=f"{text} (default: {shown})", **parsing)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvnumba simulate``."""
    p = argparse.ArgumentParser(
        prog="kvnumba simulate",
        description="Continuous-batching replay of an LLM request trace through the block "
        "manager: admit with prefix reuse, one decode token per running sequence per step, "
        "preempt the newest sequence when the pool runs out.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="PATH",
        help="trace file: Mooncake JSONL (hash_ids), Azure LLM inference CSV (2023, 2024) or "
        "BurstGPT CSV, or 'mooncake' / 'azure' for the embedded copies; default: mooncake",
    )
    p.add_argument(
        "--trace-format",
        choices=TRACE_FORMATS,
        default="auto",
        help="format of --trace; 'auto' reads it from the file's first line (a JSON object or "
        "a CSV header), whatever the suffix (default: auto)",
    )
    p.add_argument(
        "--blocks",
        type=_positive,
        default=None,
        metavar="N",
        help=f"blocks in the pool (default: {DEFAULT_POOL_TOKENS} tokens / block size)",
    )
    p.add_argument(
        "--block-size",
        type=_positive,
        default=16,
        metavar="N",
        help="tokens per block (default: 16)",
    )
    p.add_argument(
        "--max-batch",
        type=_positive,
        default=256,
        metavar="N",
        help="most running sequences at once (default: 256)",
    )
    p.add_argument(
        "--max-seq-len",
        type=_positive,
        default=DEFAULT_MAX_SEQ_LEN,
        metavar="N",
        help=f"longest sequence; longer requests are rejected (default: {DEFAULT_MAX_SEQ_LEN})",
    )
    p.add_argument(
        "--step-ms",
        type=_positive_float,
        default=DEFAULT_STEP_MS,
        metavar="MS",
        help=f"trace milliseconds per decode step (default: {DEFAULT_STEP_MS:g})",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=_positive,
        default=None,
        metavar="N",
        help="prompt tokens offered to one admit call (default: no cap)",
    )
    p.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    p.add_argument(
        "--eviction",
        type=_eviction_policy,
        default="lru",
        metavar="POLICY",
        help=f"eviction policy: {', '.join(SIMULATOR_POLICIES)}, or 'module:attribute' naming a "
        "PriorityPolicy of your own; 'oracle' uses the future of the trace (needs hash_ids) as "
        "a reference point; see docs/eviction.md (default: lru)",
    )
    window = p.add_mutually_exclusive_group()
    window.add_argument(
        "--sliding-window",
        type=_positive,
        default=None,
        metavar="W",
        help="sliding-window attention of W tokens (Gemma, gpt-oss, Mistral local layers): "
        "blocks leave a sequence as it decodes past them, a prompt's hit needs only its last "
        "window; the report sets the same run without the window beside it (docs/windows.md)",
    )
    window.add_argument(
        "--attention-chunk-size",
        type=_positive,
        default=None,
        metavar="C",
        help="chunked local attention, chunks of C tokens (a multiple of the block size; Llama "
        "4 local layers): a prompt's tokens below its last chunk count as cached (never read); "
        "the report sets the same run without chunks beside it",
    )
    p.add_argument(
        "--limit",
        type=_positive,
        default=None,
        metavar="N",
        help="replay only the first N requests",
    )
    add_cost_options(p)
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="save a plot of blocks used and cached against trace time (and the modeled TTFT "
        "and TPOT)",
    )
    p.add_argument(
        "--log-y",
        action="store_true",
        help="logarithmic block axis in --plot (a few used blocks stay visible in a huge pool)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--reference",
        action="store_true",
        help="use the pure-Python reference manager (slow; for cross-checking)",
    )
    return p


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_report(summary: dict, header: list[tuple[str, str]]) -> str:
    """Human-readable table of a run.

    Parameters
    ----------
    summary : dict
        The ``results`` of ``kvnumba simulate --json``
        (:func:`kvnumba.sim.report.result_fields` plus ``wall_s``).
    header : list of (str, str)
        Rows printed first (trace and pool description).

    Returns
    -------
    str
        Two aligned columns, one metric a line.
    """
    s = summary
    ideal = s["ideal_prefix_hit_rate"]
    unreachable = s.get("unreachable_cached_final")
    if unreachable is None:
        unreachable_text = (
            "n/a (the trace has no hash_ids, the manager's blocks are unread, or the run is "
            "windowed)"
        )
    else:
        fractions = [s["unreachable_fraction_mean"], s["unreachable_fraction_final"]]
        unreachable_text = (
            f"{s['unreachable_cached_mean']:,.1f} / {unreachable:,} ("
            + " / ".join("n/a" if f is None else f"{f:.1%}" for f in fractions)
            + " of cached blocks)"
        )
    computed = s.get("prefill_tokens_computed")
    admitted = s["first_admit_prompt_tokens"] + s["recompute_tokens"]

    def p50_p99(name: str) -> str:
        values = [s.get(f"{name}_p50_ms"), s.get(f"{name}_p99_ms")]
        return " / ".join("n/a" if v is None else f"{v:,.1f}" for v in values) + " ms"

    rows = header + [
        ("requests served", f"{s['served']:,} of {s['requests']:,}"),
        ("rejected (longer than max_seq_len or pool)", f"{s['rejected']:,}"),
        (
            "prefix hit rate, first admissions",
            f"{s['prefix_hit_rate']:.1%} ({s['first_admit_cached_tokens']:,} of "
            f"{s['first_admit_prompt_tokens']:,} prompt tokens)",
        ),
        (
            "ideal hit rate (unbounded pool)",
            "n/a (the trace has no hash_ids)" if ideal is None else f"{ideal:.1%}",
        ),
        (
            "recompute after preemption",
            f"{s['recompute_tokens']:,} tokens, {s['recompute_cached_tokens']:,} from cache "
            f"(hit rate incl. recompute {s['prefix_hit_rate_incl_recompute']:.1%})",
        ),
        (
            "prompt tokens computed (not cached)",
            "n/a"
            if computed is None
            else f"{computed:,} of {admitted:,} admitted, recomputes included",
        ),
        ("modeled TTFT, p50 / p99", p50_p99("ttft")),
        ("modeled TPOT, p50 / p99", p50_p99("tpot")),
        ("decode steps simulated", f"{s['steps']:,}"),
        ("blocks used, peak / mean", f"{s['peak_blocks_used']:,} / {s['mean_blocks_used']:,.0f}"),
        (
            "blocks cached, peak / mean",
            f"{s['peak_blocks_cached']:,} / {s['mean_blocks_cached']:,.0f}",
        ),
        ("unreachable cached blocks, mean / final", unreachable_text),
        ("evictions", f"{s['evictions']:,}"),
        ("preemptions", f"{s['preemptions']:,}"),
        ("COW copies", f"{s['cow_copies']:,}"),
        (
            "allocator time per step, median / mean",
            f"{s['alloc_us_per_step_median']:.1f} us / {s['alloc_us_per_step_mean']:.1f} us",
        ),
        ("wall time, whole command / replay", f"{s['wall_s']:.1f} s / {s['replay_s']:.1f} s"),
    ]
    return _table(rows)


def format_window_comparison(comparison: dict) -> str:
    """Text table of :func:`kvnumba.sim.report.window_comparison`: window, full, ratio.

    Parameters
    ----------
    comparison : dict
        The ``window_vs_full`` of ``kvnumba simulate --sliding-window W --json``.

    Returns
    -------
    str
        A heading line, then one line per metric.
    """
    labels = {
        "peak_blocks_used": "blocks used, peak",
        "mean_blocks_used": "blocks used, mean",
        "peak_blocks_cached": "blocks cached, peak",
        "mean_blocks_cached": "blocks cached, mean",
        "prefix_hit_rate": "prefix hit rate, first admissions",
        "first_admit_cached_tokens": "cached prompt tokens, first admissions",
        "preemptions": "preemptions",
        "evictions": "evictions",
    }

    def value(name: str, v) -> str:
        if name == "prefix_hit_rate":
            return f"{v:.1%}"
        return f"{v:,.0f}" if name.startswith("mean") else f"{v:,}"

    lines = [("", "window", "full attention", "window / full")]
    for name, entry in comparison.items():
        ratio = entry["ratio"]
        lines.append(
            (
                labels.get(name, name),
                value(name, entry["window"]),
                value(name, entry["full"]),
                "n/a" if ratio is None else f"{ratio:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    table = "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )
    return "the same trace without the window (full attention):\n" + table


def main(argv: list[str] | None = None) -> int:
    """Run ``kvnumba simulate``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after ``simulate``; ``sys.argv[2:]`` by default.

    Returns
    -------
    int
        0 on success, 2 on a usage, trace-file or plot-file error, 130 when interrupted.
    """
    t_start = time.perf_counter()  # wall_s covers the whole command, not only the replay
    try:
        return _main(sys.argv[2:] if argv is None else argv, t_start)
    except BaseException as exc:
        if not interrupted(exc):
            raise
        # One line, no traceback: Ctrl-C is how a user stops a long replay, not a crash.
        print("kvnumba simulate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def interrupted(exc: BaseException | None) -> bool:
    """Whether an exception is Ctrl-C, possibly wrapped by the code it interrupted.

    A SIGINT that arrives while a numba kernel is calling back into Python raises
    ``KeyboardInterrupt`` inside that call, and numba reports it as a ``SystemError`` whose
    cause is the ``KeyboardInterrupt``; so the cause chain is searched, not only the type.

    Parameters
    ----------
    exc : BaseException
        The exception that ended the command.

    Returns
    -------
    bool
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _main(argv: list[str], t_start: float) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage (or --help)
        return int(exc.code or 0)

    trace_path = EMBEDDED.get(str(args.trace), args.trace) if args.trace else default_trace_path()
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        print(f"kvnumba simulate: --plot must name a .png file, got {args.plot}", file=sys.stderr)
        return 2
    try:
        trace_format = args.trace_format
        if trace_format == "auto":
            trace_format = detect_format(trace_path)
        requests = load_trace(trace_path, limit=args.limit, fmt=trace_format)
    except (OSError, ValueError) as exc:
        print(f"kvnumba simulate: cannot read trace: {exc}", file=sys.stderr)
        return 2
    if not requests:
        print(f"kvnumba simulate: {trace_path}: no requests", file=sys.stderr)
        return 2
    if needs_future(args.eviction) and any(r.hash_ids is None for r in requests):
        print(
            f"kvnumba simulate: --eviction {args.eviction} needs a trace with hash_ids "
            f"(a Mooncake trace) to know when each block is used again; {trace_path} has none",
            file=sys.stderr,
        )
        return 2

    config = SimConfig(
        num_blocks=args.blocks,
        block_size=args.block_size,
        max_batch=args.max_batch,
        max_seq_len=args.max_seq_len,
        prefix_caching=not args.no_prefix_caching,
        step_ms=args.step_ms,
        max_prefill_tokens=args.max_prefill_tokens,
        eviction=args.eviction,
        sliding_window=args.sliding_window,
        attention_chunk_size=args.attention_chunk_size,
        cost=CostModel(
            prefill_us_per_token=args.prefill_us_per_token,
            decode_us_per_token=args.decode_us_per_token,
            step_overhead_us=args.step_overhead_us,
            prefill_tokens_per_step=args.prefill_tokens_per_step,
        ),
    )
    # A windowed run is replayed a second time without its window, for the comparison
    # (what kvnumba.sim.scheduler.compare_window does; built here apart from the runs, so
    # that only a bad config is reported as one).
    configs = [config, full_attention(config)] if config.windowed else [config]
    if not args.reference:
        from kvnumba.kernels import PLAIN, POLICY, prepare

        # Says so if it must compile, before the progress bar; a policy other than LRU or a
        # window runs the kernels' extended versions (the full-attention run the plain ones).
        policy = config.eviction != "lru"
        prepare(POLICY if policy else PLAIN, stream=sys.stderr, policy=policy)
        if config.windowed and not policy:
            prepare(POLICY, stream=sys.stderr, policy=True)
    with progress_bar(len(configs) * len(requests), "req", "simulate") as bar:
        try:
            factory = reference_manager_factory if args.reference else None
            sims = [Simulator(requests, config, factory, progress=bar.update)]
            sims += [
                Simulator(requests, c, factory, progress=bar.update, keys=sims[0].keys)
                for c in configs[1:]
            ]
        except (ValueError, TypeError) as exc:  # InvalidGeometry is a ValueError
            print(f"kvnumba simulate: invalid pool: {exc}", file=sys.stderr)
            return 2
        results = [sim.run() for sim in sims]

    sim, result = sims[0], results[0]
    summary = result_fields(result, requests, config, sim.keys)
    full = None
    if len(results) > 1:
        full = result_fields(results[1], requests, configs[1], sim.keys)
    setup = {
        "trace": str(trace_path),
        "trace_format": trace_format,
        "limit": args.limit,
        "blocks": config.blocks,
        "block_size": config.block_size,
        "max_batch": config.max_batch,
        "max_seq_len": config.max_seq_len,
        "step_ms": config.step_ms,
        "prefix_caching": config.prefix_caching,
        "max_prefill_tokens": config.max_prefill_tokens,
        "eviction": config.eviction,
        "sliding_window": config.sliding_window,
        "attention_chunk_size": config.attention_chunk_size,
        **config.cost.fields(),
        "manager": "reference" if args.reference else "BlockManager",
    }
    if args.plot is not None:
        try:
            save_timeline(
                result,
                config.blocks,
                args.plot,
                timeline_title(Path(trace_path).name, config),
                log_y=args.log_y,
            )
        except OSError as exc:
            print(f"kvnumba simulate: cannot write plot: {exc}", file=sys.stderr)
            return 2
        except ImportError:
            print(
                "kvnumba simulate: --plot needs matplotlib: pip install 'kvnumba[sim]'",
                file=sys.stderr,
            )
            return 2
    summary["wall_s"] = round(time.perf_counter() - t_start, 2)
    doc = {"config": setup, "results": summary}
    if full is not None:
        # The full-attention run's replay is its own; the command's wall time covers both.
        doc["full_attention"] = full
        doc["window_vs_full"] = window_comparison(summary, full)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    header = [
        (
            "trace",
            f"{Path(trace_path).name} ({len(requests):,} requests"
            + (f", first {args.limit:,})" if args.limit else ")"),
        ),
        (
            "pool",
            f"{config.blocks:,} blocks, block size {config.block_size} tokens, max batch "
            f"{config.max_batch}, step {config.step_ms:g} ms, prefix caching "
            + ("on" if config.prefix_caching else "off"),
        ),
        ("eviction policy", config.eviction),
        ("attention", attention_label(config)),
        ("cost profile", cost_label(config.cost)),
    ]
    print(format_report(summary, header))
    hint = eviction_hint(summary, config.prefix_caching)
    if hint:
        print(hint)
    if full is not None:
        print()
        print(format_window_comparison(doc["window_vs_full"]))
    if args.plot is not None:
        print(f"plot written to {args.plot}")
    return 0
