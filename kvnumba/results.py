"""Result types returned by the batched calls and by ``stats()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class AppendResult(NamedTuple):
    """What ``BlockManager.append`` did.

    Attributes
    ----------
    slot_mapping : numpy.ndarray of int64, shape (sum(counts),)
        Physical slot ``block * block_size + offset`` of every appended token, in input order;
        -1 for the tokens of a sequence that failed in non-atomic mode.
    cow_src, cow_dst : numpy.ndarray of int32
        Block copies the engine must perform on the device, in order (``src -> dst``).
    ok : numpy.ndarray of bool, shape (len(ids),)
        Whether each sequence was grown.
    """

    slot_mapping: np.ndarray
    cow_src: np.ndarray
    cow_dst: np.ndarray
    ok: np.ndarray


class AdmitResult(NamedTuple):
    """What ``BlockManager.admit`` did.

    Attributes
    ----------
    ids : numpy.ndarray of int64, shape (num_prompts,)
        The new sequence ids; -1 for a prompt that did not fit (non-atomic mode).
    num_cached_tokens : numpy.ndarray of int64, shape (num_prompts,)
        Prompt tokens served from cached blocks (whole blocks; 0 for a failed prompt).
    slot_mapping : numpy.ndarray of int64
        Physical slot of every prompt token that was not cached, in prompt order; -1 for the
        tokens of a failed prompt.
    ok : numpy.ndarray of bool, shape (num_prompts,)
        Whether each prompt was admitted.
    """

    ids: np.ndarray
    num_cached_tokens: np.ndarray
    slot_mapping: np.ndarray
    ok: np.ndarray


class LookupResult(NamedTuple):
    """What ``BlockManager.lookup`` found (nothing claimed, no state changed).

    Attributes
    ----------
    num_cached_tokens : numpy.ndarray of int64, shape (num_prompts,)
        Prompt tokens that ``admit`` would serve from cached blocks now (whole blocks), prompt
        by prompt as if each were the only one of the call.
    block_ids : numpy.ndarray of int32, shape (num_prompts, width)
        The hit blocks of each prompt in position order, padded with -1; ``width`` is the most
        hits of any prompt (0 for none).
    """

    num_cached_tokens: np.ndarray
    block_ids: np.ndarray


#: ``BlockEvents.kind`` of a block that got registered under a key.
EVENT_STORED = 1
#: ``BlockEvents.kind`` of a registered block that was evicted or unregistered.
EVENT_REMOVED = 2


class BlockEvents(NamedTuple):
    """Block events drained by ``BlockManager.take_events``, in the order they happened.

    Attributes
    ----------
    kind : numpy.ndarray of uint8, shape (n,)
        ``EVENT_STORED`` (1) or ``EVENT_REMOVED`` (2).
    block : numpy.ndarray of int32, shape (n,)
        The block id.
    key : numpy.ndarray of uint64, shape (n, 4)
        The key the block was registered under: the engine's key with ``block_keys=True``,
        else ``(chained hash, 0, 0, 0)``.
    """

    kind: np.ndarray
    block: np.ndarray
    key: np.ndarray


@dataclass(frozen=True)
class Stats:
    """Counters of one manager; ``used + cached + free == num_blocks`` always.

    Attributes
    ----------
    used, cached, free : int
        Blocks referenced by a sequence / held at refcount 0 on the LRU list / empty.
    allocations : int
        Blocks taken from the free list or the cache, copy-on-write blocks included, prefix
        hits not.
    evictions : int
        Cached blocks reclaimed.
    cow_copies : int
        Copy-on-write block copies.
    prefix_queries, prefix_hits : int
        Full prompt blocks looked up / reused by ``admit``.
    mapped_pages : int
        Physical pages this manager holds (0 without a page pool).
    failed_calls : int
        Calls that raised ``PoolExhausted`` or reported a sequence that did not fit
        (``ok == False``); input errors are not counted.
    """

    used: int
    cached: int
    free: int
    allocations: int
    evictions: int
    cow_copies: int
    prefix_queries: int
    prefix_hits: int
    mapped_pages: int
    failed_calls: int
