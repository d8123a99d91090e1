"""What an integration may read of a manager's state: the public names of ``mgr.state``.

``BlockManager.state`` is a :class:`State` of read-only views of the allocator's arrays (one
field per array, documented on the class). Integrations that mirror the allocator (for example
``kvnumba.integrations.vllm``, which shows vLLM its block pool) read them with the names below
instead of private constants:

- :class:`Meta`: the slots of ``state.meta`` (counters, stack tops, list ends);
- :class:`BlockFlag`: the bits of ``state.block_flags``;
- :data:`NIL`: "no block" in links, list ends and block tables;
- :data:`NULL_BLOCK`: a table entry whose block left a windowed sequence's window;
- :func:`seq_slot`: the row of ``state.seq_table`` (and of the other per-sequence fields) that
  holds a sequence;
- :func:`registered_blocks`: the registered blocks, those of one key in the order lookups try
  them (``cache_duplicates``);
- :func:`free_blocks`: the empty blocks, in the order allocations take them.

Reading is safe between calls; the arrays change only inside a manager's calls.
"""

from __future__ import annotations

import numpy as np

from kvnumba import _layout
from kvnumba._layout import NIL, NULL_BLOCK, State
from kvnumba.ids import slot_bits, split_id

__all__ = [
    "NIL",
    "NULL_BLOCK",
    "BlockFlag",
    "Meta",
    "State",
    "free_blocks",
    "registered_blocks",
    "seq_slot",
    "slot_mask",
]


class Meta:
    """Slots of ``state.meta`` that integrations read (plain ints: ``state.meta[Meta.USED]``)."""

    #: Blocks on the free stack (``state.free_stack[:FREE_TOP]``, the last taken first;
    #: :func:`free_blocks` lists them in that order).
    FREE_TOP = _layout.M_FREE_TOP
    #: Least recently released cached block (under LRU the next evicted), or ``NIL``; follow
    #: ``state.lru_next`` from it: every policy keeps the cached blocks in release order.
    LRU_HEAD = _layout.M_LRU_HEAD
    #: Most recently released cached block, or ``NIL``.
    LRU_TAIL = _layout.M_LRU_TAIL
    #: Blocks with a reference count of at least 1 (reserved blocks not included).
    USED = _layout.M_USED
    #: Blocks with reference count 0 kept in the prefix cache.
    CACHED = _layout.M_CACHED
    #: Live sequences.
    LIVE_SEQS = _layout.M_LIVE_SEQS
    #: Mapped virtual pages (page pools).
    MAPPED = _layout.M_MAPPED


class BlockFlag:
    """Bits of ``state.block_flags`` (plain ints: ``flags & BlockFlag.HASHED``)."""

    #: Every token written to the block came with an id.
    KNOWN = _layout.F_KNOWN
    #: The block is full and has its chained hash or engine key (``state.block_hash``,
    #: ``state.block_key``).
    HASHED = _layout.F_HASHED
    #: The block is registered in the prefix cache under its hash or key: a lookup can hit it
    #: (with ``cache_duplicates``, once the blocks registered before it with that key are gone).
    REGISTERED = _layout.F_REGISTERED


def slot_mask(max_seqs: int) -> int:
    """The mask that takes a sequence id of a manager with ``max_seqs`` to its slot.

    ``seq_id & slot_mask(mgr.max_seqs)`` equals :func:`seq_slot` for every live id of ``mgr``;
    an engine that looks up many ids computes the mask once.
    """
    return (1 << slot_bits(max_seqs)) - 1


def seq_slot(seq_id: int, max_seqs: int) -> int:
    """The row of the per-sequence state fields (``state.seq_table``, ``state.seq_len``, ...)
    that holds sequence ``seq_id`` of a manager with ``max_seqs``.

    The id is not validated: check ``mgr.is_live(seq_id)`` first where it may be stale.
    """
    return split_id(seq_id, max_seqs)[2]


def registered_blocks(state: State) -> np.ndarray:
    """Every registered block, those registered with one key in the order lookups try them.

    With ``cache_duplicates`` several blocks can be registered with one key; a lookup finds
    the one registered first, and the next when that one leaves. Blocks of different keys
    come in no particular order.

    Parameters
    ----------
    state : State
        ``mgr.state``.

    Returns
    -------
    numpy.ndarray of int64
        Block ids, each registered block once.
    """
    htab = np.asarray(state.htab)
    slots = np.flatnonzero(htab >= 0)
    blocks = htab[slots].astype(np.int64)
    mask = htab.shape[0] - 1
    # Blocks of one key share a home slot and sit in the order they were registered along the
    # probe path from it (backward-shift deletion keeps that order): sort by probe distance.
    home = (np.asarray(state.block_hash)[blocks] & np.uint64(mask)).astype(np.int64)
    distance = (slots - home) & mask
    return blocks[np.argsort(distance, kind="stable")]


def free_blocks(state: State) -> np.ndarray:
    """The empty blocks, in the order allocations take them (the free stack from its top).

    Allocations take these before they evict a cached block. With a page pool there are none
    here: a page's free blocks are on its own list.

    Parameters
    ----------
    state : State
        ``mgr.state``.

    Returns
    -------
    numpy.ndarray of int64
        Block ids, the first taken first.
    """
    top = int(state.meta[Meta.FREE_TOP])
    return np.asarray(state.free_stack)[:top][::-1].astype(np.int64)
