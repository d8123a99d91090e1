"""``EngineKeys``: the part of a manager for engines that hash blocks themselves.

It converts the inputs of keyed admits and lookups, runs ``lookup`` and ``set_keys``, and keeps
the block events of committed calls until the caller drains them. It validates shapes and
types and leaves values (counts, positions, caps) to the kernels, which check everything
before they write.
"""

from __future__ import annotations

import numpy as np

from kvnumba._layout import EVT_BLOCK, EVT_KEY0, EVT_KIND
from kvnumba._pipeline import failure
from kvnumba.inputs import (
    CAP_NONE,
    NO_KEYS,
    UINT64,
    hit_caps,
    index_array,
    key_rows,
    prompt_arrays,
)
from kvnumba.kernels import bad_of, count_of, lookup_result_of, status_of
from kvnumba.results import BlockEvents, LookupResult


def key_array(keys) -> np.ndarray:
    """Engine keys as a C-contiguous uint64 ``[K, 4]`` array (``ValueError``/``TypeError``).

    Parameters
    ----------
    keys : array-like of shape (K, 4)
        Unsigned (or non-negative) integers: four 64-bit words per block.
    """
    # Identity, not equality, of the dtype: numpy keeps one uint64 descriptor, and `==` is a
    # noticeable part of a one-request call (any other descriptor is converted below).
    if (
        type(keys) is np.ndarray
        and keys.dtype is UINT64
        and keys.ndim == 2
        and keys.shape[1] == 4
        and keys.flags.c_contiguous
    ):
        return keys
    # Shared with the reference model: lists keep Python ints up to 2**64 - 1 (numpy alone
    # would make a list with a word beyond int64 float64).
    return key_rows(keys, "keys")


def hash_to_key(block_hash: bytes) -> np.ndarray:
    """An engine's block hash (e.g. vLLM's 32-byte sha256 digest) as one key row.

    Shorter digests are zero-padded to 32 bytes; longer ones are refused (``ValueError``).
    """
    if len(block_hash) > 32:
        raise ValueError(f"a block hash has at most 32 bytes, got {len(block_hash)}")
    return np.frombuffer(block_hash.ljust(32, b"\0"), dtype=np.uint64)


