"""Growing sequences: partial-tail filling, copy-on-write of a shared partial tail, new blocks."""

from typing import NamedTuple

import numpy as np

from kvnumba._kernels.blocks import hand_out, reclaim_tail, register_full_block, take_block
from kvnumba._kernels.geometry import blocks_of, div_block, mod_block
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import Outcome, Status
from kvnumba._kernels.prefix import table_purge_evicted
from kvnumba._kernels.sequences import resolve
from kvnumba._kernels.undo import clear_call_records, log_write, set_logged
from kvnumba._kernels.views import views
from kvnumba._kernels.virtual_pages import free_now
from kvnumba._kernels.windows import drop_window, drops_on_append, has_drops, window_gain_of
from kvnumba._layout import (
    F_KNOWN,
    F_TRIMMED,
    FIELD,
    M_ALLOCATIONS,
    M_CACHED,
    M_COW_COPIES,
    M_FREE_TOP,
    M_MAX_SEQ_LEN,
    M_USED,
    S_EV_N,
    S_EV_PAYLOAD,
    S_FAILED,
    S_LOG_ON,
    S_SHORT,
    S_STAMP,
)
from kvnumba.errors import (
    ST_BAD_TOKEN,
    ST_DUPLICATE_ID,
    ST_NEED_BUFFERS,
    ST_NEGATIVE_COUNT,
    ST_OK,
    ST_POOL_EXHAUSTED,
    ST_TOKEN_MISMATCH,
    ST_TOO_LONG,
)


class AppendInputs(NamedTuple):
    """The request of an ``append``."""

    #: Sequence ids.
    ids: np.ndarray
    #: Tokens appended to each.
    counts: np.ndarray
    #: Their token ids, one sequence after the other (empty without token ids).
    tokens: np.ndarray
    #: Whether ``tokens`` holds the token ids.
    has_tokens: bool
    #: All or nothing.
    atomic: bool


class AppendOutputs(NamedTuple):
    """Where an ``append`` writes its results."""

    #: The slot of every id (written by the validation).
    slots: np.ndarray
    #: The slot of every token appended (empty: a one-request call, which reads none).
    slot_mapping: np.ndarray
    #: Copy-on-write pairs (source, copy); ``cow_src`` first records simulated refcount drops.
    cow_src: np.ndarray
    cow_dst: np.ndarray
    #: Whether each sequence was served (cleared by the caller).
    ok: np.ndarray


class AppendIO(NamedTuple):
    """The arrays that the appends of one call read their tokens from and write to: shared by
    ``append`` and ``admit`` (which computes its prompts' uncached tokens so)."""

    #: Token ids of all sequences of the call (empty without token ids).
    tokens: np.ndarray
    has_tokens: bool
    slot_mapping: np.ndarray
    #: Copy-on-write pairs (none for an admit: its fresh sequences' tails are full or empty).
    cow_src: np.ndarray
    cow_dst: np.ndarray


class Growth(NamedTuple):
    """One sequence's part of a call."""

    #: The sequence's slot.
    slot: int
    #: Tokens appended to it.
    count: int
    #: Its first token in ``AppendIO.tokens``.
    src_offset: int
    #: Its first entry in ``AppendIO.slot_mapping``.
    out_offset: int


@inlined
def blocks_needed(slot, count, ref, block_size, seq_table, seq_len):
    """Blocks that appending ``count`` tokens to ``slot`` takes: new blocks plus a COW block."""
    if count == 0:
        return 0
    length = seq_len[slot]
    need = blocks_of(length + count, block_size) - blocks_of(length, block_size)
    if (
        mod_block(length, block_size) != 0
        and ref[seq_table[slot, div_block(length, block_size)]] > 1
    ):
        need += 1
    return need


@out_of_line
def copy_on_write(v, slot, pos):
    """Give ``slot`` a private copy of its shared partial tail block at ``pos``; returns the
    copy. Once per sequence and call at most, so out of line."""
    tail = v.seq_table[slot, pos]
    # NOTE: the other holders keep the old block, so its payload stays untouched.
    copy = take_block(v)
    fill = v.seq_len[slot] - pos * v.tokens.shape[1]
    for j in range(fill):
        v.tokens[copy, j] = v.tokens[tail, j]
    if (v.block_flags[tail] & F_KNOWN) == 0:
        set_logged(v, v.block_flags, FIELD.block_flags, copy, 0)
    log_write(v, FIELD.seq_table, slot * v.seq_table.shape[1] + pos, tail)
    v.seq_table[slot, pos] = copy
    # The other holders keep the block, so its count stays >= 1: no release path here.
    set_logged(v, v.ref, FIELD.ref, tail, v.ref[tail] - 1)
    v.meta[M_COW_COPIES] += 1
    return copy


