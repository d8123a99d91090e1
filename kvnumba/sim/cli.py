"""``kvnumba simulate``: replay a serving trace through the block manager and report.

Exit codes: 0 success; 2 usage error, unreadable or malformed trace, unwritable plot.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvnumba.sim.scheduler import (
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_POOL_TOKENS,
    DEFAULT_STEP_MS,
    SimConfig,
    SimResult,
    Simulator,
    reference_manager_factory,
)
from kvnumba.sim.traces import default_trace_path, load_trace

EPILOG = """\
The default trace is the Mooncake synthetic trace (Qin et al., FAST'25; Apache-2.0) shipped in
kvnumba/data with the Azure LLM inference trace (Patel et al., ISCA'24; CC-BY-4.0; use
--trace azure); see kvnumba/data/README.md for attribution."""


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
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


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
        help="trace file: .jsonl (Mooncake, hash_ids) or .csv (Azure), or 'mooncake' / "
        "'azure' for the embedded copies; default: mooncake",
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
        "--limit",
        type=_positive,
        default=None,
        metavar="N",
        help="replay only the first N requests",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="save a plot of blocks used/cached over the steps",
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
        :meth:`kvnumba.sim.SimResult.summary` of the run.
    header : list of (str, str)
        Rows printed first (trace and pool description).

    Returns
    -------
    str
        Two aligned columns, one metric a line.
    """
    s = summary
    rows = header + [
        ("requests served", f"{s['served']:,} of {s['requests']:,}"),
        ("rejected (longer than max_seq_len or pool)", f"{s['rejected']:,}"),
        (
            "prefix hit rate (tokens)",
            f"{s['prefix_hit_rate_tokens']:.1%} ({s['cached_prompt_tokens']:,} of "
            f"{s['admitted_prompt_tokens']:,} prompt tokens)",
        ),
        ("decode steps simulated", f"{s['steps']:,}"),
        ("blocks used, peak / mean", f"{s['peak_blocks_used']:,} / {s['mean_blocks_used']:,.0f}"),
        (
            "blocks cached, peak / mean",
            f"{s['peak_blocks_cached']:,} / {s['mean_blocks_cached']:,.0f}",
        ),
        ("evictions", f"{s['evictions']:,}"),
        ("preemptions", f"{s['preemptions']:,}"),
        ("COW copies", f"{s['cow_copies']:,}"),
        (
            "allocator time per step, median / mean",
            f"{s['alloc_us_per_step_median']:.1f} us / {s['alloc_us_per_step_mean']:.1f} us",
        ),
        ("wall time", f"{s['wall_s']:.1f} s"),
    ]
    return _table(rows)


def save_plot(result: SimResult, num_blocks: int, path: Path, title: str) -> None:
    """Plot blocks used and cached against the decode step (Agg backend, no display needed).

    Parameters
    ----------
    result : SimResult
        The run to plot.
    num_blocks : int
        Pool size, drawn as a dashed line.
    path : pathlib.Path
        Output ``.png`` file.
    title : str
        Figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    ax.stackplot(
        result.steps,
        result.used,
        result.cached,
        labels=["used", "cached"],
        colors=["tab:blue", "tab:orange"],
        alpha=0.8,
        step="post",
    )
    ax.axhline(num_blocks, color="k", lw=0.8, ls="--", label="pool size")
    ax.set_xlabel("decode step")
    ax.set_ylabel("blocks")
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


class _NoBar:
    """Stands in for tqdm when it is not installed (it comes with the ``sim`` extra)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        """Ignore progress."""


def _progress_bar(total: int):
    """A tqdm bar on stderr, shown only when stderr is a terminal (logs and pipes stay clean)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="req", file=sys.stderr, disable=None, desc="simulate")


def main(argv: list[str] | None = None) -> int:
    """Run ``kvnumba simulate``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after ``simulate``; ``sys.argv[2:]`` by default.

    Returns
    -------
    int
        0 on success, 2 on a usage, trace-file or plot-file error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    except SystemExit as exc:  # argparse already printed usage (or --help)
        return int(exc.code or 0)

    trace_path = EMBEDDED.get(str(args.trace), args.trace) if args.trace else default_trace_path()
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        print(f"kvnumba simulate: --plot must name a .png file, got {args.plot}", file=sys.stderr)
        return 2
    try:
        requests = load_trace(trace_path, limit=args.limit)
    except (OSError, ValueError) as exc:
        print(f"kvnumba simulate: cannot read trace: {exc}", file=sys.stderr)
        return 2
    if not requests:
        print(f"kvnumba simulate: {trace_path}: no requests", file=sys.stderr)
        return 2

    config = SimConfig(
        num_blocks=args.blocks,
        block_size=args.block_size,
        max_batch=args.max_batch,
        max_seq_len=args.max_seq_len,
        prefix_caching=not args.no_prefix_caching,
        step_ms=args.step_ms,
        max_prefill_tokens=args.max_prefill_tokens,
    )
    with _progress_bar(len(requests)) as bar:
        try:
            factory = reference_manager_factory if args.reference else None
            sim = Simulator(requests, config, factory, progress=bar.update)
        except (ValueError, TypeError) as exc:  # InvalidGeometry is a ValueError
            print(f"kvnumba simulate: invalid pool: {exc}", file=sys.stderr)
            return 2
        result = sim.run()

    summary = result.summary()
    setup = {
        "trace": str(trace_path),
        "limit": args.limit,
        "blocks": config.blocks,
        "block_size": config.block_size,
        "max_batch": config.max_batch,
        "max_seq_len": config.max_seq_len,
        "step_ms": config.step_ms,
        "prefix_caching": config.prefix_caching,
        "manager": "reference" if args.reference else "BlockManager",
    }
    if args.plot is not None:
        try:
            save_plot(
                result,
                config.blocks,
                args.plot,
                f"{Path(trace_path).name}: {config.blocks:,} blocks of {config.block_size}",
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
    if args.json:
        print(json.dumps({"config": setup, "results": summary}, indent=2))
    else:
        header = [
            (
                "trace",
                f"{Path(trace_path).name} ({len(requests):,} requests"
                + (f", first {args.limit:,})" if args.limit else ")"),
            ),
            (
                "pool",
                f"{config.blocks:,} blocks x {config.block_size} tokens, max batch "
                f"{config.max_batch}, step {config.step_ms:g} ms, prefix caching "
                + ("on" if config.prefix_caching else "off"),
            ),
        ]
        print(format_report(summary, header))
        if args.plot is not None:
            print(f"plot written to {args.plot}")
    return 0
