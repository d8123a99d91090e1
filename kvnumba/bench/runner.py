"""Replay a :class:`~kvnumba.bench.workloads.Workload` against a block manager and time it.

Only the allocator calls are timed (``time.perf_counter_ns`` around each call); mapping the
workload's local ids onto manager ids, building token arrays and reading results happen outside
the timed spans. Garbage collection is off during a replay, as in ``timeit``, so that a
collection triggered by the workload's own bookkeeping is not charged to the allocator.
"""

from __future__ import annotations

import gc
import hashlib
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from kvnumba.bench.workloads import (
    OP_ADMIT,
    OP_DECODE,
    OP_FORK,
    OP_PREFILL,
    OP_RELEASE,
    Workload,
)
from kvnumba.windows import KVCacheGroup

# Timed call kinds: ``prefill`` is the ``append`` of a prefill, ``decode`` the 1-token append.
CALL_KINDS = ("new_sequences", "prefill", "admit", "fork", "decode", "release")

_WARM: set[type] = set()  # implementations warmed up in this process (see warm_up)


@dataclass(frozen=True)
class Counters:
    """What one replay did; equal between two correct implementations.

    Attributes
    ----------
    allocations, cow_copies, evictions, failed_calls, prefix_hits : int
        From ``stats()`` at the end of the replay.
    failures : int
        Sequences whose decode append failed (non-atomic mode, pool exhausted).
    final_blocks : str
        Digest of the block tables of the sequences alive at the end: two implementations that
        follow ``docs/design.md`` hand out the same block ids.
    """

    allocations: int
    cow_copies: int
    evictions: int
    failed_calls: int
    prefix_hits: int
    failures: int
    final_blocks: str


