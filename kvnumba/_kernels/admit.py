"""Admitting prompts: longest cached prefix first, then the rest appended like ``append``."""

from typing import NamedTuple

import numpy as np

from kvnumba._kernels.append import AppendIO, Growth, append_general
from kvnumba._kernels.blocks import claim_cached
from kvnumba._kernels.eviction import policy_hit
from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.keys import lookup_keys, register_key
from kvnumba._kernels.outcomes import Outcome, PromptHits, Status
from kvnumba._kernels.prefix import (
    chain_hash,
    root_hash,
    table_find,
    table_purge_evicted,
    walk_hit,
)
from kvnumba._kernels.sequences import open_slot, resolve
from kvnumba._kernels.undo import (
    clear_call_records,
    log_write,
    policy_log_rows_kernel,
    start_log,
    undo_log_rows_kernel,
)
from kvnumba._kernels.views import views
from kvnumba._kernels.virtual_pages import free_now
from kvnumba._kernels.windows import anchor_of, group_salt, window_hits_of, windowed
from kvnumba._layout import (
    FIELD,
    M_CACHED,
    M_GROUPS,
    M_HASH_BITS,
    M_KEYED,
    M_MAX_SEQ_LEN,
    M_PAGE_K,
    M_POLICY,
    M_PREFIX_CACHING,
    M_PREFIX_HITS,
    M_PREFIX_QUERIES,
    M_SLOT_TOP,
    S_EV_N,
    S_EV_PAYLOAD,
    S_FAILED,
    S_LOG_ON,
    S_SAVED_PAYLOAD,
    S_SHORT,
)
from kvnumba.errors import (
    ST_BAD_CAP,
    ST_BAD_KEY_COUNT,
    ST_BAD_LENGTH,
    ST_BAD_TOKEN,
    ST_NEED_BUFFERS,
    ST_OK,
    ST_POOL_EXHAUSTED,
    ST_TOKEN_MISMATCH,
    ST_TOO_LONG,
    ST_TOO_MANY_SEQS,
)


class PromptInputs(NamedTuple):
    """The prompts of an admit or a lookup."""

    #: Every prompt's token ids, one after the other (empty without token ids).
    tokens: np.ndarray
    #: Tokens of every prompt.
    lengths: np.ndarray
    #: Prefix-cache salt of every prompt.
    salts: np.ndarray
    #: Whether ``tokens`` holds the token ids (False: engine keys only).
    has_tokens: bool
    #: All or nothing (an admit's; a lookup's is False and unread).
    atomic: bool


class KeyRows(NamedTuple):
    """The engine keys of an admit or a lookup: prompt ``p``'s ``counts[p]`` keys follow those
    of the prompts before it in ``keys``."""

    keys: np.ndarray
    counts: np.ndarray


class AdmitOutputs(NamedTuple):
    """Where an admit writes its results."""

    #: New sequence id of every prompt in every KV cache group, ``ids[p * groups + g]``
    #: (filled with -1 by the caller).
    ids: np.ndarray
    #: Cached tokens of every prompt (filled with 0 by the caller).
    num_cached_tokens: np.ndarray
    #: Slots of the computed tokens of every prompt (empty: ``admit_one`` reads none).
    slot_mapping: np.ndarray
    #: Whether each prompt was admitted.
    ok: np.ndarray
    #: Room for one prompt's hit blocks: one row per KV cache group.
    hits: np.ndarray


class PromptCheck(NamedTuple):
    """The verdict of :func:`validate_admit`, and the sizes of a valid request."""

    status: int
    bad: int
    #: Tokens to compute at most, over all KV cache groups (the slot mapping's size).
    total: int
    #: Blocks of all prompts in all groups (an upper bound on what the call takes).
    bound: int
    #: Blocks of the longest prompt (the hits' room per group).
    longest: int


@out_of_line
def lookup_prefix(v, prompt, salt, limit, hits):
    """Registered blocks matching the prompt's leading full blocks, in order, into ``hits``.

    At most ``limit`` blocks are looked up (the caller's cap, never more than
    ``(len(prompt) - 1) // block_size``: the last prompt token is always computed); the walk
    stops at the first miss, but for a windowed manager, which looks up every position and
    whose rules then decide (``windowed_prompt_hits``, called by :func:`prompt_hits`). Returns the :class:`.PromptHits`. Once per prompt, out of line.
    """
    if v.meta[M_PREFIX_CACHING] == 0:
        return PromptHits(0, 0, limit)
    block_size = v.tokens.shape[1]
    parent = root_hash()
    walked = PromptHits(0, 0, limit)
    win = windowed(v)
    for pos in range(limit):
        chunk = prompt[pos * block_size : (pos + 1) * block_size]
        h = chain_hash(parent, salt, chunk, v.meta[M_HASH_BITS])
        walked, go_on = walk_hit(v, hits, walked, pos, table_find(v, h, salt, chunk), win)
        if not go_on:
            break
        parent = h
    return walked


