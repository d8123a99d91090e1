"""The engine path of ``kvnumba bench``: one request per call, as vLLM's scheduler calls its
manager (budget: a one-sequence append or admit <= 1 us of kvnumba time).

Two loops, each timed whole (an engine calls once per request of a step, so the state is warm):
``admit_one`` of the same keyed prompt :data:`CALLS` times (its 8 full blocks are cached: 8
hits claimed, one block taken, one sequence opened), then ``append_one`` of one token to each of
those sequences (into the tail block). Times are per call, loop overhead included.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import time

import numpy as np

BLOCK_SIZE = 16
PROMPT_BLOCKS = 8
PROMPT_TOKENS = PROMPT_BLOCKS * BLOCK_SIZE + 12  # 8 full blocks and a partial one
CALLS = 2000


def engine_keys(count: int) -> np.ndarray:
    """``count`` engine keys (sha256 digests as uint64[count, 4]), the same in every run."""
    digests = [hashlib.sha256(b"kvnumba-bench-%d" % i).digest() for i in range(count)]
    return np.frombuffer(b"".join(digests), dtype=np.uint64).reshape(count, 4).copy()


def measure(manager_cls, repeat: int) -> dict:
    """Time ``admit_one`` and ``append_one`` on a fresh manager of ``manager_cls``.

    Parameters
    ----------
    manager_cls : type
        :class:`kvnumba.BlockManager` or the reference model.
    repeat : int
        Timed loops of each call.

    Returns
    -------
    dict
        ``admit_one_ns`` and ``append_one_ns`` (median over the loops of the mean time per
        call, the garbage collector off as in ``timeit``), ``calls`` per loop, and
        ``outcome``: what one more admit and append return and the final ``stats()``, which
        the two implementations must share.
    """
    mgr = manager_cls(1 << 15, BLOCK_SIZE, max_seqs=CALLS, block_keys=True, reserved_blocks=1)
    keys = engine_keys(PROMPT_BLOCKS)
    # Caches the prompt's 8 full blocks, and loads both calls' kernels before any timing.
    seq, _ = mgr.admit_one(None, length=PROMPT_TOKENS, keys=keys)
    mgr.append_one(seq, 1)
    mgr.release([seq])
    admit_ns, append_ns = [], []
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: a collection of the interpreter's heap is not the call's
    try:
        for _ in range(repeat):
            start = time.perf_counter_ns()
            ids = [mgr.admit_one(None, length=PROMPT_TOKENS, keys=keys)[0] for _ in range(CALLS)]
            admit_ns.append((time.perf_counter_ns() - start) / CALLS)
            start = time.perf_counter_ns()
            for seq in ids:
                mgr.append_one(seq, 1)
            append_ns.append((time.perf_counter_ns() - start) / CALLS)
            mgr.release(ids)
    finally:
        if collecting:
            gc.enable()
    seq, cached_tokens = mgr.admit_one(None, length=PROMPT_TOKENS, keys=keys)
    appended = mgr.append_one(seq, 1)
    return {
        "admit_one_ns": statistics.median(admit_ns),
        "append_one_ns": statistics.median(append_ns),
        "calls": CALLS,
        "outcome": {
            "cached_tokens": cached_tokens,
            "append": list(appended),
            "stats": {name: int(value) for name, value in vars(mgr.stats()).items()},
        },
    }
