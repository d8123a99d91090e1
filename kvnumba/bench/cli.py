"""``kvnumba bench``: the standard workloads on kvnumba and on the pure-Python reference.

Both implementations replay the same batched operations in the same process; the table shows
the median allocator time of each, their ratio, and what each did (blocks allocated,
copy-on-write copies, evictions, failed sequences), which must agree: the command exits with
status 1 when it does not. The performance budgets (the README's Performance section) are
evaluated and printed but never fail the command (timings on a shared CI machine are not gates).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from kvnumba.bench import one_request, runner, workloads
from kvnumba.eviction import EVICTION_POLICIES, is_valid_policy

EXIT_DISAGREE = 1
EXIT_USAGE = 2


def _eviction_policy(text: str) -> str:
    if not is_valid_policy(text, hindsight=False):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(EVICTION_POLICIES)} nor 'module:attribute' "
            "naming a PriorityPolicy"
        )
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvnumba bench",
        description="Run the standard workloads (decode, decode-window, decode-hybrid, fork, "
        "churn, micro; "
        "defined in the "
        "module kvnumba.bench.workloads) on kvnumba and on the pure-Python reference, in the "
        "same process, and compare.",
    )
    p.add_argument("--quick", action="store_true", help="short step counts (CI smoke)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    p.add_argument(
        "--workload",
        action="append",
        metavar="NAME",
        help="run only this workload (repeatable): decode, decode-window (decode on managers "
        "with a 1024-token sliding window; run only when named), decode-hybrid (decode with a "
        "full-attention and a sliding-window KV cache group; run only when named), fork, "
        "fork-nofork, churn, micro "
        "(all micro-K), micro-K or engine (one request per call: admit_one, append_one)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help="timed repetitions per workload and implementation (default 5, 1 with --quick)",
    )
    p.add_argument(
        "--eviction",
        type=_eviction_policy,
        metavar="POLICY",
        default="lru",
        help=f"eviction policy of both implementations: {', '.join(EVICTION_POLICIES)}, or "
        "'module:attribute' naming a PriorityPolicy (default lru; docs/eviction.md)",
    )
    p.add_argument(
        "--impl",
        choices=("kvnumba", "reference"),
        default="kvnumba",
        help="implementation compared with the reference (default kvnumba.BlockManager; "
        "'reference' smoke-tests the harness itself)",
    )
    return p


#: Workloads run only when named: they compile the kernels' extended versions.
OPT_IN = frozenset({"decode-window", "decode-hybrid"})


def _select(names: list[str] | None, available: dict) -> list[str]:
    if not names:
        return [name for name in available if name not in OPT_IN]
    out: list[str] = []
    for name in names:
        # "micro" names the four micro-K workloads at once.
        hits = [n for n in available if n == name or (name == "micro" and n.startswith("micro-"))]
        if not hits:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(available)}")
        out += [h for h in hits if h not in out]
    return out


def _row(wl: workloads.Workload, fast: runner.RunResult, ref: runner.RunResult) -> dict:
    """One workload's comparison, JSON-ready."""
    fc, rc = fast.counters, ref.counters
    row: dict[str, Any] = {
        "workload": wl.name,
        "steps": wl.num_steps,
        "num_blocks": wl.num_blocks,
        "kvnumba": fast.to_dict(),
        "reference": ref.to_dict(),
        "ratio": ref.median_ns / max(fast.median_ns, 1.0),
        "agree": fc == rc,
    }
    if wl.name.startswith("micro-"):
        for side, res in (("kvnumba", fast), ("reference", ref)):
            assert res.counters is not None  # a replay's result has its counters
            blocks = max(res.counters.allocations, 1)  # k per step: every block is allocated
            row[side]["alloc_ns_per_block"] = res.kind_median_ns("prefill") / blocks
            row[side]["free_ns_per_block"] = res.kind_median_ns("release") / blocks
            row[side]["alloc_us_per_call"] = res.kind_median_ns("prefill") / 1e3 / wl.num_steps
            row[side]["free_us_per_call"] = res.kind_median_ns("release") / 1e3 / wl.num_steps
    return row