class EngineKeys:
    """Engine keys and block events of one manager.

    Parameters
    ----------
    arenas : Arenas
        The manager's arenas.
    kernels : KernelSet
        Its kernels.
    facts : Facts
        What error messages read of the manager.
    block_keys : bool
        Whether blocks are registered under engine keys.
    block_events : bool
        Whether block events are recorded.

    Attributes
    ----------
    block_keys : bool
    chunks : list of numpy.ndarray or None
        Event rows of committed calls not yet drained (None without ``block_events``).
    """

    def __init__(self, arenas, kernels, facts, block_keys: bool, block_events: bool):
        self.arenas = arenas
        self.kernels = kernels
        self.facts = facts
        self.block_keys = bool(block_keys)
        self.chunks: list | None = [] if block_events else None

    def prompt_inputs(self, tokens, lengths, salts, keys, key_counts, max_hit_blocks):
        """Converted inputs of a keyed or capped admit / lookup (shapes and types only).

        Returns
        -------
        tuple
            ``(tokens, has_tokens, lengths, salts, keys, key_counts, caps)``; ``keys`` and
            ``key_counts`` None for a token-mode prompt without keys, ``caps`` None without
            caps.
        """
        if tokens is None and not self.block_keys:
            raise ValueError("tokens may be None only with block_keys=True")
        groups = len(self.arenas.geometry.groups)
        tokens_in, lengths, salts = prompt_arrays(tokens, lengths, salts, groups)
        has_tokens, n = tokens is not None, lengths.shape[0]
        if keys is None:
            if self.block_keys:
                keys = NO_KEYS
                key_counts = np.zeros(n, dtype=np.int64) if key_counts is None else key_counts
        elif not self.block_keys:
            raise ValueError("keys need a manager built with block_keys=True")
        if keys is not None:
            keys = key_array(keys)
            if key_counts is None:
                key_counts = lengths // self.arenas.geometry.block_size
            key_counts = index_array(key_counts, "key_counts")
        elif key_counts is not None:
            raise ValueError("key_counts without keys")
        # bool and float caps are TypeError, negative ones and a wrong length ValueError.
        caps = hit_caps(max_hit_blocks, n)
        return tokens_in, has_tokens, lengths, salts, keys, key_counts, caps

    def admit_inputs(self, tokens, lengths, salts, keys, key_counts, max_hit_blocks, atomic):
        """The inputs of ``k_admit_keys`` for an admit with keys, without token ids, or with
        hit caps, and the named inputs for its error message."""
        tokens_in, has_tokens, lengths, salts, keys, key_counts, caps = self.prompt_inputs(
            tokens, lengths, salts, keys, key_counts, max_hit_blocks
        )
        if keys is None:
            # Token mode with caps: the keyed kernel with no keys finds blocks by token hash.
            keys, key_counts = NO_KEYS, np.zeros(lengths.shape[0], dtype=np.int64)
        if caps is None:
            caps = np.full(lengths.shape[0], CAP_NONE, dtype=np.int64)
        inputs = (tokens_in, lengths, salts, atomic, has_tokens, keys, key_counts, caps)
        named = {"lengths": lengths, "tokens": tokens_in, "key_counts": key_counts, "caps": caps}
        return inputs, named

    def lookup(
        self, tokens, lengths, *, salts=None, keys=None, key_counts=None, max_hit_blocks=None
    ) -> LookupResult:
        """Report the cache hits ``admit`` would claim now, claiming nothing.

        Matching is exactly ``admit``'s (leading full blocks, the last prompt token never
        counted, at most ``max_hit_blocks``); no reference, LRU position or counter changes.

        Parameters
        ----------
        tokens : 1-D integer array-like or None
            All prompts' token ids, concatenated (None with ``block_keys=True``: keys only).
        lengths : 1-D integer array-like
            Tokens per prompt (each >= 1).
        salts : 1-D integer array-like, optional
            Per-prompt cache salt (default 0).
        keys : integer array-like of shape (K, 4), optional
            Engine keys of the prompts' leading full blocks (``block_keys=True``),
            ``key_counts[i]`` rows per prompt in prompt order.
        key_counts : 1-D integer array-like, optional
            Keys per prompt; default ``lengths // block_size``.
        max_hit_blocks : int or 1-D integer array-like, optional
            Cap on the hit blocks of every prompt.

        Returns
        -------
        LookupResult
            ``num_cached_tokens`` per prompt and ``block_ids`` (int32, one row per prompt,
            padded with -1; shape ``(prompts, groups, width)`` with several KV cache groups).

        Raises
        ------
        SequenceTooLong, ValueError, TypeError
            For input that ``admit`` would refuse as invalid.
        """
        tokens_in, has_tokens, lengths, salts, keys, key_counts, caps = self.prompt_inputs(
            tokens, lengths, salts, keys, key_counts, max_hit_blocks
        )
        if caps is None:
            caps = np.full(lengths.shape[0], CAP_NONE, dtype=np.int64)
        args = self.arenas.args
        if keys is not None:
            result = self.kernels.k_lookup_keys(
                tokens_in, lengths, salts, has_tokens, keys, key_counts, caps, *args
            )
        else:
            result = self.kernels.k_lookup(tokens_in, lengths, salts, caps, *args)
        if status_of(result):
            named = {"lengths": lengths, "tokens": tokens_in, "key_counts": key_counts}
            raise failure(self.facts, status_of(result), bad_of(result), caps=caps, **named)
        num_cached_tokens, block_ids = lookup_result_of(result)
        groups = len(self.arenas.geometry.groups)
        if groups > 1:
            block_ids = block_ids.reshape(lengths.shape[0], groups, block_ids.shape[1])
        return LookupResult(num_cached_tokens, block_ids)

    def set_keys(self, ids, starts, counts, keys) -> int:
        """Give full blocks of live sequences their engine keys and register them.

        For sequence ``ids[i]``, the blocks at table positions ``starts[i]`` to
        ``starts[i] + counts[i] - 1`` get the next ``counts[i]`` rows of ``keys`` (blocks that
        filled during decode or a later prefill chunk). A block is registered unless a
        matching block is (the first one stays); a block that has this key already is left as
        it is. Never allocates or evicts.

        Parameters
        ----------
        ids : 1-D integer array-like
            Live sequence ids, no duplicates.
        starts, counts : 1-D integer array-like
            First position and number of blocks per sequence; every position must be a full
            block (``< seq_len // block_size``).
        keys : integer array-like of shape (sum(counts), 4)
            The keys, in ``ids`` order.

        Returns
        -------
        int
            Blocks newly registered.

        Raises
        ------
        InvalidSequence, SequenceReleased
            For an id that is not live.
        ValueError, TypeError
            For malformed input, a position that is not a full block, or a block that has
            another key already; nothing is changed then.
        """
        if not self.block_keys:
            raise ValueError("set_keys needs a manager built with block_keys=True")
        ids = index_array(ids, "ids")
        starts = index_array(starts, "starts")
        counts = index_array(counts, "counts")
        keys = key_array(keys)
        result = self.kernels.k_set_keys(ids, starts, counts, keys, *self.arenas.args)
        if status_of(result):
            named = {"ids": ids, "starts": starts, "counts": counts}
            raise failure(self.facts, status_of(result), bad_of(result), **named)
        self.collect()
        return int(count_of(result))

    @property
    def pending(self) -> bool:
        """Whether :meth:`take_events` would return any event."""
        return bool(self.chunks)

    def take_events(self) -> BlockEvents:
        """Drain the block events recorded since the last call of ``take_events``.

        Returns
        -------
        BlockEvents
            ``kind`` (uint8: 1 stored, 2 removed), ``block`` (int32) and ``key`` (uint64
            ``[n, 4]``; in token mode the chained hash and three zero words), in the order the
            events happened. Always empty unless the manager was built with
            ``block_events=True``.
        """
        chunks = self.chunks
        if not chunks:
            return BlockEvents(
                np.empty(0, np.uint8), np.empty(0, np.int32), np.empty((0, 4), np.uint64)
            )
        rows = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        chunks.clear()
        return BlockEvents(
            rows[:, EVT_KIND].astype(np.uint8),
            rows[:, EVT_BLOCK].astype(np.int32),
            np.ascontiguousarray(rows[:, EVT_KEY0 : EVT_KEY0 + 4]).view(np.uint64),
        )

    def collect(self) -> None:
        """Keep the events of a call that committed (the kernels clear them at a call's start)."""
        if self.chunks is not None:
            rows = self.arenas.take_event_rows()
            if rows is not None:
                self.chunks.append(rows)
