"""Engine block keys (``block_keys=True``): lookup and registration under 256-bit keys.

An engine that hashes blocks itself (vLLM: sha256 over the parent's hash, the tokens and extra
keys) hands kvnumba one 256-bit key per full block. The key replaces the chained token hash: a
block's table home is key word 0 (masked like a token hash, so tests can force collisions), and
a match compares all four words, the salt and, when both sides know them, the tokens. The
prefix table, its marks and the rollback are the token mode's unchanged.
"""

from typing import NamedTuple

import numpy as np

from kvnumba._kernels.events import EVENT_STORED, note_event
from kvnumba._kernels.eviction import policy_registered
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import Outcome, PromptHits, Status
from kvnumba._kernels.prefix import table_insert, walk_hit
from kvnumba._kernels.sequences import resolve, resolve_ids
from kvnumba._kernels.undo import clear_call_records, log_write, set_logged
from kvnumba._kernels.views import views
from kvnumba._kernels.windows import drops_on_append, first_needed, windowed
from kvnumba._layout import (
    EMPTY,
    F_HASHED,
    F_KNOWN,
    F_REGISTERED,
    FIELD,
    M_CACHE_DUPLICATES,
    M_HASH_BITS,
    M_KEYED,
    M_PREFIX_CACHING,
    NIL,
    NULL_BLOCK,
)
from kvnumba.errors import ST_BAD_KEY_COUNT, ST_BAD_KEY_POSITION, ST_KEY_CONFLICT, ST_OK

_ONE = np.uint64(1)


class KeyRuns(NamedTuple):
    """A ``set_keys`` call: sequence ``i`` (at slot ``slots[i]``) gives its table positions
    ``starts[i] .. starts[i] + counts[i] - 1`` the next ``counts[i]`` rows of ``keys``."""

    starts: np.ndarray
    counts: np.ndarray
    slots: np.ndarray
    keys: np.ndarray


@inlined
def key_hash(keys, row, hash_bits):
    """Table hash of key ``keys[row]``: word 0, cut to ``hash_bits`` like a token hash."""
    h = keys[row, 0]
    if hash_bits < 64:
        h &= (_ONE << np.uint64(hash_bits)) - _ONE
    return h


@inlined
def _same_key(v, e, salt, keys, row, probe, has_probe):
    """Whether registered block ``e`` matches: all four key words, the salt and, when the
    query and the block both know them, the tokens."""
    if v.block_salt[e] != salt:
        return False
    for w in range(4):
        if v.block_key[e, w] != keys[row, w]:
            return False
    if has_probe and (v.block_flags[e] & F_KNOWN) != 0:
        for j in range(probe.shape[0]):
            if v.tokens[e, j] != probe[j]:
                return False
    return True


@inlined
def table_find_key(v, h, salt, keys, row, probe, has_probe):
    """Registered block matching key ``keys[row]`` (see :func:`_same_key`), or -1."""
    htab = v.htab
    mask = htab.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while htab[i] != EMPTY:
        e = htab[i]
        # Negative entries are marks of blocks evicted during this call.
        if e >= 0 and v.block_hash[e] == h and _same_key(v, e, salt, keys, row, probe, has_probe):
            return e
        i = (i + 1) & mask
    return NIL


@inlined
def lookup_keys(v, keys, row, salt, prompt, length, has_tokens, limit, hits):
    """Registered blocks matching the prompt's leading keys, in order, into ``hits``.

    The prompt (``length`` tokens) has its keys from ``keys[row]`` on; ``limit`` blocks are
    looked up at most (its keys, the last prompt token, which is always computed, and the
    caller's cap: see ``prompt_hits``); the walk stops at the first miss, but for a windowed
    manager, which looks up every position and whose rules then decide
    (``windowed_prompt_hits``, called by ``prompt_hits``). ``prompt`` holds the prompt's
    tokens when ``has_tokens``. Returns the :class:`.PromptHits`.
    """
    if v.meta[M_PREFIX_CACHING] == 0:
        return PromptHits(0, 0, limit)
    block_size = v.tokens.shape[1]
    walked = PromptHits(0, 0, limit)
    win = windowed(v)
    for pos in range(limit):
        probe = prompt[pos * block_size : (pos + 1) * block_size] if has_tokens else prompt[:0]
        h = key_hash(keys, row + pos, v.meta[M_HASH_BITS])
        b = table_find_key(v, h, salt, keys, row + pos, probe, has_tokens)
        walked, go_on = walk_hit(v, hits, walked, pos, b, win)
        if not go_on:
            break
    return walked