@inlined
def append_tokens(v, io, growth, num_cow):
    """Append ``growth.count`` tokens to one sequence whose need the caller has checked.

    Writes the slots to ``io.slot_mapping[growth.out_offset:]`` (none to an empty
    ``slot_mapping``) and a copy-on-write pair, if any, to ``io.cow_src/cow_dst[num_cow]``;
    returns the new number of COW pairs.
    """
    slot, count = growth.slot, growth.count
    src_offset, out_offset = growth.src_offset, growth.out_offset
    src, has_tokens, slot_mapping = io.tokens, io.has_tokens, io.slot_mapping
    if count == 0:
        return num_cow
    ref, block_flags, tokens, seq_table, meta = v.ref, v.block_flags, v.tokens, v.seq_table, v.meta
    block_size = tokens.shape[1]
    width = seq_table.shape[1]
    length = v.seq_len[slot]
    if mod_block(length, block_size) != 0:
        pos = div_block(length, block_size)
        tail = seq_table[slot, pos]
        if ref[tail] > 1:
            io.cow_src[num_cow] = tail
            io.cow_dst[num_cow] = copy_on_write(v, slot, pos)
            num_cow += 1
    # Fill block by block: one take per new block, then a tight loop over its new slots.
    logging = v.scr[S_LOG_ON] != 0
    wants_slots = slot_mapping.shape[0] != 0  # empty: a one-request call reads none
    done = 0
    while done < count:
        p = length + done
        pos = div_block(p, block_size)
        offset = p - pos * block_size
        if offset == 0 and not logging and not has_tokens:
            # Bulk path for a prefill without ids (W-micro, recompute): whole fresh blocks
            # straight off the free stack, counters updated once. Same outcome as the loop below.
            whole = min(div_block(count - done, block_size), meta[M_FREE_TOP])
            if whole > 0:
                top = meta[M_FREE_TOP]
                for q in range(whole):
                    b = v.free_stack[top - 1 - q]
                    ref[b] = 1
                    block_flags[b] = 0
                    seq_table[slot, pos + q] = b
                    if wants_slots:
                        first_slot = b * block_size
                        base = out_offset + done + q * block_size
                        for j in range(block_size):
                            slot_mapping[base + j] = first_slot + j
                meta[M_FREE_TOP] = top - whole
                meta[M_USED] += whole
                meta[M_ALLOCATIONS] += whole
                done += whole * block_size
                continue
        if offset == 0:
            b = take_block(v)
            if logging:
                log_write(v, FIELD.seq_table, slot * width + pos, seq_table[slot, pos])
            seq_table[slot, pos] = b
            if not has_tokens:
                block_flags[b] = 0  # take_block logged the flags it replaced
        else:
            b = seq_table[slot, pos]
            # A tail a truncation cut while it was shared, now this sequence's alone (a
            # shared one was copied above): its content past the fill is not this sequence's.
            if block_flags[b] & F_TRIMMED:
                reclaim_tail(v, b, offset)
            if not has_tokens and block_flags[b] & F_KNOWN:
                set_logged(v, block_flags, FIELD.block_flags, b, block_flags[b] ^ F_KNOWN)
        n = min(count - done, block_size - offset)
        if wants_slots:
            first_slot = b * block_size + offset
            for j in range(n):
                slot_mapping[out_offset + done + j] = first_slot + j
        if has_tokens:
            for j in range(n):
                tokens[b, offset + j] = src[src_offset + done + j]
        done += n
        # A block completed without token ids has unknown content: never hashed.
        if has_tokens and offset + n == block_size:
            parent = seq_table[slot, pos - 1] if pos > 0 else -1
            register_full_block(v, b, parent, v.seq_salt[slot], slot, pos)
    log_write(v, FIELD.seq_len, slot, length)
    v.seq_len[slot] = length + count
    return num_cow


@out_of_line
def append_general(arena, scratch, pool, io, growth, num_cow):
    """:func:`append_tokens`, compiled once and shared by ``append`` and ``admit``: every
    case (several blocks, copy-on-write, registration, eviction, pages, the undo log)."""
    v = views(arena, scratch, pool)
    return append_tokens(v, io, growth, num_cow)