@dataclass
class RunResult:
    """Timings and counters of ``repeat`` replays of one workload on one implementation.

    Attributes
    ----------
    workload, impl : str
        Names of the workload and of the implementation.
    steps : int
        Steps of the workload.
    times_ns : list of int
        Allocator time of each repetition (sum over all timed calls, prologue included).
    kind_ns : dict of str to list of int
        Allocator time per call kind (:data:`CALL_KINDS`), per repetition.
    calls : dict of str to int
        Calls per call kind in one replay.
    counters : Counters
        What the replay did (identical in every repetition).
    """

    workload: str
    impl: str
    steps: int
    times_ns: list[int] = field(default_factory=list)
    kind_ns: dict[str, list[int]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    counters: Counters | None = None

    @property
    def median_ns(self) -> float:
        """Median allocator time of one replay, in nanoseconds."""
        return float(np.median(self.times_ns))

    def kind_median_ns(self, kind: str) -> float:
        """Median allocator time of one replay spent in calls of ``kind``, in nanoseconds."""
        return float(np.median(self.kind_ns[kind]))

    def to_dict(self) -> dict:
        """JSON-ready form, with the medians."""
        return {
            "workload": self.workload,
            "impl": self.impl,
            "steps": self.steps,
            "median_ns": self.median_ns,
            "us_per_step": self.median_ns / 1e3 / max(self.steps, 1),
            "times_ns": list(self.times_ns),
            "kind_median_ns": {k: self.kind_median_ns(k) for k in CALL_KINDS},
            "calls": dict(self.calls),
            "counters": asdict(self.counters) if self.counters else None,
        }


def replay(workload: Workload, manager_cls, *, check: bool = False):
    """Replay ``workload`` once on a new manager.

    Parameters
    ----------
    workload : Workload
        The batched operations to issue.
    manager_cls : type
        ``BlockManager`` or ``ReferenceBlockManager`` (anything with their constructor and
        batched API).
    check : bool
        Run ``mgr.check()`` (untimed) at the end.

    Returns
    -------
    total_ns : int
        Allocator time of the replay.
    spent : dict of str to int
        Allocator time per call kind.
    calls : dict of str to int
        Calls per call kind.
    counters : Counters
        What the replay did.
    """
    wl = workload
    window: dict[str, object] = {}
    if wl.sliding_window is not None:
        window["sliding_window"] = wl.sliding_window
    groups = len(wl.kv_cache_groups) or 1
    if wl.kv_cache_groups:
        window["kv_cache_groups"] = [
            KVCacheGroup(w or None, c or None) for w, c in wl.kv_cache_groups
        ]
    mgr = manager_cls(
        wl.num_blocks,
        wl.block_size,
        max_seqs=wl.max_seqs,
        max_seq_len=wl.max_seq_len,
        prefix_caching=True,
        **window,
    )
    # local id -> manager id (one per KV cache group)
    seq = np.full((wl.num_seqs, groups), -1, dtype=np.int64)
    live = np.zeros(wl.num_seqs, dtype=bool)
    spent = dict.fromkeys(CALL_KINDS, 0)
    calls = dict.fromkeys(CALL_KINDS, 0)
    failures = 0
    clock = time.perf_counter_ns
    fork_offsets = np.arange(wl.fork_n, dtype=np.int64)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for kind, local, vals, tokens in wl.ops():
            if groups > 1:  # every operation acts on the sequence of each group alike
                vals = np.repeat(vals, groups)
            if kind == OP_DECODE:
                ids = seq[local].ravel()
                t0 = clock()
                res = mgr.append(ids, vals, atomic=wl.atomic)
                spent["decode"] += clock() - t0
                calls["decode"] += 1
                failures += len(ids) - int(np.count_nonzero(res.ok))
            elif kind == OP_RELEASE:
                ids = seq[local].ravel()
                t0 = clock()
                mgr.release(ids)
                spent["release"] += clock() - t0
                calls["release"] += 1
                live[local] = False
            elif kind == OP_PREFILL:
                t0 = clock()
                ids = mgr.new_sequences(len(local))
                spent["new_sequences"] += clock() - t0
                # Flat ids, one per sequence of each group (a view), made outside the timing.
                flat = ids.ravel()
                t1 = clock()
                mgr.append(flat, vals)
                spent["prefill"] += clock() - t1
                calls["new_sequences"] += 1
                calls["prefill"] += 1
                seq[local] = np.reshape(ids, (len(local), groups))
                live[local] = True
            elif kind == OP_ADMIT:
                # Atomic: the workload admits only prompts that fit (see workloads.churn).
                t0 = clock()
                res = mgr.admit(tokens, vals)
                spent["admit"] += clock() - t0
                calls["admit"] += 1
                seq[local] = np.reshape(res.ids, (len(local), groups))
                live[local] = True
            elif kind == OP_FORK:
                parents = seq[local, 0]  # the fork workload has one group
                t0 = clock()
                children = mgr.fork(parents, n=wl.fork_n)
                spent["fork"] += clock() - t0
                calls["fork"] += 1
                child_local = (vals[:, None] + fork_offsets).ravel()
                seq[child_local, 0] = np.asarray(children).ravel()
                live[child_local] = True
    finally:
        if gc_was_enabled:
            gc.enable()
    st = mgr.stats()
    alive = seq[live].ravel()
    tables = np.ascontiguousarray(mgr.block_tables(alive), dtype=np.int32) if len(alive) else b""
    counters = Counters(
        allocations=int(st.allocations),
        cow_copies=int(st.cow_copies),
        evictions=int(st.evictions),
        failed_calls=int(st.failed_calls),
        prefix_hits=int(st.prefix_hits),
        failures=failures,
        final_blocks=hashlib.sha256(bytes(tables)).hexdigest()[:16],
    )
    if check:
        mgr.check()
    return sum(spent.values()), spent, calls, counters


def warm_up(manager_cls) -> None:
    """Call every operation the replay uses once, on a small manager, untimed.

    Numba compiles a kernel (or loads it from the cache) at its first call; this makes sure that
    happens here and never inside a timed span, whatever the workload's first steps are. The
    arguments have the dtypes the replay passes (int64 arrays), so the same specializations
    are the ones compiled.
    """
    if manager_cls in _WARM:
        return
    mgr = manager_cls(64, 16, max_seqs=8, max_seq_len=512)
    ids = mgr.new_sequences(2)
    mgr.append(ids, np.array([17, 1], dtype=np.int64))
    children = mgr.fork(ids[:1], n=2)
    mgr.append(ids, np.ones(2, dtype=np.int64), atomic=False)  # copy-on-write
    admitted = mgr.admit(np.arange(40, dtype=np.int64), np.array([40], dtype=np.int64)).ids
    mgr.block_tables(np.concatenate([ids, admitted]))
    mgr.release(np.concatenate([ids, np.asarray(children).ravel(), admitted]))
    mgr.stats()
    mgr.check()
    _WARM.add(manager_cls)


def run(workload: Workload, manager_cls, *, repeat: int = 5, impl: str | None = None) -> RunResult:
    """Replay ``workload`` ``repeat`` times (after an untimed warm-up) and collect timings.

    Parameters
    ----------
    workload : Workload
        The workload.
    manager_cls : type
        The implementation to time.
    repeat : int
        Timed repetitions (docs/workloads.md asks for medians of at least 5).
    impl : str, optional
        Name recorded in the result; the class name by default.

    Returns
    -------
    RunResult
        Per-repetition timings and the counters (the first repetition also runs
        ``mgr.check()``, untimed). :func:`warm_up` runs first.

    Raises
    ------
    RuntimeError
        If two repetitions disagree on the counters (the replay must be deterministic).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    result = RunResult(workload.name, impl or manager_cls.__name__, workload.num_steps)
    warm_up(manager_cls)
    for k in CALL_KINDS:
        result.kind_ns[k] = []
    for r in range(repeat):
        total, spent, calls, counters = replay(workload, manager_cls, check=r == 0)
        if result.counters is not None and counters != result.counters:
            raise RuntimeError(
                f"{result.impl} on {workload.name}: repetition {r} did {counters}, "
                f"the first one {result.counters}"
            )
        result.counters, result.calls = counters, calls
        result.times_ns.append(total)
        for k in CALL_KINDS:
            result.kind_ns[k].append(spent[k])
    return result
