"""Entry points of the facade: one kernel per public call, each taking the two arenas.

An entry kernel allocates the call's result arrays (the only part that needs numba's runtime)
and hands everything to workers compiled without it, which carve their views out of the arenas
and run with every helper inlined: no reference counting anywhere on the hot path.

The state-changing kernels (``append``, ``admit``, ``release``, ``truncate``, ``evict``,
``reset_prefix_cache``) return one outcome head: ``status``, ``bad`` (index of the offending
input), ``needed`` and ``available`` (blocks, for ``PoolExhausted``; record rows for
``ST_NEED_BUFFERS``), then the result fields. Every result layout is named once, with its
decoders, in ``kvnumba.kernels`` (``RESULTS``), and read by name in the facade. Variable-size records of a committed call
(evictions, pages mapped and unmapped) stay in the scratch arena, where the facade reads them
for the callbacks. The workers take their inputs and outputs as named tuples and report an
:class:`.Outcome`; the kernels here return plain tuples, since boxing a named tuple at the
Python boundary would cost every call.

A kernel of a manager on a page pool (``*_paged``) hands its workers the pool's arena as
:func:`with_pages` makes it: a view of another numba type, so that the workers of the quick
start's calls are compiled apart for page pools and a manager without one never compiles the
page code (:mod:`.page_calls`).
"""

from typing import NamedTuple

import numpy as np
from numba import njit, types

from kvnumba._kernels.admit import (
    AdmitOutputs,
    KeyRows,
    PromptInputs,
    run_admit,
    run_lookup,
    validate_admit,
)
from kvnumba._kernels.append import AppendInputs, AppendOutputs, append_need, run_append
from kvnumba._kernels.carve import arena_at, carve
from kvnumba._kernels.check import check
from kvnumba._kernels.eviction import run_set_next_use, run_set_sequence_tags, run_set_tags
from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.give_up import commit_give_up, run_give_up
from kvnumba._kernels.jit import inlined
from kvnumba._kernels.keys import check_key_run, register_key_run, run_set_keys
from kvnumba._kernels.rollback import undo_failed_call
from kvnumba._kernels.sequences import (
    fill_lens,
    fill_tables,
    length_and_block_size,
    resolve_ids,
    run_fork,
    run_new_sequences,
    run_release,
    table_width,
)
from kvnumba._kernels.shrink import (
    run_evict,
    run_release_window,
    run_reset_prefix_cache,
    run_truncate,
)
from kvnumba._kernels.views import block_size_of, call_room, groups_of, scratch_slots
from kvnumba._layout import ADMIT_ONE_AT, APPEND_ONE_AT, CALL_ROOM_INPUTS
from kvnumba.errors import ST_BAD_KEY_COUNT, ST_NEED_BUFFERS, ST_OK

#: Where ``k_append_one_keys`` finds the sequence's slot in ``_append_one``'s result (the
#: ``slot`` field of ``kvnumba.kernels.AppendOneLayout``; status is field 0).
_APPEND_ONE_SLOT = 8


@njit(cache=True, inline="always")
def with_pages(pool):
    """The page pool's arena as the workers of a paged kernel take it: the same bytes, typed
    with any layout (``'A'``) where a plain kernel passes its C-contiguous scratch arena."""
    return pool[::1]


@njit(cache=True)
def k_new_sequences(count, arena, scratch):
    """``new_sequences``: returns (status, ids)."""
    ids = np.empty(count, dtype=np.int64)
    return run_new_sequences(ids, arena, scratch), ids


class AppendResultsAt(NamedTuple):
    """Byte offsets of an append's result arrays in their one allocation, and its size."""

    slot_mapping: int
    cow_src: int
    cow_dst: int
    ok: int
    nbytes: int


@inlined(types.NamedUniTuple(types.int64, 5, AppendResultsAt)(types.int64, types.int64))
def append_results_at(n, total):
    """Where :func:`_append_results` puts the result arrays of ``n`` sequences and ``total``
    tokens, one after the other: slot_mapping (int64), cow_src, cow_dst (int32), ok (bool)."""
    cow_src = 8 * total
    cow_dst = cow_src + 4 * n
    ok = cow_dst + 4 * n
    return AppendResultsAt(0, cow_src, cow_dst, ok, ok + n)


