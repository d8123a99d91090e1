"""Cached blocks that no prompt can hit: their prefix's previous block is no longer cached.

A prefix lookup walks a prompt's blocks from the first and stops at the first miss, so a
cached block (registered, refcount 0) whose parent (the previous block of the prompt it was
computed for) is registered nowhere in the manager can never be hit until that parent's
content is cached again. Such blocks waste the pool; how many a policy leaves behind tells how
well it respects prefix chains (``leaf-lru`` and ``oracle`` evict leaves first, see
``docs/eviction.md``).

The manager knows blocks by hash, not by trace content, so :class:`Census` remembers, for every
full prompt block it sees admitted, the trace key it holds
(:func:`kvnumba.sim.ideal.block_keys`), its parent's key and the block's hash at that moment;
a block whose hash has changed since has been reused for other content and is not read as its
old key. Blocks the simulator never keyed (decode output) are counted neither way.

Only the immediate parent is checked: a block whose parent is cached but whose grandparent is
not is unreachable too, yet not counted, so the count is a lower bound.
"""

from __future__ import annotations

import numpy as np

from kvnumba.sim.hindsight import admitted_prompt_blocks, prompt_block_starts
from kvnumba.sim.ideal import BlockKeys

#: Samples of a run: about one per this fraction of the trace's requests (plus one at the end).
SAMPLE_EVERY = 0.01


def parent_keys(keys: BlockKeys) -> np.ndarray:
    """The key of the previous block of the same prompt, for every block of ``keys``.

    Parameters
    ----------
    keys : BlockKeys

    Returns
    -------
    numpy.ndarray of int64
        Aligned with ``keys.keys``; -1 for a prompt's first block (it has no parent).
    """
    parent = np.full(keys.keys.size, -1, np.int64)
    inner = keys.pos[1:] > 0  # blocks are listed prompt after prompt, position after position
    parent[1:][inner] = keys.keys[:-1][inner]
    return parent


def block_census(mgr) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Reference counts, registered flags and hashes of every block of a manager.

    Parameters
    ----------
    mgr
        A :class:`kvnumba.BlockManager` (read from ``mgr.state``) or a
        :class:`kvnumba.reference.ReferenceBlockManager`.

    Returns
    -------
    (ref, registered, hashes) or None
        ``int64``, ``bool`` and ``uint64`` arrays, one entry per block; ``None`` for a manager
        that offers neither.
    """
    state = getattr(mgr, "state", None)
    if state is not None:
        from kvnumba.state import BlockFlag

        registered = (state.block_flags & BlockFlag.REGISTERED) != 0
        return state.ref.astype(np.int64), registered, state.block_hash.astype(np.uint64)
    return _reference_census(mgr)


def block_hashes(mgr, blocks: np.ndarray) -> np.ndarray:
    """The chained hashes of ``blocks`` (uint64; 0 for a block without one).

    Parameters
    ----------
    mgr
        A manager that :func:`block_census` can read.
    blocks : numpy.ndarray of int64
        Block ids.

    Returns
    -------
    numpy.ndarray of uint64
    """
    state = getattr(mgr, "state", None)
    if state is not None:
        return state.block_hash[blocks].astype(np.uint64)
    return _hash_array([mgr._hash[b] for b in blocks.tolist()])


def _hash_array(hashes: list) -> np.ndarray:
    mask = (1 << 64) - 1
    return np.fromiter(((0 if h is None else h & mask) for h in hashes), np.uint64, len(hashes))


def _reference_census(mgr):
    # The reference model keeps its state in Python lists: the prefix table maps each
    # registered key to its block, and a block's chained hash is None until it is hashed.
    try:
        ref, prefix, hashes = mgr._ref, mgr._prefix, mgr._hash
    except AttributeError:
        return None
    registered = np.zeros(len(ref), bool)
    registered[list(prefix.values())] = True
    return np.asarray(ref, np.int64), registered, _hash_array(hashes)


class Census:
    """Tracks which trace key each block holds and counts unreachable cached blocks.

    Parameters
    ----------
    keys : BlockKeys
        :func:`kvnumba.sim.ideal.block_keys` of the trace at the manager's block size.
    num_blocks : int
        Blocks in the manager's pool.

    Attributes
    ----------
    unreachable : list of int
        Unreachable cached blocks at each :meth:`sample`.
    cached : list of int
        Cached blocks at each :meth:`sample`.
    """

    def __init__(self, keys: BlockKeys, num_blocks: int):
        self.keys = keys
        self.starts = prompt_block_starts(keys)
        self.parent = parent_keys(keys)
        # Per block: the entry of ``keys`` (request, prompt position) it was last seen holding
        # (-1: none), and its hash then. Two arrays of the pool's size, nothing per key.
        self.held = np.full(num_blocks, -1, np.int64)
        self.held_hash = np.zeros(num_blocks, np.uint64)
        self.unreachable: list[int] = []
        self.cached: list[int] = []

    def after_admit(self, mgr, requests: np.ndarray, tables: np.ndarray) -> None:
        """Record the keys of the full prompt blocks of requests just admitted.

        Parameters
        ----------
        mgr
            The manager, right after the admission (its blocks' hashes are read).
        requests : numpy.ndarray of int64
            Indices of the admitted requests.
        tables : numpy.ndarray of int
            Their block tables, read right after the admission.
        """
        blocks, index = admitted_prompt_blocks(self.keys, self.starts, requests, tables)
        self.held[blocks] = index
        self.held_hash[blocks] = block_hashes(mgr, blocks)

    def count(self, ref: np.ndarray, registered: np.ndarray, hashes: np.ndarray) -> tuple:
        """Unreachable and cached blocks in one census.

        Parameters
        ----------
        ref, registered, hashes : numpy.ndarray
            As returned by :func:`block_census`.

        Returns
        -------
        (int, int)
            Cached blocks whose parent key no registered block holds, and cached blocks.
        """
        known = registered & (self.held >= 0) & (self.held_hash == hashes)
        cached = registered & (ref == 0)
        parents = self.parent[self.held[cached & known]]
        parents = parents[parents >= 0]  # a prompt's first block has no parent to lose
        orphan = ~np.isin(parents, self.keys.keys[self.held[known]])
        return int(orphan.sum()), int(cached.sum())

    def sample(self, mgr) -> None:
        """Count the unreachable cached blocks of ``mgr`` now and keep the numbers."""
        census = block_census(mgr)
        if census is not None:
            unreachable, cached = self.count(*census)
            self.unreachable.append(unreachable)
            self.cached.append(cached)