@out_of_line
def register_key(v, slot, pos, keys, row, salt):
    """Give the full block at table position ``pos`` of sequence slot ``slot`` the key
    ``keys[row]`` and register it unless a matching block is registered (then the first one
    stays, as in token mode); the block before it is its parent for a prefix-aware eviction
    policy. Logged writes: an atomic admit of several prompts may roll it back."""
    b = v.seq_table[slot, pos]
    flags = v.block_flags
    if v.meta[M_PREFIX_CACHING] == 0 or (flags[b] & F_HASHED) != 0:
        return
    h = key_hash(keys, row, v.meta[M_HASH_BITS])
    hashes = v.block_hash.view(np.int64)
    log_write(v, FIELD.block_hash, b, hashes[b])
    v.block_hash[b] = h
    stored = v.block_key.view(np.int64)
    for w in range(4):
        log_write(v, FIELD.block_key, 4 * b + w, stored[b, w])
        v.block_key[b, w] = keys[row, w]
    set_logged(v, v.block_salt, FIELD.block_salt, b, salt)
    new_flags = flags[b] | F_HASHED
    # One registered block per key and salt (what an engine's key means), whatever the tokens:
    # a block whose key is registered keeps the key, unregistered (``cache_duplicates``: it is
    # registered after the first, which lookups find while it stays).
    if (
        v.meta[M_CACHE_DUPLICATES] != 0
        or table_find_key(v, h, salt, keys, row, v.tokens[b], False) < 0
    ):
        new_flags |= F_REGISTERED
        table_insert(v, b, h)
    set_logged(v, flags, FIELD.block_flags, b, new_flags)
    if new_flags & F_REGISTERED:
        note_event(v, EVENT_STORED, b)
        prev = v.seq_table[slot, pos - 1] if pos > 0 else NIL
        policy_registered(v, b, prev, 0, pos)


@inlined
def keyed(v):
    """Whether the manager registers blocks under engine keys."""
    return v.meta[M_KEYED] != 0


@inlined
def _same_words(a, b):
    for w in range(4):
        if a[w] != b[w]:
            return False
    return True


@out_of_line
def _keyed_twice(v, runs, i, pos, row):
    """Whether an earlier row of this ``set_keys`` call gives the block at position ``pos`` of
    sequence ``i`` (key row ``row``) a different key; only asked for shared blocks, so rarely."""
    keys = runs.keys
    b = v.seq_table[runs.slots[i], pos]
    earlier = 0
    for j in range(i + 1):
        for q in range(runs.starts[j], runs.starts[j] + runs.counts[j]):
            if earlier == row:
                return False
            if v.seq_table[runs.slots[j], q] == b and not _same_words(keys[earlier], keys[row]):
                return True
            earlier += 1
    return False