@njit(cache=True, inline="always")
def _append_results(slots, total):
    """An append's outputs: the ids' ``slots`` and the result arrays, carved out of one
    allocation (``ok`` cleared). One allocation instead of four: the boundary cost dominates a
    one-sequence call."""
    n = slots.shape[0]
    at = append_results_at(n, total)
    buffer = np.empty(at.nbytes, dtype=np.uint8)
    ok = carve(buffer, at.ok, (n,), np.bool_)
    for i in range(n):
        ok[i] = False
    return AppendOutputs(
        slots,
        carve(buffer, at.slot_mapping, (total,), np.int64),
        carve(buffer, at.cow_src, (n,), np.int32),
        carve(buffer, at.cow_dst, (n,), np.int32),
        ok,
    )


@njit(cache=True, inline="always")
def _append(inputs, max_seq_len, arena, scratch, pool):
    # Room for every token of a valid call. A count beyond max_seq_len (passed in by the
    # facade, which knows it) is rejected by the worker before anything is written, so clamping
    # it keeps the sum (and the allocation) bounded without changing it for a valid call.
    counts = inputs.counts
    limit = max_seq_len + 1
    total = 0
    for i in range(counts.shape[0]):
        total += min(max(counts[i], 0), limit)
    # The ids' slots live in the scratch arena: one allocation fewer on the hot path.
    results = _append_results(scratch_slots(scratch)[: inputs.ids.shape[0]], total)
    outcome = run_append(inputs, results, arena, scratch, pool)
    num_cow = outcome.count
    return (
        outcome.status,
        outcome.bad,
        outcome.needed,
        outcome.available,
        results.slot_mapping,
        results.cow_src[:num_cow],
        results.cow_dst[:num_cow],
        results.ok,
    )


@njit(cache=True)
def k_append(ids, counts, tokens_in, has_tokens, atomic, max_seq_len, arena, scratch):
    """``append``: returns (status, bad, needed, available, slot_mapping, cow_src, cow_dst, ok)."""
    # Without a page pool the workers never read ``pool``: the scratch arena stands in for it.
    inputs = AppendInputs(ids, counts, tokens_in, has_tokens, atomic)
    return _append(inputs, max_seq_len, arena, scratch, scratch)


@njit(cache=True)
def k_append_paged(ids, counts, tokens_in, has_tokens, atomic, max_seq_len, arena, scratch, pool):
    """``append`` of a manager on the page pool whose arena is ``pool``."""
    inputs = AppendInputs(ids, counts, tokens_in, has_tokens, atomic)
    return _append(inputs, max_seq_len, arena, scratch, with_pages(pool))


@njit(cache=True, inline="always")
def _append_need(ids, counts, arena, scratch, pool):
    slots = np.empty(ids.shape[0], dtype=np.int64)
    dropped = np.empty(ids.shape[0], dtype=np.int32)
    outcome = append_need(ids, counts, slots, dropped, arena, scratch, pool)
    return outcome.status, outcome.bad, outcome.needed, outcome.available


@njit(cache=True)
def k_can_append(ids, counts, arena, scratch):
    """``can_append``: returns (status, bad, blocks needed, blocks available)."""
    return _append_need(ids, counts, arena, scratch, scratch)


@njit(cache=True)
def k_can_append_paged(ids, counts, arena, scratch, pool):
    """``can_append`` of a manager on a page pool."""
    return _append_need(ids, counts, arena, scratch, pool)


@njit(cache=True, inline="always")
def _admit(prompts, key_rows, caps, arena, scratch, pool):
    num_prompts = prompts.lengths.shape[0]
    groups = groups_of(arena)
    ids = np.full(num_prompts * groups, -1, dtype=np.int64)
    num_cached_tokens = np.zeros(num_prompts, dtype=np.int64)
    ok = np.zeros(num_prompts, dtype=np.bool_)
    check = validate_admit(prompts, key_rows, caps, np.bool_(True), arena, scratch)
    if check.status != ST_OK:
        no_slots = np.empty(0, dtype=np.int64)
        return check.status, check.bad, 0, 0, ids, num_cached_tokens, no_slots, ok
    slot_mapping = np.empty(check.total, dtype=np.int64)
    hits = np.empty((groups, check.longest), dtype=np.int64)
    results = AdmitOutputs(ids, num_cached_tokens, slot_mapping, ok, hits)
    outcome = run_admit(prompts, key_rows, caps, check.bound, results, arena, scratch, pool)
    return (
        outcome.status,
        outcome.bad,
        outcome.needed,
        outcome.available,
        ids,
        num_cached_tokens,
        slot_mapping[: outcome.count],
        ok,
    )


