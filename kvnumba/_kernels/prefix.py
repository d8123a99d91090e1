"""Chained content hash and the open-addressing prefix table (linear probing, in arrays).

The table holds the ids of registered blocks. A block evicted during a call is not removed at
once: its entry is overwritten with the mark ``-2 - k`` (``k`` = its eviction record, whose
``ev_hash[k]`` keeps the old hash) and the marks are removed with backward-shift deletion when
the call commits. So every write a logged call makes to the table is a single element, and a
rollback restores the table byte for byte.
"""

import numpy as np

from kvnumba._kernels.events import EVENT_REMOVED, note_event
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import PromptHits
from kvnumba._kernels.undo import set_logged
from kvnumba._layout import EMPTY, FIELD, M_REGISTERED, NIL, S_EV_N

_ROOT = np.uint64(0x6A09E667F3BCC908)  # parent hash of a sequence's first block
_SALT_KEY = np.uint64(0xBB67AE8584CAA73B)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)


@inlined
def mix64(x):
    """The splitmix64 finalizer: a bijective avalanche mix of a uint64."""
    x = (x ^ (x >> np.uint64(30))) * _MIX_1
    x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


@inlined
def root_hash():
    """The parent hash of a sequence's first block."""
    return _ROOT


@inlined
def chain_hash(parent, salt, block_tokens, hash_bits):
    """Hash of one full block chained onto its parent's hash.

    Parameters
    ----------
    parent : uint64
        Hash of the previous block of the sequence (``root_hash()`` for the first block).
    salt : int64
        The sequence's salt.
    block_tokens : int64[block_size]
        The block's token ids.
    hash_bits : int
        Bits to keep (64 in production; fewer only to force collisions in tests).
    """
    h = mix64(parent ^ mix64(np.uint64(salt) ^ _SALT_KEY))
    # One multiply per token (injective in the token for a given state), one full mix at the
    # end: much cheaper than mixing fully after every token.
    for j in range(block_tokens.shape[0]):
        h = (h ^ np.uint64(block_tokens[j])) * _MIX_1
        h ^= h >> np.uint64(29)
    h = mix64(h)
    if hash_bits < 64:
        h &= (_ONE << np.uint64(hash_bits)) - _ONE
    return h


@inlined
def _home(h, mask):
    return np.int64(h & np.uint64(mask))


@inlined
def table_find(v, h, salt, probe):
    """Registered block whose hash, salt and stored tokens all equal the query, or NIL.

    The hash alone is never trusted: a colliding entry whose tokens differ is skipped.
    """
    htab = v.htab
    mask = htab.shape[0] - 1
    i = _home(h, mask)
    bs = probe.shape[0]
    while True:
        e = htab[i]
        if e == EMPTY:
            return NIL
        if e >= 0 and v.block_hash[e] == h and v.block_salt[e] == salt:
            same = True
            for j in range(bs):
                if v.tokens[e, j] != probe[j]:
                    same = False
                    break
            if same:
                return e
        i = (i + 1) & mask


@inlined
def table_insert(v, b, h):
    """Register block ``b`` under hash ``h`` (the caller checked that no equal block is)."""
    mask = v.htab.shape[0] - 1
    i = _home(h, mask)
    while v.htab[i] != EMPTY:
        i = (i + 1) & mask
    set_logged(v, v.htab, FIELD.htab, i, b)
    v.meta[M_REGISTERED] += 1


@inlined
def table_mark_evicted(v, b, h, record):
    """Replace block ``b``'s entry by the mark of eviction record ``record``."""
    mask = v.htab.shape[0] - 1
    i = _home(h, mask)
    while v.htab[i] != b:
        i = (i + 1) & mask
    set_logged(v, v.htab, FIELD.htab, i, -2 - record)
    v.meta[M_REGISTERED] -= 1


@inlined
def _entry_home(e, block_hash, ev_hash, mask):
    if e >= 0:
        return _home(block_hash[e], mask)
    return _home(ev_hash[-2 - e], mask)


@out_of_line
def table_purge_evicted(v):
    """Remove the marks of this call's evictions (backward-shift deletion, no tombstones).

    Runs once per call that evicted, so it is compiled once, out of line.
    """
    htab, block_hash, ev_hash = v.htab, v.block_hash, v.ev_hash
    mask = htab.shape[0] - 1
    for record in range(v.scr[S_EV_N]):
        mark = -2 - record
        i = _home(ev_hash[record], mask)
        while htab[i] != mark:
            i = (i + 1) & mask
        _delete_at(htab, block_hash, ev_hash, i, mask)


@inlined
def _delete_at(htab, block_hash, ev_hash, i, mask):
    """Empty table slot ``i`` by backward-shift deletion (no tombstones)."""
    # Pull later entries of the cluster back into the hole unless their home lies in the
    # cyclic range (hole, position]: then moving them would make them unreachable.
    j = i
    while True:
        j = (j + 1) & mask
        e = htab[j]
        if e == EMPTY:
            break
        k = _entry_home(e, block_hash, ev_hash, mask)
        if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
            htab[i] = e
            i = j
    htab[i] = EMPTY


@out_of_line
def table_remove(v, b):
    """Unregister block ``b`` at once: its entry is deleted, not marked.

    Only for calls that are never rolled back (``truncate``, ``reset_prefix_cache``), which
    validate everything before they write; rare, so out of line.
    """
    htab = v.htab
    mask = htab.shape[0] - 1
    i = _home(v.block_hash[b], mask)
    while htab[i] != b:
        i = (i + 1) & mask
    _delete_at(htab, v.block_hash, v.ev_hash, i, mask)
    v.meta[M_REGISTERED] -= 1
    note_event(v, EVENT_REMOVED, b)


@inlined
def walk_hit(v, hits, walked, pos, b, win):
    """One position ``pos`` of a walk over a prompt's leading blocks, whose lookup found block
    ``b`` (``NIL``: a miss); returns the walk's :class:`.PromptHits` so far and whether it
    goes on. A windowed manager's walk keeps every position's lookup in ``hits[pos]`` (its
    rules decide once all are known); any other walk stops at the first miss and counts the
    hits, and those at refcount 0 (cached blocks the prompt would claim)."""
    if win:
        hits[pos] = b
        return walked, True
    if b < 0:
        return walked, False
    hits[walked.found] = b
    cached = walked.cached + 1 if v.ref[b] == 0 else walked.cached
    return PromptHits(walked.found + 1, cached, walked.queries), True