@out_of_line
def run_set_keys(ids, starts, counts, keys, slots, arena, scratch):
    """Give sequence ``ids[i]``'s blocks at positions ``starts[i] .. starts[i] + counts[i] - 1``
    the next ``counts[i]`` keys and register them; returns an :class:`.Outcome` whose
    ``count`` is the blocks registered.

    Everything is validated before the first write (ids as ``release``; positions inside the
    sequence's full blocks; one key row per position; a block that has a key already must
    have the same one), so the call is never rolled back. A block keyed earlier in the same
    call (shared by two of its sequences) keeps its first key.
    """
    n = ids.shape[0]
    if starts.shape[0] != n or counts.shape[0] != n:
        return Outcome(ST_BAD_KEY_COUNT, -1, 0, 0, 0)
    resolved = resolve_ids(ids, True, slots, arena, scratch)
    if resolved.status != ST_OK:
        return Outcome(resolved.status, resolved.bad, 0, 0, 0)
    v = views(arena, scratch, scratch)
    block_size = v.tokens.shape[1]
    rows = 0
    for i in range(n):
        full = v.seq_len[slots[i]] // block_size
        if starts[i] < 0 or counts[i] < 0 or counts[i] > full - starts[i]:
            return Outcome(ST_BAD_KEY_POSITION, i, 0, 0, 0)
        if counts[i] > 0 and v.seq_table[slots[i], starts[i]] == NULL_BLOCK:
            return Outcome(ST_BAD_KEY_POSITION, i, 0, 0, 0)  # left the window (a prefix)
        rows += counts[i]
    if rows != keys.shape[0]:
        return Outcome(ST_BAD_KEY_COUNT, -1, 0, 0, 0)
    runs = KeyRuns(starts, counts, slots, keys)
    row = 0
    for i in range(n):
        for pos in range(starts[i], starts[i] + counts[i]):
            b = v.seq_table[slots[i], pos]
            if (v.block_flags[b] & F_HASHED) != 0:
                if not _same_words(v.block_key[b], keys[row]):
                    return Outcome(ST_KEY_CONFLICT, i, 0, 0, 0)
            elif v.ref[b] > 1 and _keyed_twice(v, runs, i, pos, row):
                # A shared block is given another key by an earlier row of this call.
                return Outcome(ST_KEY_CONFLICT, i, 0, 0, 0)
            row += 1
    clear_call_records(v.scr)
    registered = 0
    row = 0
    for i in range(n):
        salt = v.seq_salt[slots[i]]
        for pos in range(starts[i], starts[i] + counts[i]):
            b = v.seq_table[slots[i], pos]
            before = v.block_flags[b] & F_REGISTERED
            register_key(v, slots[i], pos, keys, np.int64(row), salt)
            if before == 0 and (v.block_flags[b] & F_REGISTERED) != 0:
                registered += 1
            row += 1
    return Outcome(ST_OK, -1, 0, 0, registered)


@out_of_line
def check_key_run(seq_id, count, start, keys, arena, scratch):
    """Whether ``keys`` may go to table positions ``start ..`` of sequence ``seq_id`` once it
    has grown by ``count`` tokens: a :class:`.Status`. Read only; an unknown id or a bad count is
    left to the append's own validation (ST_OK here)."""
    v = views(arena, scratch, scratch)
    found = resolve(v, seq_id)
    if found.status != ST_OK or count < 0:
        return Status(ST_OK, -1)
    slot = found.slot
    block_size = v.tokens.shape[1]
    length = v.seq_len[slot]
    full = (length + count) // block_size
    if start < 0 or keys.shape[0] > full - start:
        return Status(ST_BAD_KEY_POSITION, 0)
    held = (length + block_size - 1) // block_size
    # A windowed append first releases the blocks below its sequence's first needed position.
    if (
        count > 0
        and drops_on_append(v)
        and keys.shape[0] > 0
        and start < first_needed(v, slot, length)
    ):
        return Status(ST_BAD_KEY_POSITION, 0)
    for r in range(keys.shape[0]):
        pos = start + r
        if pos < held:
            b = v.seq_table[slot, pos]
            if b == NULL_BLOCK:
                return Status(ST_BAD_KEY_POSITION, 0)
            if (v.block_flags[b] & F_HASHED) != 0 and not _same_words(v.block_key[b], keys[r]):
                return Status(ST_KEY_CONFLICT, 0)
    return Status(ST_OK, -1)


@out_of_line
def register_key_run(slot, start, keys, arena, scratch):
    """Register ``keys`` at table positions ``start ..`` of sequence slot ``slot`` (checked
    by :func:`check_key_run` before the append that made them full)."""
    v = views(arena, scratch, scratch)
    salt = v.seq_salt[slot]
    for r in range(keys.shape[0]):
        register_key(v, slot, start + r, keys, np.int64(r), salt)