# Token-mode admits pass None for the keys and the caps: numba prunes their branches, so the
# quick start's admit compiles without them. Keyed or capped admits are one kernel of their own
# (``k_admit_keys``; a token-mode manager passes no keys), compiled on first use.
@njit(cache=True)
def k_admit(tokens_in, lengths, salts, atomic, arena, scratch):
    """``admit``: returns (status, bad, needed, available, ids, num_cached_tokens, slots, ok)."""
    prompts = PromptInputs(tokens_in, lengths, salts, np.bool_(True), atomic)
    return _admit(prompts, None, None, arena, scratch, scratch)


@njit(cache=True)
def k_admit_paged(tokens_in, lengths, salts, atomic, arena, scratch, pool):
    """``admit`` of a manager on a page pool. It passes no keys and no caps the way
    ``k_admit_keys_paged`` takes them, so the two share their compiled workers."""
    n = lengths.shape[0]
    no_keys = KeyRows(np.empty((0, 4), dtype=np.uint64)[::1], np.zeros(n, dtype=np.int64))
    caps = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    prompts = PromptInputs(tokens_in, lengths, salts, np.bool_(True), atomic)
    return _admit(prompts, no_keys, caps, arena, scratch, with_pages(pool))


@njit(cache=True)
def k_admit_keys(
    tokens_in, lengths, salts, atomic, has_tokens, keys, key_counts, caps, arena, scratch
):
    """``admit`` with engine keys (``block_keys``); ``caps`` holds every prompt's hit cap."""
    prompts = PromptInputs(tokens_in, lengths, salts, has_tokens, atomic)
    key_rows = KeyRows(keys, key_counts)
    return _admit(prompts, key_rows, caps, arena, scratch, scratch)


@njit(cache=True)
def k_admit_keys_paged(
    tokens_in, lengths, salts, atomic, has_tokens, keys, key_counts, caps, arena, scratch, pool
):
    """``admit`` with engine keys on a page pool."""
    prompts = PromptInputs(tokens_in, lengths, salts, has_tokens, atomic)
    key_rows = KeyRows(keys, key_counts)
    return _admit(prompts, key_rows, caps, arena, scratch, with_pages(pool))


@njit(cache=True, inline="always")
def _lookup(prompts, key_rows, caps, arena, scratch):
    n = prompts.lengths.shape[0]
    num_cached_tokens = np.zeros(n, dtype=np.int64)
    check = validate_admit(prompts, key_rows, caps, np.bool_(False), arena, scratch)
    if check.status != ST_OK:
        return check.status, check.bad, num_cached_tokens, np.empty((n, 0), dtype=np.int32)
    hits = np.empty((n * groups_of(arena), check.longest), dtype=np.int64)
    width = run_lookup(prompts, key_rows, caps, num_cached_tokens, hits, arena, scratch)
    return ST_OK, -1, num_cached_tokens, hits[:, :width].astype(np.int32)


@njit(cache=True)
def k_lookup(tokens_in, lengths, salts, caps, arena, scratch):
    """``lookup`` (token hashes): returns (status, bad, num_cached_tokens, hit blocks)."""
    prompts = PromptInputs(tokens_in, lengths, salts, np.bool_(True), np.bool_(False))
    return _lookup(prompts, None, caps, arena, scratch)


@njit(cache=True)
def k_lookup_keys(tokens_in, lengths, salts, has_tokens, keys, key_counts, caps, arena, scratch):
    """``lookup`` with engine keys: returns (status, bad, num_cached_tokens, hit blocks)."""
    prompts = PromptInputs(tokens_in, lengths, salts, has_tokens, np.bool_(False))
    return _lookup(prompts, KeyRows(keys, key_counts), caps, arena, scratch)