def _engine(fast_cls, ref_cls, repeat: int) -> dict:
    """The engine path (:mod:`kvnumba.bench.one_request`) on both implementations."""
    fast = one_request.measure(fast_cls, repeat)
    ref = one_request.measure(ref_cls, repeat)
    return {
        "kvnumba": fast,
        "reference": ref,
        "ratio_admit_one": ref["admit_one_ns"] / fast["admit_one_ns"],
        "ratio_append_one": ref["append_one_ns"] / fast["append_one_ns"],
        "agree": fast["outcome"] == ref["outcome"],
    }


def _budgets(rows: dict[str, dict], engine: dict | None = None) -> list[dict]:
    """The performance budgets that the measured workloads speak to."""
    out = []

    def budget(name, value, limit, unit, at_most=True):
        holds = value <= limit if at_most else value >= limit
        rel = "<=" if at_most else ">="
        out.append(
            {
                "budget": name,
                "value": value,
                "rel": rel,
                "limit": limit,
                "unit": unit,
                "holds": holds,
            }
        )

    if "decode" in rows:
        budget("W-decode time per step", rows["decode"]["kvnumba"]["us_per_step"], 15, "us")
        budget("W-decode vs reference", rows["decode"]["ratio"], 25, "x", at_most=False)
    if "fork" in rows:
        budget("W-fork vs reference", rows["fork"]["ratio"], 25, "x", at_most=False)
    if "micro-4096" in rows:
        kv = rows["micro-4096"]["kvnumba"]
        budget("W-micro allocate at 4096", kv["alloc_ns_per_block"], 10, "ns/block")
        budget("W-micro free at 4096", kv["free_ns_per_block"], 10, "ns/block")
    if "micro-1" in rows:
        kv = rows["micro-1"]["kvnumba"]
        budget("1-sequence append call", kv["alloc_us_per_call"], 3, "us")
        budget("1-sequence release call", kv["free_us_per_call"], 3, "us")
    if engine is not None:
        kv = engine["kvnumba"]
        budget("1-request admit (8 hits)", kv["admit_one_ns"] / 1e3, 1, "us")
        budget("1-request append", kv["append_one_ns"] / 1e3, 1, "us")
    return out


def _fmt_counter(row: dict, key: str) -> str:
    a = row["kvnumba"]["counters"][key]
    b = row["reference"]["counters"][key]
    return f"{a}" if a == b else f"{a}!={b}"


def _print_table(doc: dict) -> None:
    rows = doc["workloads"]
    head = (
        f"{'workload':<14} {'steps':>5} {'kvnumba':>12} {'reference':>12} {'ratio':>7}  "
        f"{'blocks':>8} {'COW':>6} {'evict':>7} {'failed':>6}  agree"
    )
    mode = "quick" if doc["quick"] else "full"
    print(f"kvnumba bench ({mode}, median of {doc['repeat']}, eviction {doc['eviction']})")
    print("times: allocator time per step (us), prologue included\n")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['workload']:<14} {r['steps']:>5} {r['kvnumba']['us_per_step']:>12.2f} "
            f"{r['reference']['us_per_step']:>12.2f} {r['ratio']:>6.1f}x  "
            f"{_fmt_counter(r, 'allocations'):>8} {_fmt_counter(r, 'cow_copies'):>6} "
            f"{_fmt_counter(r, 'evictions'):>7} {_fmt_counter(r, 'failures'):>6}  "
            f"{'yes' if r['agree'] else 'NO'}"
        )
    micro = [r for r in rows if r["workload"].startswith("micro-")]
    if micro:
        print("\nW-micro, ns per block (kvnumba / reference)")
        for r in micro:
            kv, ref = r["kvnumba"], r["reference"]
            print(
                f"  {r['workload']:<11} allocate {kv['alloc_ns_per_block']:8.1f} / "
                f"{ref['alloc_ns_per_block']:8.1f}   free {kv['free_ns_per_block']:8.1f} / "
                f"{ref['free_ns_per_block']:8.1f}"
            )
    engine = doc.get("engine")
    if engine is not None:
        kv, ref = engine["kvnumba"], engine["reference"]
        print("\nengine path, one request per call, ns per call (kvnumba / reference)")
        print(
            f"  admit_one (8 hits) {kv['admit_one_ns']:8.0f} / {ref['admit_one_ns']:8.0f}"
            f"  {engine['ratio_admit_one']:6.1f}x   append_one {kv['append_one_ns']:6.0f} / "
            f"{ref['append_one_ns']:6.0f}  {engine['ratio_append_one']:6.1f}x   "
            f"agree {'yes' if engine['agree'] else 'NO'}"
        )
    if doc["budgets"]:
        note = " (quick run: indicative only)" if doc["quick"] else ""
        print(f"\nperformance budgets{note}")
        for b in doc["budgets"]:
            print(
                f"  {'ok  ' if b['holds'] else 'MISS'} {b['budget']:<28} "
                f"{b['value']:10.2f} {b['unit']:<9} (budget {b['rel']} {b['limit']})"
            )
    if not doc["agree"]:
        print("\nkvnumba and the reference DISAGREE on what the workloads did")


