"""What an eviction policy costs against LRU: time per step and per eviction, kvnumba only.

Usage: ``python scripts/policy_costs.py [--repeat N] POLICY...``; one JSON line per policy:

- ``decode``, ``churn``: microseconds per step of W-decode and W-churn (``kvnumba bench``'s
  workloads, ``kvnumba.bench.workloads``), the fastest of ``N`` replays;
- ``evict_ns``: nanoseconds per eviction, the fastest of ``N`` calls that append one block's
  tokens to each of 4,096 empty sequences while every block of a 65,536-block pool is cached
  (the asv benchmark ``EvictPerPolicy`` at batch 4,096, with its pool filling).

It times kvnumba only (``kvnumba bench`` also replays the reference model, which takes most
of its time), so many short runs fit in a session. To compare this checkout with an earlier
commit, use ``scripts/side_by_side.py``, which times both in one process with these same
measures.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

import kvnumba
from kvnumba.bench import runner, workloads
from kvnumba.kernels import prepare

# The asv suite's helpers (its pool filling), so that the eviction timed here is the one asv's
# ``EvictPerPolicy`` times.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from benchmarks import common  # noqa: E402

POOL, BATCH = 65_536, 4_096


def evict_ns(policy: str, repeat: int, manager_cls=kvnumba.BlockManager) -> float:
    """Nanoseconds per eviction: the fastest of ``repeat`` appends to ``BATCH`` sequences
    (``manager_cls``: ``scripts/side_by_side.py`` passes an earlier version's)."""
    mgr = manager_cls(
        POOL,
        common.BLOCK_SIZE,
        max_seqs=2 * BATCH,
        max_seq_len=common.MAX_SEQ_LEN,
        eviction=policy,
    )
    common.fill_cache(mgr, mgr.stats().free)
    counts = np.full(BATCH, common.BLOCK_SIZE, dtype=np.int64)
    best = float("inf")
    for r in range(repeat + 1):  # the first call is a warm-up
        ids = mgr.new_sequences(BATCH)
        start = time.perf_counter_ns()
        mgr.append(ids, counts)
        if r:
            best = min(best, time.perf_counter_ns() - start)
        mgr.release(ids)
        common.fill_cache(mgr, mgr.stats().free)
    mgr.check()
    return best / BATCH


def step_us(name: str, manager_cls, repeat: int) -> tuple[float, runner.Counters]:
    """Microseconds per step of the standard workload ``name`` (``decode``, ``churn``): the
    fastest of ``repeat`` replays on ``manager_cls``, and what the replay did."""
    wl = workloads.standard()[name]()
    result = runner.run(wl, manager_cls, repeat=repeat, impl="kvnumba")
    return min(result.times_ns) / wl.num_steps / 1e3, result.counters


def measure(policy: str, repeat: int) -> dict:
    """The three costs of ``policy`` (see the module's docstring)."""
    prepare(stream=sys.stderr, policy=policy != "lru")
    cls = functools.partial(kvnumba.BlockManager, eviction=policy)
    row: dict = {"policy": policy}
    for name in ("decode", "churn"):
        row[name] = round(step_us(name, cls, repeat)[0], 2)
    row["evict_ns"] = round(evict_ns(policy, repeat), 1)
    return row


def main() -> None:
    """Print one JSON line per policy named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policies", nargs="+", metavar="POLICY")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each (default 7)")
    args = parser.parse_args()
    for policy in args.policies:
        print(json.dumps(measure(policy, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