@njit(cache=True)
def k_set_keys(ids, starts, counts, keys, arena, scratch):
    """``set_keys``: returns (status, bad, 0, 0, blocks registered)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    outcome = run_set_keys(ids, starts, counts, keys, slots, arena, scratch)
    return outcome.status, outcome.bad, 0, 0, outcome.count


@njit(cache=True)
def k_fork(ids, n, arena, scratch):
    """``fork``: returns (status, bad, children)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    children = np.empty((ids.shape[0], n), dtype=np.int64)
    resolved = resolve_ids(ids, np.bool_(False), slots, arena, scratch)
    if resolved.status != ST_OK:
        return resolved.status, resolved.bad, children
    return run_fork(slots, children, arena, scratch), -1, children


@njit(cache=True, inline="always")
def _release(ids, arena, scratch, pool):
    slots = np.empty(ids.shape[0], dtype=np.int64)
    resolved = resolve_ids(ids, np.bool_(True), slots, arena, scratch)
    if resolved.status == ST_OK:
        run_release(slots, arena, scratch, pool)
    return resolved.status, resolved.bad, 0, 0


@njit(cache=True)
def k_release(ids, arena, scratch):
    """``release``: returns (status, bad, 0, 0)."""
    return _release(ids, arena, scratch, scratch)


@njit(cache=True)
def k_release_paged(ids, arena, scratch, pool):
    """``release`` of a manager on a page pool."""
    return _release(ids, arena, scratch, with_pages(pool))


@njit(cache=True, inline="always")
def _truncate(ids, new_lens, arena, scratch, pool):
    slots = np.empty(ids.shape[0], dtype=np.int64)
    truncated = run_truncate(ids, new_lens, slots, arena, scratch, pool)
    return truncated.status, truncated.bad, 0, 0, 0


@njit(cache=True)
def k_truncate(ids, new_lens, arena, scratch):
    """``truncate``: returns (status, bad, 0, 0, 0)."""
    return _truncate(ids, new_lens, arena, scratch, with_pages(scratch))


@njit(cache=True)
def k_truncate_paged(ids, new_lens, arena, scratch, pool):
    """``truncate`` of a manager on a page pool (a freed block may unmap its page)."""
    return _truncate(ids, new_lens, arena, scratch, with_pages(pool))


@njit(cache=True, inline="always")
def _release_window(ids, lengths, arena, scratch, pool):
    slots = np.empty(ids.shape[0], dtype=np.int64)
    outcome = run_release_window(ids, lengths, slots, arena, scratch, pool)
    return outcome.status, outcome.bad, 0, 0, outcome.count


@njit(cache=True)
def k_release_window(ids, lengths, arena, scratch):
    """``release_window``: returns (status, bad, 0, 0, blocks released)."""
    return _release_window(ids, lengths, arena, scratch, with_pages(scratch))


@njit(cache=True)
def k_release_window_paged(ids, lengths, arena, scratch, pool):
    """``release_window`` of a manager on a page pool (a freed block may unmap its page)."""
    return _release_window(ids, lengths, arena, scratch, with_pages(pool))


@njit(cache=True)
def k_evict(blocks, arena, scratch):
    """``evict``: returns (status, bad, record rows needed, 0, blocks evicted)."""
    outcome = run_evict(blocks, arena, scratch, with_pages(scratch))
    return outcome.status, outcome.bad, outcome.needed, 0, outcome.count


@njit(cache=True)
def k_evict_paged(blocks, arena, scratch, pool):
    """``evict`` of a manager on a page pool (an emptied page is unmapped)."""
    outcome = run_evict(blocks, arena, scratch, with_pages(pool))
    return outcome.status, outcome.bad, outcome.needed, 0, outcome.count


@njit(cache=True)
def k_reset_prefix_cache(arena, scratch):
    """``reset_prefix_cache``: returns (status, -1, record rows needed, 0, blocks evicted)."""
    outcome = run_reset_prefix_cache(arena, scratch, with_pages(scratch))
    return outcome.status, -1, outcome.needed, 0, outcome.count


@njit(cache=True)
def k_reset_prefix_cache_paged(arena, scratch, pool):
    """``reset_prefix_cache`` of a manager on a page pool."""
    outcome = run_reset_prefix_cache(arena, scratch, with_pages(pool))
    return outcome.status, -1, outcome.needed, 0, outcome.count


