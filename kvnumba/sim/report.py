"""What a simulation reports: the result row, the ideal hit rate beside it, the hint, the plots.

Shared by ``kvnumba simulate`` (one run) and ``kvnumba sweep`` (one row per run), so that a
sweep row has exactly the fields of ``kvnumba simulate --json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvnumba.eviction import HINDSIGHT_POLICIES, SIMULATOR_POLICIES
from kvnumba.sim.cost import COST_FIELDS, DEFAULT_COST, CostModel
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
        Its configuration (block size, ``max_seq_len``, prefix caching, attention kind).
    keys : BlockKeys, optional
        :func:`kvnumba.sim.ideal.block_keys` of ``requests`` at ``config.block_size``, when the
        caller already has them (a sweep reuses them across pool sizes).

    Returns
    -------
    dict
        ``ideal_prefix_hit_rate``: an unbounded pool admitting every request that fits
        ``max_seq_len`` in arrival order; ``prefix_hit_rate_if_no_evictions``: the same
        admissions as this run, in its order, had nothing been evicted, so that its difference
        from ``prefix_hit_rate`` is exactly the hits evictions cost. Both under the run's
        attention kind (:func:`kvnumba.sim.ideal.ideal_prefix_hits`). Both ``None`` for a trace
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
    kind = {
        "sliding_window": config.sliding_window,
        "attention_chunk_size": config.attention_chunk_size,
    }
    ideal = ideal_prefix_hits(keys, fits, **kind).rate
    same = (
        ideal_prefix_hits(keys, result.admit_order, **kind).rate if config.prefix_caching else None
    )
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


#: What :func:`window_comparison` sets side by side: memory, prefix reuse, pressure.
WINDOW_METRICS = (
    "peak_blocks_used",
    "mean_blocks_used",
    "peak_blocks_cached",
    "mean_blocks_cached",
    "prefix_hit_rate",
    "first_admit_cached_tokens",
    "preemptions",
    "evictions",
)


def window_comparison(windowed: dict, full: dict) -> dict:
    """A windowed run's headline numbers beside the same run's under full attention.

    Parameters
    ----------
    windowed, full : dict
        :func:`result_fields` (or :meth:`SimResult.summary`) of the two runs of
        :func:`kvnumba.sim.scheduler.compare_window`.

    Returns
    -------
    dict
        For each name of :data:`WINDOW_METRICS`: ``{"window": ..., "full": ..., "ratio": ...}``
        with ``ratio = window / full`` rounded to 4 digits (``None`` when ``full`` is 0). A
        ratio below 1 for the blocks used is the memory the window saves.
    """
    out = {}
    for name in WINDOW_METRICS:
        w, f = windowed[name], full[name]
        out[name] = {"window": w, "full": f, "ratio": round(w / f, 4) if f else None}
    return out


def attention_label(config: SimConfig) -> str:
    """The attention kind of a config in words: ``full``, ``sliding window 1,024 tokens``, ..."""
    if config.sliding_window is not None:
        return f"sliding window {config.sliding_window:,} tokens"
    if config.attention_chunk_size is not None:
        return f"chunked local, chunks of {config.attention_chunk_size:,} tokens"
    return "full"


def cost_label(cost: CostModel) -> str:
    """A cost profile in words (the report's ``cost profile`` line).

    Parameters
    ----------
    cost : CostModel
        The profile.

    Returns
    -------
    str
        ``prefill 40 us/token, decode 80 us/token, pass overhead 5,000 us, at most 8,192
        prompt tokens a pass``, marked as the default assumption when it is
        :data:`kvnumba.sim.cost.DEFAULT_COST`.
    """
    limit = cost.prefill_tokens_per_step
    return (
        f"prefill {cost.prefill_us_per_token:g} us/token, decode {cost.decode_us_per_token:g} "
        f"us/token, pass overhead {cost.step_overhead_us:,g} us, "
        + (
            "no prefill limit a pass"
            if limit is None
            else f"at most {limit:,} prompt tokens a pass"
        )
        + (" (the default, an assumption)" if cost == DEFAULT_COST else "")
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

    Notes
    -----
    Below the legend, outside the axes: the prompt tokens computed and the modeled TTFT and
    TPOT (p50 / p99) of the run's cost profile (:mod:`kvnumba.sim.cost`).
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
    latency = result.latency()
    if latency is not None:
        ax.text(
            1.01,
            0.0,
            latency_text(latency.fields()),
            transform=ax.transAxes,
            va="bottom",
            ha="left",
            fontsize="small",
        )
    if path is None:
        return fig
    fig.savefig(path, bbox_inches="tight")
    return None


def _ms(value) -> str:
    """Milliseconds for a report: ``n/a`` for ``None``, one decimal below 10 s."""
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value < 10_000 else f"{value:,.0f}"


def latency_text(fields: dict) -> str:
    """The modeled cost of a run in three lines (the timeline plot's note).

    Parameters
    ----------
    fields : dict
        A summary (or sweep row) holding :data:`kvnumba.sim.cost.LATENCY_FIELDS`.

    Returns
    -------
    str
        Prompt tokens computed, TTFT p50 / p99 and TPOT p50 / p99 in milliseconds (``n/a``
        where a value is ``None`` or missing).
    """
    computed = fields.get("prefill_tokens_computed")
    return "\n".join(
        [
            "modeled (cost profile):",
            "prompt tokens computed " + ("n/a" if computed is None else f"{computed:,}"),
            f"TTFT p50 / p99 {_ms(fields.get('ttft_p50_ms'))} / "
            f"{_ms(fields.get('ttft_p99_ms'))} ms",
            f"TPOT p50 / p99 {_ms(fields.get('tpot_p50_ms'))} / "
            f"{_ms(fields.get('tpot_p99_ms'))} ms",
        ]
    )


def timeline_title(trace_name: str, config: SimConfig) -> str:
    """The title of :func:`save_timeline` for a run: trace, pool, block size, policy, window."""
    title = (
        f"{trace_name}: {config.blocks:,} blocks, block size {config.block_size} tokens, "
        f"prefix caching {'on' if config.prefix_caching else 'off'}, eviction {config.eviction}"
    )
    if config.windowed:
        title += f", {attention_label(config)}"
    return title


#: Grid dimensions other than the pool size; a plot draws one line per combination.
SERIES_COLUMNS = (
    "eviction",
    "sliding_window",
    "attention_chunk_size",
    "block_size",
    "prefix_caching",
    "max_batch",
    "step_ms",
    "limit",
    *COST_FIELDS,
)
#: The value of a cost column in a row of a sweep made before the cost model.
_NO_COST = "none (an older row)"


def _cost_label(text):
    return lambda v: "no cost profile" if v == _NO_COST else text(v)


_SERIES_LABELS = {
    "sliding_window": lambda v: "no sliding window" if v is None else f"sliding window {v:,}",
    "attention_chunk_size": lambda v: "no chunks" if v is None else f"chunks of {v:,}",
    "eviction": lambda v: f"eviction {v}",
    "block_size": lambda v: f"block size {v} tokens",
    "prefix_caching": lambda v: f"prefix caching {'on' if v else 'off'}",
    "max_batch": lambda v: f"max batch {v}",
    "step_ms": lambda v: f"step {v:g} ms",
    "limit": lambda v: "all requests" if v is None else f"first {v:,} requests",
    "prefill_us_per_token": _cost_label(lambda v: f"prefill {v:g} us/token"),
    "decode_us_per_token": _cost_label(lambda v: f"decode {v:g} us/token"),
    "step_overhead_us": _cost_label(lambda v: f"pass overhead {v:g} us"),
    "prefill_tokens_per_step": _cost_label(
        lambda v: "no prefill limit" if v is None else f"{v:,} prefill tokens a pass"
    ),
}


def _column(row: dict, name: str):
    """A row's value of a grid column; ``lru`` for the policy of a row that predates policies,
    :data:`_NO_COST` for the cost profile of a row that predates the cost model."""
    if name == "eviction":
        return row.get(name) or "lru"
    if name in COST_FIELDS and name not in row:
        return _NO_COST
    return row.get(name)


def _ideal_kind(row: dict) -> str:
    """What the ideal hit rate of a row depends on beyond the block size, as a label suffix:
    chunked local attention, or a one-token window (a sliding window of ``W >= 2`` tokens has
    full attention's ideal, see :mod:`kvnumba.sim.ideal`)."""
    if row.get("attention_chunk_size") is not None:
        return f", chunks of {row['attention_chunk_size']:,}"
    if row.get("sliding_window") == 1:
        return ", window of 1 token"
    return ""


def plot_sweep(rows: Sequence[dict], path: str | Path | None = None):
    """Hit rate, preemptions, peak blocks used, prompt tokens computed and modeled TTFT and
    TPOT against pool size: two rows of plots a trace.

    Parameters
    ----------
    rows : sequence of dict
        Sweep rows (:func:`kvnumba.sim.sweep`, or ``results.jsonl`` read back).
    path : str or pathlib.Path, optional
        Output ``.png``; ``None`` returns the figure (it displays in a notebook).

    Returns
    -------
    matplotlib.figure.Figure or None
        The figure when ``path`` is ``None``.

    Notes
    -----
    The hit rate is that of first admissions; the trace's ideal hit rate (unbounded pool, same
    block size) is the black horizontal line it cannot exceed. One line per combination of the
    other grid dimensions (one per eviction policy, say), labelled by the dimensions that vary;
    the ``oracle`` policy, a reference point computed from the future rather than a policy a
    manager can run, is drawn dashed with square markers. Rows without an ``eviction`` column
    (sweeps made before policies existed) count as ``lru``, rows without ``sliding_window`` and
    ``attention_chunk_size`` as full attention. A windowed run's peak blocks used counts only
    the blocks its sequences still reach. A sliding window (of at least two tokens) has full
    attention's ideal; chunked local attention has its own, drawn apart: its prompts count the
    tokens below their last chunk as cached (the layer never reads them).

    The second row is what the hits are worth under the rows' cost profile
    (:mod:`kvnumba.sim.cost`): prompt tokens computed (recomputes included), and the modeled
    TTFT and TPOT, p50 as the series' line and p99 dotted in the same color. Rows of a sweep
    made before the cost model have no such points.
    """
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("no rows to plot")
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig = Figure(figsize=(15, 7.6 * len(traces)), dpi=100)
    axes = fig.subplots(2 * len(traces), 3, squeeze=False)
    colors = [f"C{i}" for i in range(10)]
    for ax_row, cost_row, trace in zip(axes[0::2], axes[1::2], traces, strict=True):
        mine = [r for r in rows if r["trace"] == trace]
        varying = [
            c
            for c in SERIES_COLUMNS
            # A sweep of one policy other than LRU still says which one it ran.
            if len(seen := {_column(r, c) for r in mine}) > 1
            or (c == "eviction" and seen != {"lru"})
        ]
        series: dict[tuple, list[dict]] = {}
        for r in mine:
            series.setdefault(tuple(_column(r, c) for c in varying), []).append(r)
        hit, pre, peak = ax_row
        rejected_marked = False
        for i, (values, group) in enumerate(series.items()):
            group = sorted(group, key=lambda r: r["blocks"])
            x = [r["blocks"] for r in group]
            label = ", ".join(_SERIES_LABELS[c](v) for c, v in zip(varying, values, strict=True))
            style = {"color": colors[i % 10], "marker": "o", "label": label or "simulated"}
            if _column(group[0], "eviction") in HINDSIGHT_POLICIES:
                style.update(ls="--", marker="s", mfc="none")
            hit.plot(x, [100 * r["prefix_hit_rate"] for r in group], **style)
            pre.plot(x, [r["preemptions"] for r in group], **style)
            peak.plot(x, [r["peak_blocks_used"] for r in group], **style)
            _plot_cost(cost_row, group, style)
            # A pool smaller than some requests rejects them: such a point replays fewer
            # requests than the others (and than the ideal line), so it is marked.
            short = [r for r in group if r["rejected"]]
            if short:
                hit.scatter(
                    [r["blocks"] for r in short],
                    [100 * r["prefix_hit_rate"] for r in short],
                    marker="x",
                    s=80,
                    color="k",
                    zorder=3,
                    label="_rejected" if rejected_marked else "requests rejected (pool too small)",
                )
                rejected_marked = True
        ideals = {}
        for r in mine:
            if r.get("ideal_prefix_hit_rate") is not None:
                ideals[r["block_size"], _ideal_kind(r)] = r["ideal_prefix_hit_rate"]
        for j, ((bs, kind), ideal) in enumerate(sorted(ideals.items())):
            hit.axhline(
                100 * ideal,
                color="k",
                lw=1,
                ls=("--", ":", "-.")[j % 3],
                label=f"ideal (unbounded pool), block size {bs} tokens{kind}",
            )
        if not ideals:
            hit.text(
                0.02,
                0.97,
                "no ideal line: the trace has no hash_ids",
                transform=hit.transAxes,
                va="top",
                fontsize="small",
            )
        top = max([100 * r["prefix_hit_rate"] for r in mine] + [100 * v for v in ideals.values()])
        hit.set_ylim(0, max(1.0, 1.1 * top))
        pools = sorted({r["blocks"] for r in mine})
        peak.plot(pools, pools, color="0.5", lw=0.8, ls="--", label="pool size (all used)")
        name = Path(str(trace)).name
        hit.set(ylabel="prefix hit rate, first admissions (%)", title=f"{name}: hit rate")
        pre.set(ylabel="preemptions", title=f"{name}: preemptions")
        pre.set_yscale("symlog", linthresh=1)
        pre.set_ylim(bottom=0)
        peak.set(ylabel="peak blocks used", title=f"{name}: peak blocks used")
        computed, ttft, tpot = cost_row
        computed.set(
            ylabel="prompt tokens computed",
            title=f"{name}: prompt tokens computed (not cached)",
        )
        ttft.set(ylabel="modeled TTFT (ms)", title=f"{name}: TTFT p50, p99 dotted")
        tpot.set(ylabel="modeled TPOT (ms)", title=f"{name}: TPOT p50, p99 dotted")
        for ax in (ttft, tpot):
            ys = [y for line in ax.get_lines() for y in line.get_ydata()]
            if ys and min(ys) > 0 and max(ys) >= 10 * min(ys):
                ax.set_yscale("log")  # a backlog makes TTFT span decades
            elif not ys:
                ax.text(
                    0.02,
                    0.97,
                    "no modeled times in these rows",
                    transform=ax.transAxes,
                    va="top",
                    fontsize="small",
                )
        wide = pools[-1] >= 10 * pools[0]
        for ax in (*ax_row, *cost_row):
            ax.set_xlabel("pool size (blocks)")
            if wide:
                ax.set_xscale("log")
            ax.grid(alpha=0.3, which="both")
        if wide:  # else the pool-size diagonal flattens every curve against the axis
            peak.set_yscale("log")
        # One legend per trace, outside the plots so that it never covers a curve.
        handles, labels = hit.get_legend_handles_labels()
        h2, l2 = peak.get_legend_handles_labels()
        peak.legend(
            handles + h2[-1:],
            labels + l2[-1:],
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            fontsize="small",
        )
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, bbox_inches="tight")
    return None


def _plot_cost(axes, group: list[dict], style: dict) -> None:
    """Draw one series' prompt tokens computed, TTFT and TPOT (the second row of
    :func:`plot_sweep`); rows without a value get no point."""
    computed, ttft, tpot = axes
    plain = {**style, "label": "_" + style["label"]}  # the legend is the hit rate panel's
    for ax, key, dotted in (
        (computed, "prefill_tokens_computed", None),
        (ttft, "ttft_p50_ms", "ttft_p99_ms"),
        (tpot, "tpot_p50_ms", "tpot_p99_ms"),
    ):
        for name, extra in ((key, {}), (dotted, {"ls": ":", "marker": "^", "mfc": "none"})):
            if name is None:
                continue
            points = [(r["blocks"], r[name]) for r in group if r.get(name) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), **{**plain, **extra})


def policy_table(rows: Sequence[dict]) -> list[dict]:
    """Each eviction policy's hit rate per pool size, and how much of LRU's gap it closes.

    Parameters
    ----------
    rows : sequence of dict
        Sweep rows (:func:`kvnumba.sim.sweep`, or ``results.jsonl`` read back). Rows that
        differ only in ``eviction`` are compared; a row without ``eviction`` counts as ``lru``.

    Returns
    -------
    list of dict
        One entry per combination of the other grid columns (so one per pool size for a
        sweep over pool sizes and policies), ordered by trace as first seen, then by those
        columns (pool size last). Each holds those columns, ``ideal_prefix_hit_rate`` (the
        unbounded pool; ``None`` without ``hash_ids``), ``hit_rate`` (policy to first-admission
        hit rate, policies in the order of
        :data:`kvnumba.eviction.SIMULATOR_POLICIES`) and ``gap_closed`` (policy to
        ``(rate - lru) / (ideal - lru)``: 0 is LRU, 1 the unbounded ideal, negative worse than
        LRU; ``None`` without an LRU row or an ideal, or when LRU already reaches the ideal),
        ``tokens_computed`` and ``ttft_p99_ms`` (policy to the row's
        ``prefill_tokens_computed`` and ``ttft_p99_ms``: what the hits are worth).
    """
    from kvnumba.sim.sweeps import CONFIG_COLUMNS

    group_columns = [c for c in CONFIG_COLUMNS if c != "eviction"]
    traces = list(dict.fromkeys(r.get("trace") for r in rows))
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = tuple(r.get(c) for c in group_columns)
        entry = groups.setdefault(
            key,
            {
                **dict(zip(group_columns, key, strict=True)),
                "ideal_prefix_hit_rate": None,
                "hit_rate": {},
                "tokens_computed": {},
                "ttft_p99_ms": {},
            },
        )
        if r.get("ideal_prefix_hit_rate") is not None:
            entry["ideal_prefix_hit_rate"] = r["ideal_prefix_hit_rate"]
        policy = _column(r, "eviction")
        entry["hit_rate"][policy] = r["prefix_hit_rate"]
        entry["tokens_computed"][policy] = r.get("prefill_tokens_computed")
        entry["ttft_p99_ms"][policy] = r.get("ttft_p99_ms")

    def order(policy: str) -> tuple:
        known = policy in SIMULATOR_POLICIES
        return (0, SIMULATOR_POLICIES.index(policy)) if known else (1, policy)

    def sort_key(item: tuple) -> tuple:
        # Trace in the order seen, the other columns ascending (None, no limit, first), the
        # pool size last.
        _, entry = item
        rest = [c for c in group_columns if c not in ("trace", "blocks")] + ["blocks"]
        values = (entry[c] for c in rest)
        return (traces.index(entry["trace"]), *((v is not None, v) for v in values))

    table = []
    for _, entry in sorted(groups.items(), key=sort_key):
        rates = {p: entry["hit_rate"][p] for p in sorted(entry["hit_rate"], key=order)}
        entry["hit_rate"] = rates
        ideal, lru = entry["ideal_prefix_hit_rate"], rates.get("lru")
        gap = None if ideal is None or lru is None else ideal - lru
        closable = gap is not None and gap > 0
        entry["gap_closed"] = {p: (r - lru) / gap if closable else None for p, r in rates.items()}
        table.append(entry)
    return table


def format_policy_table(table: Sequence[dict], metric: str = "hit_rate") -> str:
    """Text table of :func:`policy_table`: one line per pool size, one column per policy.

    Parameters
    ----------
    table : sequence of dict
        :func:`policy_table` of some rows.
    metric : {"hit_rate", "tokens_computed", "ttft_p99_ms"}
        What the policy columns show.

    Returns
    -------
    str
        The trace, the grid columns that vary, the pool size and the ideal hit rate, then per
        policy its hit rate and, beside each policy but LRU, the share of LRU's gap to the
        ideal that it closes; or its prompt tokens computed (millions), or its modeled TTFT
        p99 (seconds).
    """
    if metric not in ("hit_rate", "tokens_computed", "ttft_p99_ms"):
        raise ValueError(f"unknown metric {metric!r}")
    policies = list(dict.fromkeys(p for entry in table for p in entry["hit_rate"]))
    policies.sort(key=lambda p: SIMULATOR_POLICIES.index(p) if p in SIMULATOR_POLICIES else 99)
    shown = [c for c in SERIES_COLUMNS if c != "eviction"]  # policies are the columns here
    varying = [c for c in shown if len({entry.get(c) for entry in table}) > 1]
    head = ["trace", *varying, "blocks", "ideal", *policies]
    lines = [head]
    for entry in table:
        cells = [Path(str(entry["trace"])).name]
        cells += [str(entry.get(c)) for c in varying]
        cells.append(f"{entry['blocks']:,}")
        ideal = entry["ideal_prefix_hit_rate"]
        cells.append("n/a" if ideal is None else f"{ideal:.1%}")
        for p in policies:
            rate = entry["hit_rate"].get(p)
            closed = entry["gap_closed"].get(p)
            value = entry.get(metric, {}).get(p)
            if metric != "hit_rate":
                scale = 1e6 if metric == "tokens_computed" else 1e3
                cells.append("-" if value is None else f"{value / scale:,.2f}")
            elif rate is None:
                cells.append("-")
            elif p == "lru" or closed is None:
                cells.append(f"{rate:.1%}")
            else:
                cells.append(f"{rate:.1%} ({closed:+.0%} of gap)")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )
