"""``OneRequest``: the part of a manager behind ``append_one``, ``admit_one`` and
``lookup_one``, for engines whose scheduler calls the manager once per request and step (vLLM's
``allocate_slots``).

A batched call pays for its generality at the Python-to-kernel boundary: every array argument
and every array in the result has a cost there, and a one-sequence ``append`` takes six inputs
and returns four arrays. The one-request kernels take scalars (plus the keys of a keyed prompt)
and return scalars. ``BlockManager`` tries them first for the common cases; this part serves
the rest: input conversion, the keyed append, and the fallback to the batched call, which
raises the typed error or runs the page pool's pipeline (a failed kernel call changed nothing).
"""

from __future__ import annotations

import numpy as np

from kvnumba import errors as E
from kvnumba._engine_keys import key_array
from kvnumba._layout import NULL_BLOCK
from kvnumba.ids import split_id
from kvnumba.inputs import CAP_NONE, INT64, NO_KEYS, NO_TOKENS, UINT64, index_array
from kvnumba.kernels import (
    admit_one_result_of,
    append_one_result_of,
    status_of,
    values_of,
)
from kvnumba.windows import first_needed_block


def as_int(value, name: str) -> int:
    """``value`` as a Python int (``TypeError`` for bools, floats and other types)."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


class OneRequest:
    """One-request calls of one manager.

    Parameters
    ----------
    pipeline : CallPipeline
        Events and callbacks after a commit, typed errors.
    engine_keys : EngineKeys
        Whether blocks are keyed; ``lookup`` for ``lookup_one``'s fallback.

    Notes
    -----
    What the one-request kernels do not serve falls back to the manager's batched calls: the
    manager passes itself to :meth:`append_one` and :meth:`admit_one` (a part holds no
    reference to its manager).
    """

    def __init__(self, pipeline, engine_keys):
        self.pipeline = pipeline
        self.engine_keys = engine_keys
        self.arenas = pipeline.arenas
        self.kernels = pipeline.kernels
        self.block_keys = engine_keys.block_keys
        g = self.arenas.geometry
        self.block_size, self.max_seq_len = g.block_size, g.max_seq_len
        # The one-request kernels that change state exist for LRU managers without a page
        # pool; other managers are served by the batched calls (lookups read state only, but
        # a windowed lookup needs the window code, which only the extended kernels have).
        self.windowed = g.windowed
        self.fast = pipeline.pages is None and g.eviction == 0 and not self.windowed

    def append_one(
        self, manager, seq_id, count, key_start, keys, tried=False
    ) -> tuple[int, int, int, int]:
        """``BlockManager.append_one`` past its fast path (``tried``: the manager's own try of
        ``k_append_one`` failed, so the batched call serves it)."""
        seq_id, count = as_int(seq_id, "seq_id"), as_int(count, "count")
        fast = not tried and self.fast and 0 <= count <= self.max_seq_len
        if keys is not None:
            if not self.block_keys:
                raise ValueError("keys need a manager built with block_keys=True")
            key_start = as_int(key_start, "key_start")
            keys = key_array(keys)
            if fast:
                r = self.kernels.k_append_one_keys(
                    seq_id, count, key_start, keys, *self.arenas.one_args
                )
                if status_of(r) == 0:
                    out = append_one_result_of(r)
                    self.pipeline.after_commit(out)
                    return out
                if status_of(r) in (E.ST_BAD_KEY_POSITION, E.ST_KEY_CONFLICT):
                    self._bad_keys(status_of(r), seq_id, key_start, keys)
        elif fast:
            r = self.kernels.k_append_one(seq_id, count, *self.arenas.one_args)
            if status_of(r) == 0:
                out = append_one_result_of(r)
                self.pipeline.after_commit(out)
                return out
        ids = np.array([seq_id], dtype=np.int64)
        if keys is not None and (self.pipeline.pages is not None or self.windowed):
            # The batched calls run: the positions are checked first, so that set_keys cannot
            # refuse them after the append committed (on a page pool; or below a window, which
            # the append moves on).
            before = int(manager.seq_lens(ids)[0])
            length = before + max(count, 0)
            low = 0
            if self.windowed:
                held = manager.table_row(seq_id)
                low = int((held == NULL_BLOCK).sum())  # the released prefix
                g = self.arenas.geometry
                if count > 0 and keys.shape[0] > 0 and not g.explicit_release:
                    slot = split_id(seq_id, g.max_seqs)[2]
                    window, chunk = g.groups[int(self.arenas.s.seq_salt[slot]) % len(g.groups)]
                    low = max(low, first_needed_block(before, g.block_size, window, chunk))
            if key_start < low or key_start + keys.shape[0] > length // self.block_size:
                self._bad_keys(E.ST_BAD_KEY_POSITION, seq_id, key_start, keys)
        result = manager.append(ids, np.array([count], dtype=np.int64))
        if keys is not None:
            manager.set_keys(ids, [key_start], [keys.shape[0]], keys)
        length = int(manager.seq_lens(ids)[0])
        after = -(-length // self.block_size)
        before = -(-(length - count) // self.block_size)
        if result.cow_src.shape[0]:
            return before, after, int(result.cow_src[0]), int(result.cow_dst[0])
        return before, after, -1, -1

    def _bad_keys(self, status, seq_id, key_start, keys):
        self.pipeline.fail(
            status,
            0,
            ids=np.array([seq_id], dtype=np.int64),
            starts=np.array([key_start]),
            counts=np.array([keys.shape[0]]),
        )

    def admit_one(
        self, manager, tokens, length, salt, keys, max_hit_blocks, tried=False
    ) -> tuple[int | tuple[int, ...], int]:
        """``BlockManager.admit_one`` past its fast path (``tried``: the manager's own try of
        ``k_admit_one_keys`` failed, so the batched call serves it)."""
        if type(salt) is not int:
            salt = as_int(salt, "salt")
        if max_hit_blocks is None:
            cap = CAP_NONE
        elif type(max_hit_blocks) is int:
            cap = max_hit_blocks
        else:
            cap = as_int(max_hit_blocks, "max_hit_blocks")
        if tokens is None:
            tokens_in, has_tokens = NO_TOKENS, False
        elif type(tokens) is np.ndarray and tokens.dtype == INT64 and tokens.ndim == 1:
            tokens_in, has_tokens = np.ascontiguousarray(tokens), True
        else:
            tokens_in, has_tokens = index_array(tokens, "tokens"), True
        if length is None:
            if tokens is None:
                raise ValueError("admit_one needs tokens or a length")
            length = tokens_in.shape[0]
        elif type(length) is not int:
            length = as_int(length, "length")
        keyed = self.block_keys
        if keys is not None and keyed:
            keys = key_array(keys)
        if not tried and self.fast and cap >= 0 and 1 <= length <= self.max_seq_len:
            r = None
            if keyed and not has_tokens:
                keys_in = NO_KEYS if keys is None else keys
                r = self.kernels.k_admit_one_keys(length, salt, keys_in, cap, *self.arenas.one_args)
            elif not keyed and keys is None and length == tokens_in.shape[0]:
                r = self.kernels.k_admit_one(tokens_in, salt, cap, *self.arenas.one_args)
            if r is not None and status_of(r) == 0:
                out = admit_one_result_of(r)
                self.pipeline.after_commit(out)
                return out
        # The keys are the first K full blocks, as on the fast path (the batched default
        # would be every full block): a prompt that does not fit is PoolExhausted.
        keyed = keys is not None and keyed
        result = manager.admit(
            None if tokens is None else tokens_in,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=[keys.shape[0]] if keyed else None,
            max_hit_blocks=max_hit_blocks,
        )
        ids = result.ids[0]  # one id per KV cache group with several
        seq_ids = int(ids) if ids.ndim == 0 else tuple(int(i) for i in ids)
        return seq_ids, int(result.num_cached_tokens[0])

    def lookup_one(
        self, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None
    ) -> np.ndarray:
        """The blocks ``admit_one`` would reuse now for the same prompt, claiming nothing (the
        one-request form of ``lookup``): by its ``tokens``, or by ``length`` and engine ``keys``
        (``block_keys=True``).

        Parameters
        ----------
        tokens : 1-D integer array-like, optional
            The prompt's token ids (a manager without ``block_keys``).
        length : int, optional
            The prompt's length: required with ``keys``; with ``tokens``, their number.
        salt : int, default 0
            Cache salt.
        keys : integer array-like of shape (K, 4), optional
            The engine keys of the prompt's first K full blocks.
        max_hit_blocks : int, optional
            Cap on the blocks reported.

        Returns
        -------
        numpy.ndarray of int64
            The hit blocks, in order (their number times ``block_size`` is the cached length).

        Raises
        ------
        SequenceTooLong, ValueError, TypeError
            As ``lookup``; ``ValueError`` without tokens or keys.
        """
        # An engine's common call first, with the fewest tests, as in admit_one.
        if (
            tokens is None
            and self.block_keys
            and not self.windowed
            and max_hit_blocks is None
            and type(keys) is np.ndarray
            and keys.dtype is UINT64
            and keys.ndim == 2
            and keys.shape[1] == 4
            and type(length) is int
            and 1 <= length <= self.max_seq_len
            and type(salt) is int
        ):
            r = self.kernels.k_lookup_one_keys(length, salt, keys, CAP_NONE, *self.arenas.one_args)
            if status_of(r) == 0:
                return values_of(r)
        salt = as_int(salt, "salt")
        cap = CAP_NONE if max_hit_blocks is None else as_int(max_hit_blocks, "max_hit_blocks")
        if tokens is not None:
            tokens_in = index_array(tokens, "tokens")
            length = tokens_in.shape[0] if length is None else as_int(length, "length")
            fits = cap >= 0 and 1 <= length <= self.max_seq_len
            if keys is None and not self.block_keys and not self.windowed and fits:
                if length == tokens_in.shape[0]:
                    r = self.kernels.k_lookup_one(tokens_in, salt, cap, *self.arenas.one_args)
                    if status_of(r) == 0:
                        return values_of(r)
        else:
            if keys is None or length is None:
                raise ValueError("lookup_one needs tokens, or a length and keys")
            tokens_in, length = None, as_int(length, "length")
        if keys is not None:
            keys = key_array(keys)
            fits = cap >= 0 and 1 <= length <= self.max_seq_len
            if tokens is None and self.block_keys and not self.windowed and fits:
                r = self.kernels.k_lookup_one_keys(length, salt, keys, cap, *self.arenas.one_args)
                if status_of(r) == 0:
                    return values_of(r)
        result = self.engine_keys.lookup(
            tokens_in,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=None if keys is None else [keys.shape[0]],
            max_hit_blocks=max_hit_blocks,
        )
        # -1 pads the row; a windowed prompt's leading NULL_BLOCK entries count as cached. With
        # several KV cache groups, one row per group.
        hits = int(result.num_cached_tokens[0]) // self.block_size
        return result.block_ids[0][..., :hits].astype(np.int64)

    def table_row(self, seq_id) -> np.ndarray:
        """The block table row of a live sequence: a read-only view of the state.

        It follows the sequence as it grows (entries past its blocks read -1) while the
        sequence lives; do not keep it past ``release``.

        Raises
        ------
        InvalidSequence, SequenceReleased
            For an id that is not live.
        """
        ids = np.array([as_int(seq_id, "seq_id")], dtype=np.int64)
        self.pipeline.read(self.kernels.k_seq_lens, ids)  # validates the id
        return self.arenas.views.seq_table[split_id(int(ids[0]), self.arenas.geometry.max_seqs)[2]]