@njit(cache=True)
def k_give_up(max_pages, logged, arena, scratch, pool):
    """``trim`` (``logged`` False) or a sibling's give-up: returns the pages unmapped."""
    return run_give_up(max_pages, logged, arena, scratch, with_pages(pool))


@njit(cache=True)
def k_commit_give_up(arena, scratch, pool):
    """Commit a logged give-up."""
    commit_give_up(arena, scratch, pool)


@njit(cache=True)
def k_rollback(arena, scratch):
    """Undo a failed logged call (the status says it failed, ``S_LOG_ON`` that it logged)."""
    undo_failed_call(arena, scratch, scratch)


@njit(cache=True)
def k_rollback_paged(arena, scratch, pool):
    """``k_rollback`` on a page pool; also rolls a logged give-up back."""
    undo_failed_call(arena, scratch, pool)


@njit(cache=True)
def k_block_tables(ids, arena, scratch):
    """``block_tables``: returns (status, bad, int32 tables padded with -1)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    resolved = resolve_ids(ids, np.bool_(False), slots, arena, scratch)
    if resolved.status != ST_OK:
        return resolved.status, resolved.bad, np.empty((0, 0), dtype=np.int32)
    out = np.full((ids.shape[0], table_width(slots, arena, scratch)), -1, dtype=np.int32)
    fill_tables(slots, out, arena, scratch)
    return ST_OK, -1, out


@njit(cache=True)
def k_seq_lens(ids, arena, scratch):
    """``seq_lens``: returns (status, bad, int64 lengths)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int64)
    resolved = resolve_ids(ids, np.bool_(False), slots, arena, scratch)
    if resolved.status == ST_OK:
        fill_lens(slots, out, arena, scratch)
    return resolved.status, resolved.bad, out


@njit(cache=True)
def k_set_next_use(blocks, next_use, arena, scratch):
    """``set_next_use`` (the simulator's ``oracle`` policy): returns (status,)."""
    run_set_next_use(blocks, next_use, arena, scratch)
    return (ST_OK,)


@njit(cache=True)
def k_set_tags(blocks, tags, arena, scratch):
    """``set_tags`` (a priority policy's tags): returns (status,)."""
    run_set_tags(blocks, tags, arena, scratch)
    return (ST_OK,)


@njit(cache=True)
def k_set_sequence_tags(ids, tags, arena, scratch):
    """``set_sequence_tags`` (a priority policy's tags by sequence): returns (status, bad)."""
    slots = np.empty(ids.shape[0], dtype=np.int64)
    resolved = resolve_ids(ids, np.bool_(False), slots, arena, scratch)
    if resolved.status == ST_OK:
        run_set_sequence_tags(slots, tags, arena, scratch)
    return resolved.status, resolved.bad


@njit(cache=True)
def k_check(arena, scratch):
    """``check``: returns (0, 0, 0) or the first violation as (code, a, b)."""
    return check(arena, scratch, scratch)


@njit(cache=True)
def k_check_paged(arena, scratch, pool):
    """``check`` of a manager on a page pool (its pages against the pool's owner records)."""
    return check(arena, scratch, pool)


# --- one request at a time (engines that call the manager once per request) -------------------
# Scalars in, scalars out: numba wraps every array argument and result in an object of its own
# at the call boundary, which would dominate a one-request call. So these take the arenas as
# addresses and sizes (``arena_at``), the keys of a keyed prompt as the only array, and (but for
# ``lookup_one``, which returns its hits) carve their one-element inputs, outputs and cache hits
# or slots out of the scratch arena's call room, laid out by ``APPEND_ONE_ROOM`` and
# ``ADMIT_ONE_ROOM`` (``kvnumba._layout``): no allocation.
# The workers are append's and admit's own, for the same types.


@njit(cache=True, inline="always")
def _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes):
    """The two arenas of a one-request call, which passes each as address and size."""
    return arena_at(arena_address, arena_nbytes), arena_at(scratch_address, scratch_nbytes)