@inlined
def prompt_hits(v, prompts, key_rows, caps, p, start, row, hits):
    """Cache hits of prompt ``p`` (token hashes from ``prompts.tokens[start:]``, or its keys
    from ``key_rows`` row ``row``), as :class:`.PromptHits`; row ``g`` of ``hits`` gets KV
    cache group ``g``'s blocks. ``key_rows`` and ``caps`` are None when not given: numba prunes
    those branches, so a token-mode admit compiles without the key code."""
    length = prompts.lengths[p]
    prompt = prompts.tokens[start : start + length]
    limit = (length - 1) // v.tokens.shape[1]
    if caps is not None:
        limit = min(limit, caps[p])
    found = PromptHits(0, 0, limit)
    for g in range(v.meta[M_GROUPS]):
        salt = group_salt(v, prompts.salts[p], g)
        if key_rows is None:
            found = lookup_prefix(v, prompt, salt, limit, hits[g])
        elif v.meta[M_KEYED] == 0:
            # A token-mode manager's admit with caps takes the keyed kernel with no keys (one
            # compiled admit fewer): its blocks are found by their token hashes.
            found = lookup_prefix(v, prompt, salt, limit, hits[g])
        else:
            found = lookup_keys(
                v,
                key_rows.keys,
                row,
                salt,
                prompt,
                length,
                prompts.has_tokens,
                min(limit, key_rows.counts[p]),
                hits[g],
            )
    if windowed(v) and v.meta[M_PREFIX_CACHING] != 0:
        # Every position looked up in every group: the groups' rules decide together.
        return window_hits_of(v.arena, v.scratch, v.pool, hits, found.queries)
    return found


@inlined
def validate_keys(lengths, block_size, key_rows, caps):
    """The :class:`.Status` of the key counts and hit caps of an admit or lookup."""
    if caps is not None:
        if caps.shape[0] != lengths.shape[0]:
            return Status(ST_BAD_CAP, -1)
        for p in range(caps.shape[0]):
            if caps[p] < 0:
                return Status(ST_BAD_CAP, p)
    if key_rows is not None:
        key_counts = key_rows.counts
        if key_counts.shape[0] != lengths.shape[0]:
            return Status(ST_BAD_KEY_COUNT, -1)
        rows = 0
        for p in range(lengths.shape[0]):
            if key_counts[p] < 0 or key_counts[p] > max(lengths[p], 0) // block_size:
                return Status(ST_BAD_KEY_COUNT, p)
            rows += key_counts[p]
        if rows != key_rows.keys.shape[0]:
            return Status(ST_BAD_KEY_COUNT, -1)
    return Status(ST_OK, -1)


@out_of_line
def validate_admit(prompts, key_rows, caps, opens_sequences, arena, scratch):
    """Check an admit (or lookup) request; returns a :class:`PromptCheck`.

    Value errors first, then too long, then too many, as the reference model. Validation takes
    precedence over capacity and changes nothing. Without token ids (``has_tokens`` False,
    engine keys only) ``prompts.tokens`` is empty and the prompts' lengths are their sizes. A
    lookup (``opens_sequences`` False) needs no free sequence slot.
    """
    v = views(arena, scratch, scratch)
    tokens_in, lengths, has_tokens = prompts.tokens, prompts.lengths, prompts.has_tokens
    max_len = v.meta[M_MAX_SEQ_LEN]
    num_prompts = lengths.shape[0]
    block_size = v.tokens.shape[1]
    total = 0
    mismatch = False
    bound = 0
    longest = 0
    for p in range(num_prompts):
        if lengths[p] < 1:
            return PromptCheck(ST_BAD_LENGTH, p, 0, 0, 0)
        # Compared with len(tokens) without ever exceeding it, so the sum cannot wrap.
        if not has_tokens:
            total += min(lengths[p], max_len + 1)
        elif lengths[p] > tokens_in.shape[0] - total:
            mismatch = True
        else:
            total += lengths[p]
        # A prompt beyond max_seq_len is rejected below; clamping keeps the bound from wrapping.
        blocks = blocks_of(min(lengths[p], max_len + 1), block_size)
        bound += blocks
        longest = max(longest, blocks)
    if (
        has_tokens
        and (mismatch or total != tokens_in.shape[0])
        or prompts.salts.shape[0] != num_prompts
    ):
        return PromptCheck(ST_TOKEN_MISMATCH, -1, 0, 0, 0)
    for j in range(tokens_in.shape[0]):
        if tokens_in[j] < 0:
            return PromptCheck(ST_BAD_TOKEN, j, 0, 0, 0)
    keys_status = validate_keys(lengths, block_size, key_rows, caps)
    if keys_status.status != ST_OK:
        return PromptCheck(keys_status.status, keys_status.bad, 0, 0, 0)
    for p in range(num_prompts):
        if lengths[p] > max_len:
            return PromptCheck(ST_TOO_LONG, p, 0, 0, 0)
    # Each prompt opens a sequence in every KV cache group, all of the same length.
    groups = v.meta[M_GROUPS]
    if opens_sequences and num_prompts * groups > v.meta[M_SLOT_TOP]:
        return PromptCheck(ST_TOO_MANY_SEQS, -1, 0, 0, 0)
    return PromptCheck(ST_OK, -1, total * groups, bound * groups, longest)


