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
    """What ``BlockManager.lookup`` found (nothing claimed).

    Attributes
    ----------
    num_cached_tokens : numpy.ndarray of int64, shape (num_prompts,)
        Prompt tokens ``admit`` would serve from cached blocks now (whole blocks).
    block_ids : numpy.ndarray of int32, shape (num_prompts, width)
        The hit blocks of each prompt, in order, padded with -1; ``width`` is the most hits.
    """

    num_cached_tokens: np.ndarray
    block_ids: np.ndarray


class _BlockEventFields(NamedTuple):
    kind: np.ndarray
    block: np.ndarray
    key: np.ndarray


class BlockEvents(_BlockEventFields):
    """Block events drained by ``BlockManager.take_events``, in the order they happened.

    Attributes
    ----------
    kind : numpy.ndarray of uint8, shape (n,)
        ``STORED`` (1): the block was registered under ``key``; ``REMOVED`` (2): a registered
        block was evicted or unregistered.
    block : numpy.ndarray of int32, shape (n,)
        The block id.
    key : numpy.ndarray of uint64, shape (n, 4)
        Its engine key (``block_keys``), or its chained hash and three zero words.
    """

    __slots__ = ()

    STORED = 1
    REMOVED = 2


@dataclass(frozen=True)
class Stats:
    """Counters of one manager; ``used + cached + free == num_blocks`` always.

    Attributes
    ----------
    used, cached, free : int
        Blocks referenced by a sequence or reserved (``reserved_blocks``) / held at refcount 0
        on the LRU list / empty.
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