@njit(cache=True, inline="always")
def _append_one(seq_id, count, arena, scratch):
    room = call_room(scratch)
    at = APPEND_ONE_AT
    ids = carve(room, at.ids, (1,), np.int64)
    counts = carve(room, at.counts, (1,), np.int64)
    no_tokens = carve(room, at.no_tokens, (0,), np.int64)
    # An append that may stay within one block gets its slots in the room (at least
    # block_size + CALL_ROOM_INPUTS words): the in-block path writes them unconditionally. A
    # longer one gets an empty slot mapping, which the general path leaves unwritten.
    within_a_block = 0 <= count <= block_size_of(arena)
    results = AppendOutputs(
        carve(room, at.slots, (1,), np.int64),
        carve(room, at.slot_mapping, (count if within_a_block else 0,), np.int64),
        carve(room, at.cow_src, (1,), np.int32),
        carve(room, at.cow_dst, (1,), np.int32),
        carve(room, at.ok, (1,), np.bool_),
    )
    ids[0], counts[0], results.ok[0] = seq_id, count, False
    inputs = AppendInputs(ids, counts, no_tokens, np.bool_(False), np.bool_(True))
    outcome = run_append(inputs, results, arena, scratch, scratch)
    status, bad, needed, available = (
        outcome.status,
        outcome.bad,
        outcome.needed,
        outcome.available,
    )
    slot = results.slots[0]
    if status != ST_OK:
        return status, bad, needed, available, 0, 0, -1, -1, slot
    size = length_and_block_size(slot, arena, scratch)
    after = blocks_of(size.length, size.block_size)
    before = blocks_of(size.length - count, size.block_size)
    if outcome.count > 0:
        cow_src, cow_dst = results.cow_src[0], results.cow_dst[0]
        return status, bad, needed, available, before, after, cow_src, cow_dst, slot
    return status, bad, needed, available, before, after, -1, -1, slot


@njit(cache=True)
def k_append_one(seq_id, count, arena_address, arena_nbytes, scratch_address, scratch_nbytes):
    """One sequence grows by ``count`` tokens without ids: returns (status, bad, needed,
    available, blocks before, blocks after, cow_src, cow_dst, slot), -1 for no copy."""
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    return _append_one(seq_id, count, arena, scratch)


@njit(cache=True)
def k_append_one_keys(
    seq_id, count, key_start, keys, arena_address, arena_nbytes, scratch_address, scratch_nbytes
):
    """``k_append_one``, then ``keys`` registered at table positions ``key_start ..`` (full
    blocks once grown; checked before anything is written)."""
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    check = check_key_run(seq_id, count, key_start, keys, arena, scratch)
    if check.status != ST_OK:
        return check.status, check.bad, 0, 0, 0, 0, -1, -1, -1
    result = _append_one(seq_id, count, arena, scratch)
    if result[0] == ST_OK:
        register_key_run(result[_APPEND_ONE_SLOT], key_start, keys, arena, scratch)
    return result


@njit(cache=True, inline="always")
def _admit_one(tokens_in, length, salt, has_tokens, keys, cap, arena, scratch):
    # A prompt's hits fit the call room unless it has more than CALL_ROOM_MAX_HITS blocks (then
    # the batched call runs). Only what the facade uses comes back: a failure is redone by the
    # batched call, which reports it.
    # The workers get the plain scratch arena for ``pool``, as the keyed batched admit passes
    # it, so that the two share them and neither compiles the page code.
    blocks = blocks_of(length, block_size_of(arena))
    room = call_room(scratch)
    if 8 * (CALL_ROOM_INPUTS + blocks) > room.shape[0]:
        return ST_NEED_BUFFERS, -1, 0
    at = ADMIT_ONE_AT
    lengths = carve(room, at.lengths, (1,), np.int64)
    salts = carve(room, at.salts, (1,), np.int64)
    caps = carve(room, at.caps, (1,), np.int64)
    key_counts = carve(room, at.key_counts, (1,), np.int64)
    results = AdmitOutputs(
        carve(room, at.ids, (1,), np.int64),
        carve(room, at.cached, (1,), np.int64),
        carve(room, at.no_slots, (0,), np.int64),  # the facade reads no slot mapping
        carve(room, at.ok, (1,), np.bool_),
        carve(room, at.hits, (1, blocks), np.int64),  # one-request calls: one group
    )
    lengths[0], salts[0], caps[0], key_counts[0] = length, salt, cap, keys.shape[0]
    results.ids[0], results.num_cached_tokens[0], results.ok[0] = -1, 0, False
    prompts = PromptInputs(tokens_in, lengths, salts, has_tokens, np.bool_(True))
    key_rows = KeyRows(keys, key_counts)
    check = validate_admit(prompts, key_rows, caps, np.bool_(True), arena, scratch)
    if check.status != ST_OK:
        return check.status, -1, 0
    pool = scratch
    outcome = run_admit(prompts, key_rows, caps, check.bound, results, arena, scratch, pool)
    return outcome.status, results.ids[0], results.num_cached_tokens[0]