@out_of_line
def run_admit(prompts, key_rows, caps, bound, results, arena, scratch, pool):
    """Admit validated prompts (``bound``: their blocks, from :func:`validate_admit`); returns
    an :class:`.Outcome` whose ``count`` is the slot-mapping entries written.

    ``results.ids`` arrives filled with -1 and ``results.num_cached_tokens`` with 0; every entry
    of ``results.slot_mapping`` up to the returned count is written (none of an empty one:
    ``admit_one``); ``results.hits`` has room for one sequence's blocks. ``key_rows`` is None or
    the :class:`KeyRows` of engine keys; ``caps`` None or the per-prompt caps on hit blocks.
    """
    v = views(arena, scratch, pool)
    lengths, salts = prompts.lengths, prompts.salts
    has_tokens, atomic = prompts.has_tokens, prompts.atomic
    ids, num_cached_tokens = results.ids, results.num_cached_tokens
    slot_mapping, ok, hits = results.slot_mapping, results.ok, results.hits
    meta, scr = v.meta, v.scr
    num_prompts = lengths.shape[0]
    block_size = v.tokens.shape[1]
    width = v.seq_table.shape[1]
    free = free_now(v)
    available = free + meta[M_CACHED]
    # Later prompts depend on what earlier ones did, so an atomic call of several prompts keeps
    # an undo log; any other call checks each prompt's exact need before it writes anything.
    # A call whose prompts' blocks all fit in what is available cannot fail: every prompt
    # consumes at most its blocks (new ones plus the cached hits it claims).
    logged = atomic and num_prompts > 1 and bound > available
    evictions = min(bound, available) - free
    payload = logged or scr[S_EV_PAYLOAD] != 0
    log_size = undo_log_rows_kernel(bound, num_prompts, meta[M_PAGE_K], v.page_phys.shape[0])
    log_size += policy_log_rows_kernel(meta[M_POLICY], v.ref.shape[0], bound, meta[M_CACHED])
    if (
        evictions > v.ev_ids.shape[0]
        or (payload and evictions > v.ev_tok.shape[0])
        or (logged and log_size > v.ulog.shape[0])
    ):
        return Outcome(ST_NEED_BUFFERS, -1, bound, available, 0)
    saved_payload_flag = scr[S_EV_PAYLOAD]
    if logged:
        start_log(v)
    clear_call_records(scr)
    # A fresh sequence's tail is full or empty, so an admit writes no copy-on-write pairs: any
    # empty int32 vector will do (one of the views, allocating nothing).
    no_pairs = v.ref[:0]
    io = AppendIO(prompts.tokens, has_tokens, slot_mapping, no_pairs, no_pairs)
    out = np.int64(0)  # not literals: see run_append
    start = np.int64(0)  # the prompt's first token in prompts.tokens (stays 0 without token ids)
    row = np.int64(0)  # the prompt's first key row
    needed = np.int64(0)
    groups = meta[M_GROUPS]
    for p in range(num_prompts):
        length = lengths[p]
        found = prompt_hits(v, prompts, key_rows, caps, p, start, row, hits)
        num_hits, cached_hits = found.found, found.cached
        need = groups * (blocks_of(length, block_size) - num_hits)
        if need > free_now(v) + meta[M_CACHED] - cached_hits:
            if not atomic:
                scr[S_FAILED] += 1
                for j in range(groups * length if slot_mapping.shape[0] != 0 else 0):
                    slot_mapping[out + j] = -1
                out += groups * length
                start += length if has_tokens else 0
                row += 0 if key_rows is None else key_rows.counts[p]
                continue
            # Report what the whole call would take, later prompts looked up as things stand,
            # and what it lacks here: this prompt's cached hits use up capacity too.
            needed += need
            short = need - (free_now(v) + meta[M_CACHED] - cached_hits)
            later = start + length if has_tokens else start
            q_row = row + (0 if key_rows is None else key_rows.counts[p])
            for q in range(p + 1, num_prompts):
                q_hits = prompt_hits(v, prompts, key_rows, caps, q, later, q_row, hits).found
                needed += groups * (blocks_of(lengths[q], block_size) - q_hits)
                short += groups * (blocks_of(lengths[q], block_size) - q_hits)
                later += lengths[q] if has_tokens else 0
                q_row += 0 if key_rows is None else key_rows.counts[q]
            scr[S_SHORT] = short
            if logged:
                # The log stays on: the facade undoes the call (``k_rollback``), so that a
                # program whose logged calls never fail never compiles the replay.
                scr[S_SAVED_PAYLOAD] = saved_payload_flag
            ids[:] = -1
            for q in range(num_prompts):
                num_cached_tokens[q] = 0
                ok[q] = False
            return Outcome(ST_POOL_EXHAUSTED, p, needed, available, 0)
        needed += need
        cached = num_hits * block_size
        # Every group claims its hits before any grows: no group's new blocks may evict
        # another group's hits.
        for g in range(groups):
            opened = open_slot(v, group_salt(v, salts[p], g))
            slot = opened.slot
            ids[p * groups + g] = opened.seq_id
            claimed = 0
            for pos in range(num_hits):
                b = hits[g, pos]
                log_write(v, FIELD.seq_table, slot * width + pos, v.seq_table[slot, pos])
                v.seq_table[slot, pos] = b
                if b < 0:
                    continue  # NULL_BLOCK: a windowed prompt does not need this block
                policy_hit(v, b)
                if v.ref[b] == 0:
                    claim_cached(v, b)
                log_write(v, FIELD.ref, b, v.ref[b])
                v.ref[b] += 1
                claimed += 1
            if windowed(v):
                tail = prompts.tokens[start:]
                anchor_of(arena, scratch, pool, tail, has_tokens, slot, num_hits - claimed)
            log_write(v, FIELD.seq_len, slot, v.seq_len[slot])
            v.seq_len[slot] = cached
            if meta[M_PREFIX_CACHING] != 0:
                meta[M_PREFIX_QUERIES] += found.queries  # the cap and the keys bound it
                meta[M_PREFIX_HITS] += claimed
        for g in range(groups):
            slot = resolve(v, ids[p * groups + g]).slot
            # ``has_tokens`` is a run-time bool: the same compiled append_general as append's,
            # not a copy specialised on a constant.
            growth = Growth(slot, length - cached, start + cached, out)
            append_general(arena, scratch, pool, io, growth, np.int64(0))
            if key_rows is not None:
                salt = v.seq_salt[slot]
                for pos in range(num_hits, key_rows.counts[p]):
                    register_key(v, slot, pos, key_rows.keys, row + pos, salt)
            out += length - cached
        if key_rows is not None:
            row += key_rows.counts[p]
        num_cached_tokens[p] = cached
        ok[p] = True
        start += length if has_tokens else 0
    scr[S_LOG_ON] = 0
    scr[S_EV_PAYLOAD] = saved_payload_flag
    if scr[S_EV_N] > 0:
        table_purge_evicted(v)
    return Outcome(ST_OK, -1, needed, available, out)


@out_of_line
def run_lookup(prompts, key_rows, caps, num_cached_tokens, hits, arena, scratch):
    """Hits of validated prompts as ``admit`` would find them, claiming nothing; returns the
    most hits of any prompt. Row ``p * groups + g`` of ``hits`` gets prompt ``p``'s hit blocks
    in KV cache group ``g``, padded with -1. Reads the state only: no LRU move, no counter."""
    v = views(arena, scratch, scratch)
    lengths = prompts.lengths
    block_size = v.tokens.shape[1]
    groups = v.meta[M_GROUPS]
    start = np.int64(0)
    row = np.int64(0)
    width = 0
    for p in range(lengths.shape[0]):
        rows = hits[p * groups : (p + 1) * groups]
        found = prompt_hits(v, prompts, key_rows, caps, p, start, row, rows).found
        for g in range(groups):
            for pos in range(found, hits.shape[1]):
                rows[g, pos] = -1
        num_cached_tokens[p] = found * block_size
        width = max(width, found)
        start += lengths[p] if prompts.has_tokens else 0
        row += 0 if key_rows is None else key_rows.counts[p]
    return width