def _load_impl(name: str):
    if name == "reference":
        from kvnumba.reference import ReferenceBlockManager

        return ReferenceBlockManager
    from kvnumba.manager import BlockManager

    return BlockManager


def main(argv: list[str] | None = None) -> int:
    """Run ``kvnumba bench``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after ``bench``; ``sys.argv[2:]`` semantics, default ``[]``.

    Returns
    -------
    int
        0 when every workload ran and both implementations agree, 1 when they disagree, 2 on a
        usage error.
    """
    args = _parser().parse_args([] if argv is None else argv)
    available = workloads.standard(quick=args.quick)
    # "engine" is not a replayed workload: the one-request calls are timed on their own.
    engine = args.workload is None or "engine" in args.workload
    others = None if args.workload is None else [n for n in args.workload if n != "engine"]
    try:
        names = _select(others, available) if others != [] else []
    except ValueError as exc:
        print(f"kvnumba bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    if repeat < 1:
        print("kvnumba bench: --repeat must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    from kvnumba.reference import ReferenceBlockManager

    fast_cls = _load_impl(args.impl)
    if args.impl == "kvnumba":
        from kvnumba.kernels import prepare

        # Says so if it must compile, before any timing (decode-window and a policy other
        # than LRU run the kernels' extended versions).
        prepare(stream=sys.stderr, policy=args.eviction != "lru")
        if args.eviction == "lru" and OPT_IN & set(names):
            prepare(stream=sys.stderr, policy=True)
    ref_cls: Callable[..., ReferenceBlockManager] = ReferenceBlockManager
    if args.eviction != "lru":
        fast_cls = functools.partial(fast_cls, eviction=args.eviction)
        ref_cls = functools.partial(ReferenceBlockManager, eviction=args.eviction)
    rows = {}
    for name in names:
        wl = available[name]()
        print(f"running {name} ({wl.num_steps} steps) ...", file=sys.stderr, flush=True)
        fast = runner.run(wl, fast_cls, repeat=repeat, impl=args.impl)
        ref = runner.run(wl, ref_cls, repeat=repeat, impl="reference")
        rows[name] = _row(wl, fast, ref)
    engine_doc = None
    if engine:
        print("running engine (one request per call) ...", file=sys.stderr, flush=True)
        engine_doc = _engine(fast_cls, ReferenceBlockManager, repeat)
    doc = {
        "quick": args.quick,
        "repeat": repeat,
        "impl": args.impl,
        "eviction": args.eviction,
        "workloads": list(rows.values()),
        "engine": engine_doc,
        "budgets": _budgets(rows, engine_doc),
        "agree": all(r["agree"] for r in rows.values())
        and (engine_doc is None or engine_doc["agree"]),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_table(doc)
    return 0 if doc["agree"] else EXIT_DISAGREE