@njit(cache=True)
def k_admit_one(tokens_in, salt, cap, arena_address, arena_nbytes, scratch_address, scratch_nbytes):
    """One prompt with token ids (a manager without engine keys): returns (status, id, cached
    tokens). It passes no keys the way ``k_admit_keys`` takes them, so the two share their
    compiled workers (the token hashes find the hits)."""
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    # Layout "A", as keys are.
    no_keys = carve(call_room(scratch), ADMIT_ONE_AT.no_keys, (0, 4), np.uint64)[::1]
    return _admit_one(
        tokens_in, tokens_in.shape[0], salt, np.bool_(True), no_keys, cap, arena, scratch
    )


@njit(cache=True)
def k_admit_one_keys(
    length, salt, keys, cap, arena_address, arena_nbytes, scratch_address, scratch_nbytes
):
    """One prompt with engine keys and no token ids (all of ``keys`` belong to it): returns
    (status, id, cached tokens). ``keys`` may be strided; keys not of 4 words are refused."""
    if keys.shape[1] != 4:
        return ST_BAD_KEY_COUNT, -1, 0
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    no_tokens = carve(call_room(scratch), ADMIT_ONE_AT.no_tokens, (0,), np.int64)
    return _admit_one(no_tokens, length, salt, np.bool_(False), keys, cap, arena, scratch)


@njit(cache=True, inline="always")
def _lookup_one(tokens_in, length, salt, has_tokens, keys, cap, arena, scratch):
    """``lookup`` of one prompt (its token ids, or its engine keys): returns (status, bad, hit
    blocks). The prompt's cached tokens are not returned: the facade counts the hits."""
    lengths = np.full(1, length, dtype=np.int64)
    salts = np.full(1, salt, dtype=np.int64)
    caps = np.full(1, cap, dtype=np.int64)
    key_rows = KeyRows(keys, np.full(1, keys.shape[0], dtype=np.int64))
    prompts = PromptInputs(tokens_in, lengths, salts, has_tokens, np.bool_(False))
    check = validate_admit(prompts, key_rows, caps, np.bool_(False), arena, scratch)
    # Room for every full block before the last token (a prompt with keys has no more hits
    # than keys).
    most = max(length - 1, 0) // block_size_of(arena) if has_tokens else keys.shape[0]
    hits = np.empty((1, most), dtype=np.int64)
    if check.status != ST_OK:
        return check.status, check.bad, hits[0, :0]
    # ``salts`` takes the cached tokens, which are not returned.
    width = run_lookup(prompts, key_rows, caps, salts, hits, arena, scratch)
    return ST_OK, -1, hits[0, :width]


@njit(cache=True)
def k_lookup_one(
    tokens_in, salt, cap, arena_address, arena_nbytes, scratch_address, scratch_nbytes
):
    """``lookup`` of one prompt by its token ids (a manager without engine keys): returns
    (status, bad, hit blocks). It passes no keys the way ``k_lookup_one_keys`` takes them, so the
    two share their compiled workers (the token hashes find the hits)."""
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    no_keys = carve(call_room(scratch), ADMIT_ONE_AT.no_keys, (0, 4), np.uint64)[::1]
    length = tokens_in.shape[0]
    return _lookup_one(tokens_in, length, salt, np.bool_(True), no_keys, cap, arena, scratch)


@njit(cache=True)
def k_lookup_one_keys(
    length, salt, keys, cap, arena_address, arena_nbytes, scratch_address, scratch_nbytes
):
    """``lookup`` of one prompt with engine keys and no token ids: returns (status, bad, hit
    blocks)."""
    arena, scratch = _arenas(arena_address, arena_nbytes, scratch_address, scratch_nbytes)
    no_tokens = np.empty(0, dtype=np.int64)
    return _lookup_one(no_tokens, length, salt, np.bool_(False), keys, cap, arena, scratch)
