"""What a simulation reports: the result row, the ideal hit rate beside it, the hint, the plots.

Shared by ``kvnumba simulate`` (one run) and ``kvnumba sweep`` (one row per run), so that a
sweep row has exactly the fields of ``kvnumba simulate --json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvnumba.sim.ideal import BlockKeys, block_keys, ideal_prefix_hits
from kvnumba.sim.scheduler import SimConfig, SimResult
from kvnumba.sim.traces import Request

#: A gap to the ideal hit rate smaller than this (absolute) gets no hint.
HINT_MIN_GAP = 0.01


def ideal_fields(
    result: SimResult,
    requests: Sequence[Request],
    config: SimConfig,
    keys: BlockKeys | None = None,
) -> dict:
    """The ideal hit rate of the trace and of this run's own admissions.

    Parameters
    ----------
    result : SimResult
        The run.
    requests : sequence of Request
        The requests it replayed.
    config : SimConfig
        Its configuration (block size, ``max_seq_len``, prefix caching).
    keys : BlockKeys, optional
        :func:`kvnumba.sim.ideal.block_keys` of ``requests`` at ``config.block_size``, when the
        caller already has them (a sweep reuses them across pool sizes).

    Returns
    -------
    dict
        ``ideal_prefix_hit_rate``: an unbounded pool admitting every request that fits
        ``max_seq_len`` in arrival order; ``prefix_hit_rate_if_no_evictions``: the same
        admissions as this run, in its order, had nothing been evicted, so that its difference
        from ``prefix_hit_rate`` is exactly the hits evictions cost. Both ``None`` for a trace
        without ``hash_ids``; the second also ``None`` without prefix caching.
    """
    if keys is None:
        keys = block_keys(requests, config.block_size)
    if keys is None:
        return {"ideal_prefix_hit_rate": None, "prefix_hit_rate_if_no_evictions": None}
    arrival = [r.arrival_ms for r in requests]
    order = sorted(range(len(requests)), key=arrival.__getitem__)  # stable, like the queue
    fits = [
        i for i in order if requests[i].prompt_len + requests[i].output_len <= config.max_seq_len
    ]
    ideal = ideal_prefix_hits(keys, fits).rate
    same = ideal_prefix_hits(keys, result.admit_order).rate if config.prefix_caching else None
    return {
        "ideal_prefix_hit_rate": round(ideal, 4),
        "prefix_hit_rate_if_no_evictions": None if same is None else round(same, 4),
    }


def result_fields(
    result: SimResult,
    requests: Sequence[Request],
    config: SimConfig,
    keys: BlockKeys | None = None,
) -> dict:
    """The ``results`` of ``kvnumba simulate --json``, without the command's wall time.

    Parameters
    ----------
    result, requests, config, keys
        As for :func:`ideal_fields`.

    Returns
    -------
    dict
        :meth:`SimResult.summary` with the :func:`ideal_fields` after the hit rates.
    """
    summary = result.summary()
    out = {}
    for name, value in summary.items():
        out[name] = value
        if name == "prefix_hit_rate_incl_recompute":
            out.update(ideal_fields(result, requests, config, keys))
    return out


def eviction_hint(results: dict, prefix_caching: bool = True) -> str | None:
    """One line telling the user that evictions cost most of the gap to the ideal hit rate.

    Parameters
    ----------
    results : dict
        :func:`result_fields` of a run.
    prefix_caching : bool
        Whether the run cached prefixes (without, there is nothing to hint).

    Returns
    -------
    str or None
        The hint, or ``None`` when the gap is small, not mostly evictions, or unknown.
    """
    ideal = results.get("ideal_prefix_hit_rate")
    same = results.get("prefix_hit_rate_if_no_evictions")
    if not prefix_caching or ideal is None or same is None:
        return None
    sim = results["prefix_hit_rate"]
    gap, lost = ideal - sim, same - sim
    if gap < HINT_MIN_GAP or lost < 0.5 * gap:
        return None
    return (
        f"hint: evictions cost {lost * 100:.1f} of the {gap * 100:.1f} points between the "
        f"simulated and the ideal hit rate: the pool is too small to keep the shared prefixes "
        "cached (try a larger --blocks)"
    )


def save_timeline(
    result: SimResult,
    num_blocks: int,
    path: str | Path | None,
    title: str,
    log_y: bool = False,
):
    """Plot blocks used and cached against trace time (Agg backend, no display needed).

    Parameters
    ----------
    result : SimResult
        The run to plot.
    num_blocks : int
        Pool size, drawn as a dashed line.
    path : str or pathlib.Path or None
        Output ``.png`` file; ``None`` returns the figure without saving it.
    title : str
        Figure title.
    log_y : bool
        Logarithmic block axis, so that a few used blocks stay visible under a huge pool.

    Returns
    -------
    matplotlib.figure.Figure or None
        The figure when ``path`` is ``None``, else ``None``.
    """
    # The object-oriented API, without pyplot: no backend to choose, no global figure state
    # to clean up, and the figure displays in a notebook all the same.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=110)
    ax = fig.subplots()
    t = result.time_s
    ax.stackplot(
        t,
        result.used,
        result.cached,
        labels=["used (referenced)", "cached (reusable)"],
        colors=["tab:blue", "tab:orange"],
        alpha=0.8,
        step="post",
    )
    ax.axhline(num_blocks, color="k", lw=0.8, ls="--", label="pool size")
    if log_y:
        ax.set_yscale("log")
        ax.set_ylim(bottom=0.8, top=num_blocks * 1.5)
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("blocks" + (" (log scale)" if log_y else ""))
    ax.set_title(title)
    # Outside the axes, so that it never hides data.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if path is None:
        return fig
    fig.savefig(path, bbox_inches="tight")
    return None


def timeline_title(trace_name: str, config: SimConfig) -> str:
    """The title of :func:`save_timeline` for a run: trace, pool and block size with units."""
    return (
        f"{trace_name}: {config.blocks:,} blocks, block size {config.block_size} tokens, "
        f"prefix caching {'on' if config.prefix_caching else 'off'}"
    )
