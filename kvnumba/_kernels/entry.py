"""Entry points of the facade: one kernel per public call, each taking the two arenas.

An entry kernel allocates the call's result arrays (the only part that needs numba's runtime)
and hands everything to workers compiled without it, which carve their views out of the arenas
and run with every helper inlined: no reference counting anywhere on the hot path.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.admit import run_admit, validate_admit
from kvnumba._kernels.append import append_fits, run_append, validate_growth
from kvnumba._kernels.check import check_state
from kvnumba._kernels.sequences import (
    fill_lens,
    fill_tables,
    resolve_ids,
    run_fork,
    run_new_sequences,
    run_release,
    table_width,
)
from kvnumba.errors import ST_OK


@njit(cache=True)
def k_new_sequences(count, arena, scratch):
    """``new_sequences``: returns (status, ids)."""
    ids = np.empty(count, dtype=np.int64)
    return run_new_sequences(ids, arena, scratch), ids


@njit(cache=True)
def k_append(ids, counts, tokens_in, has_tokens, atomic, max_seq_len, arena, scratch):
    """``append``: returns (status, bad, needed, available, slot_mapping, cow_src, cow_dst, ok)."""
    n = ids.shape[0]
    # Room for every token of a valid call. A count beyond max_seq_len (passed in by the
    # facade, which knows it) is rejected by the worker before anything is written, so clamping
    # it keeps the sum (and the allocation) bounded without changing it for a valid call.
    limit = max_seq_len + 1
    total = 0
    for i in range(counts.shape[0]):
        total += min(max(counts[i], 0), limit)
    slots = np.empty(n, dtype=np.int64)
    ok = np.zeros(n, dtype=np.bool_)
    cow_src = np.empty(n, dtype=np.int32)
    cow_dst = np.empty(n, dtype=np.int32)
    slot_mapping = np.empty(total, dtype=np.int64)
    status, bad, needed, available, num_cow = run_append(
        ids,
        counts,
        tokens_in,
        has_tokens,
        atomic,
        slots,
        slot_mapping,
        cow_src,
        cow_dst,
        ok,
        arena,
        scratch,
    )
    return status, bad, needed, available, slot_mapping, cow_src[:num_cow], cow_dst[:num_cow], ok


@njit(cache=True)
def k_can_append(ids, counts, arena, scratch):
    """``can_append``: returns (status, bad, fits)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    no_tokens = np.empty(0, dtype=np.int64)
    status, bad, _ = validate_growth(ids, counts, no_tokens, False, slots, arena, scratch)
    if status != ST_OK:
        return status, bad, False
    dropped = np.empty(ids.shape[0], dtype=np.int32)
    return ST_OK, -1, append_fits(slots, counts, dropped, arena, scratch)


@njit(cache=True)
def k_admit(tokens_in, lengths, salts, atomic, arena, scratch):
    """``admit``: returns (status, bad, needed, available, ids, num_cached_tokens, slots, ok)."""
    num_prompts = lengths.shape[0]
    ids = np.full(num_prompts, -1, dtype=np.int64)
    num_cached_tokens = np.zeros(num_prompts, dtype=np.int64)
    ok = np.zeros(num_prompts, dtype=np.bool_)
    status, bad, total, bound, longest = validate_admit(tokens_in, lengths, salts, arena, scratch)
    if status != ST_OK:
        return status, bad, 0, 0, ids, num_cached_tokens, np.empty(0, dtype=np.int64), ok
    slot_mapping = np.empty(total, dtype=np.int64)
    hits = np.empty(longest, dtype=np.int64)
    status, bad, needed, available, used = run_admit(
        tokens_in,
        lengths,
        salts,
        atomic,
        bound,
        ids,
        num_cached_tokens,
        slot_mapping,
        ok,
        hits,
        arena,
        scratch,
    )
    return status, bad, needed, available, ids, num_cached_tokens, slot_mapping[:used], ok


@njit(cache=True)
def k_fork(ids, n, arena, scratch):
    """``fork``: returns (status, bad, children)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    children = np.empty((ids.shape[0], n), dtype=np.int64)
    status, bad = resolve_ids(ids, False, slots, arena, scratch)
    if status != ST_OK:
        return status, bad, children
    return run_fork(slots, children, arena, scratch), -1, children


@njit(cache=True)
def k_release(ids, arena, scratch):
    """``release``: returns (status, bad)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    status, bad = resolve_ids(ids, True, slots, arena, scratch)
    if status == ST_OK:
        run_release(slots, arena, scratch)
    return status, bad


@njit(cache=True)
def k_block_tables(ids, arena, scratch):
    """``block_tables``: returns (status, bad, int32 tables padded with -1)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    status, bad = resolve_ids(ids, False, slots, arena, scratch)
    if status != ST_OK:
        return status, bad, np.empty((0, 0), dtype=np.int32)
    out = np.full((ids.shape[0], table_width(slots, arena, scratch)), -1, dtype=np.int32)
    fill_tables(slots, out, arena, scratch)
    return ST_OK, -1, out


@njit(cache=True)
def k_seq_lens(ids, arena, scratch):
    """``seq_lens``: returns (status, bad, int64 lengths)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int64)
    status, bad = resolve_ids(ids, False, slots, arena, scratch)
    if status == ST_OK:
        fill_lens(slots, out, arena, scratch)
    return status, bad, out


@njit(cache=True)
def k_check(arena, scratch):
    """``check``: returns (0, 0, 0) or the first violation as (code, a, b)."""
    return check_state(arena, scratch)