@inlined
def append_in_block(v, io, growth):
    """The common case of a decode step, inline: all ``growth.count`` tokens go into the
    sequence's unshared tail block, or into one block off the free stack. Returns False, having
    changed nothing, for anything else (several blocks, a shared tail, a block completed with
    token ids, which registers it, an empty free stack or a logged call): :func:`append_general`
    does those, with the same outcome. It writes its slots unconditionally (the hot path):
    every caller's ``slot_mapping`` holds them when all the tokens fit in a block.
    """
    slot, count, has_tokens = growth.slot, growth.count, io.has_tokens
    meta = v.meta
    block_size = v.tokens.shape[1]
    length = v.seq_len[slot]
    fill = mod_block(length, block_size)
    if count == 0 or fill + count > block_size or v.scr[S_LOG_ON] != 0:
        return count == 0
    if has_tokens and fill + count == block_size:
        return False
    pos = div_block(length, block_size)
    if fill == 0:
        top = meta[M_FREE_TOP]
        if top == 0:
            return False
        b = v.free_stack[top - 1]
        meta[M_FREE_TOP] = top - 1
        hand_out(v, b, F_KNOWN if has_tokens else 0)
        v.seq_table[slot, pos] = b
    else:
        b = v.seq_table[slot, pos]
        if v.ref[b] > 1 or v.block_flags[b] & F_TRIMMED:
            return False
        if not has_tokens and v.block_flags[b] & F_KNOWN:
            v.block_flags[b] = v.block_flags[b] ^ F_KNOWN
    first_slot = b * block_size + fill
    for j in range(count):
        io.slot_mapping[growth.out_offset + j] = first_slot + j
    if has_tokens:
        for j in range(count):
            v.tokens[b, fill + j] = io.tokens[growth.src_offset + j]
    v.seq_len[slot] = length + count
    return True


@inlined
def validate_growth(v, ids, counts, tokens_in, has_tokens, slots):
    """Check an append request, writing each id's slot; returns a :class:`.Status`.

    Whole-array checks come first (counts, token ids), then each id in input order (unknown or
    released, duplicate, too long), the same order as the reference model.
    """
    if counts.shape[0] != ids.shape[0]:
        return Status(ST_TOKEN_MISMATCH, -1)
    # The sum is compared with len(tokens) without ever exceeding it, so it cannot wrap.
    total = 0
    mismatch = False
    for i in range(ids.shape[0]):
        if counts[i] < 0:
            return Status(ST_NEGATIVE_COUNT, i)
        if has_tokens:
            if counts[i] > tokens_in.shape[0] - total:
                mismatch = True
            else:
                total += counts[i]
    if has_tokens:
        if mismatch or tokens_in.shape[0] != total:
            return Status(ST_TOKEN_MISMATCH, -1)
        for j in range(total):
            if tokens_in[j] < 0:
                return Status(ST_BAD_TOKEN, j)
    stamp = v.scr[S_STAMP] + 1
    v.scr[S_STAMP] = stamp
    max_len = v.meta[M_MAX_SEQ_LEN]
    for i in range(ids.shape[0]):
        found = resolve(v, ids[i])
        if found.status != ST_OK:
            return Status(found.status, i)
        slot = found.slot
        if v.seq_mark[slot] == stamp:
            return Status(ST_DUPLICATE_ID, i)
        v.seq_mark[slot] = stamp
        if counts[i] > max_len - v.seq_len[slot]:
            return Status(ST_TOO_LONG, i)
        slots[i] = slot
    return Status(ST_OK, -1)


@inlined
def total_need(v, slots, counts, dropped):
    """Blocks an append of all ``slots``, served in order, takes.

    A shared partial tail is copied only by holders that still find it shared: once the other
    holders appended earlier in the same call, the last one writes in place. The refcount drops
    of those copies are simulated (``dropped`` records them) and undone before returning.
    """
    ref, seq_table, seq_len = v.ref, v.seq_table, v.seq_len
    block_size = v.tokens.shape[1]
    needed = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        dropped[i] = -1
        needed += blocks_needed(slot, counts[i], ref, block_size, seq_table, seq_len)
        length = seq_len[slot]
        if counts[i] > 0 and mod_block(length, block_size) != 0:
            tail = seq_table[slot, div_block(length, block_size)]
            if ref[tail] > 1:
                ref[tail] -= 1
                dropped[i] = tail
    for i in range(slots.shape[0]):
        if dropped[i] >= 0:
            ref[dropped[i]] += 1
    return needed


@out_of_line
def append_need(ids, counts, slots, dropped, arena, scratch, pool):
    """``can_append``: validate like ``append``, then the blocks an atomic append takes and
    what is available to it (with the blocks its windows release); returns an
    :class:`.Outcome` (its ``count`` is 0)."""
    v = views(arena, scratch, pool)
    check = validate_growth(v, ids, counts, ids[:0], False, slots)
    if check.status != ST_OK:
        return Outcome(check.status, check.bad, 0, 0, 0)
    needed = total_need(v, slots, counts, dropped)
    available = free_now(v) + v.meta[M_CACHED]
    if drops_on_append(v):
        available += window_gain_of(arena, scratch, pool, slots, counts)
    return Outcome(ST_OK, -1, needed, available, 0)


@out_of_line
def run_append(inputs, results, arena, scratch, pool):
    """Validate, then append; returns an :class:`.Outcome` whose ``count`` is the COW pairs.

    ``needed`` is exact when the call did not fit and an upper bound otherwise. Every entry of
    ``results.slot_mapping`` is written (-1 for a sequence that did not fit), unless it is empty
    (a one-request call, which reads no slots); ``results.cow_src`` doubles as the record of
    simulated refcount drops before it receives the copy pairs.
    """
    v = views(arena, scratch, pool)
    counts, atomic = inputs.counts, inputs.atomic
    slots, slot_mapping = results.slots, results.slot_mapping
    check = validate_growth(v, inputs.ids, counts, inputs.tokens, inputs.has_tokens, slots)
    if check.status != ST_OK:
        return Outcome(check.status, check.bad, 0, 0, 0)
    meta, scr = v.meta, v.scr
    block_size = v.tokens.shape[1]
    free = free_now(v)
    available = free + meta[M_CACHED]
    # An upper bound on the need (new blocks plus one copy per sequence) reads no sequence
    # state; only a call that might not fit pays for the exact count.
    needed = 0
    for i in range(slots.shape[0]):
        if counts[i] > 0:
            needed += blocks_of(counts[i], block_size) + 1
    win = drops_on_append(v)
    if needed > available:
        needed = total_need(v, slots, counts, results.cow_src)
        if win:
            # The blocks the call's windows release count for the call.
            available += window_gain_of(arena, scratch, pool, slots, counts)
        if atomic and needed > available:
            scr[S_SHORT] = needed - available
            return Outcome(ST_POOL_EXHAUSTED, -1, needed, available, 0)
    # Evictions happen only once the free stack is empty; the facade grows the record buffers.
    evictions = min(needed, available) - free
    if evictions > v.ev_ids.shape[0] or (scr[S_EV_PAYLOAD] != 0 and evictions > v.ev_tok.shape[0]):
        return Outcome(ST_NEED_BUFFERS, -1, evictions, available, 0)
    # np.int64, not 0: numba would first type the calls below with the literal 0 and compile
    # the callee a second time for it.
    num_cow = np.int64(0)
    clear_call_records(scr)
    io = AppendIO(inputs.tokens, inputs.has_tokens, slot_mapping, results.cow_src, results.cow_dst)
    remaining = free + meta[M_CACHED]
    if win and atomic:
        # Every sequence's out-of-window blocks go before any sequence grows.
        for i in range(slots.shape[0]):
            if counts[i] > 0 and has_drops(v, slots[i], v.seq_len[slots[i]]):
                drop_window(arena, scratch, pool, slots[i], v.seq_len[slots[i]])
    offset = np.int64(0)
    for i in range(slots.shape[0]):
        # An atomic call already knows that everything fits; otherwise each sequence's need is
        # exact when taken just before it is served, against what is left plus what its own
        # window releases.
        need = 0
        gain = 0
        drops = False
        if not atomic:
            need = blocks_needed(slots[i], counts[i], v.ref, block_size, v.seq_table, v.seq_len)
            drops = win and counts[i] > 0 and has_drops(v, slots[i], v.seq_len[slots[i]])
            if drops:
                gain = window_gain_of(arena, scratch, pool, slots[i : i + 1], counts[i : i + 1])
        if need <= remaining + gain:
            if drops:
                drop_window(arena, scratch, pool, slots[i], v.seq_len[slots[i]])
            remaining += gain
            growth = Growth(slots[i], counts[i], offset, offset)
            if not append_in_block(v, io, growth):
                num_cow = append_general(arena, scratch, pool, io, growth, num_cow)
            remaining -= need
            results.ok[i] = True
        else:
            scr[S_FAILED] += 1
            for j in range(counts[i] if slot_mapping.shape[0] != 0 else 0):
                slot_mapping[offset + j] = -1
        offset += counts[i]
    if scr[S_EV_N] > 0:
        table_purge_evicted(v)
    return Outcome(ST_OK, -1, needed, available, num_cow)
