"""The facade's one-request calls: ``append_one`` and ``admit_one``, for engines whose
scheduler calls the manager once per request and step (vLLM's ``allocate_slots``).

A batched call pays for its generality at the Python-to-kernel boundary: every array argument
and every array in the result costs about 150 ns, and a one-sequence ``append`` takes six inputs
and returns four arrays. These calls pass scalars (plus the keys of a keyed prompt) and get
scalars back. They commit on the first try without a page pool; anything else (a failure, a
page pool, bigger record buffers) is redone by the batched call, which raises the typed error
or runs the pool's pipeline (a failed kernel call changed nothing).
"""

from __future__ import annotations

import numpy as np

from kvnumba import errors as E
from kvnumba._engine_keys import key_array
from kvnumba._ids import split_id
from kvnumba._inputs import index_array
from kvnumba._virtual_pages import deliver_all

_UINT64 = np.dtype(np.uint64)
_INT64 = np.dtype(np.int64)
_NO_TOKENS = np.empty(0, dtype=np.int64)
_CAP_NONE = np.iinfo(np.int64).max


def _int(value, name: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


class OneRequestCalls:
    """``append_one`` and ``admit_one`` of :class:`kvnumba.BlockManager`."""

    def append_one(self, seq_id, count, *, key_start=0, keys=None) -> tuple[int, int, int, int]:
        """Grow one sequence by ``count`` tokens without token ids (atomic), and register the
        keys of blocks that are full afterwards (``block_keys=True``).

        Parameters
        ----------
        seq_id : int
            A live sequence id.
        count : int
            Tokens to append (>= 0).
        key_start : int, default 0
            Table position of the first block ``keys`` belong to.
        keys : integer array-like of shape (K, 4), optional
            Keys of the blocks at positions ``key_start .. key_start + K - 1``, each full once
            the sequence has grown (as :meth:`set_keys`, in the same call).

        Returns
        -------
        tuple of int
            ``(blocks_before, blocks_after, cow_src, cow_dst)``: the new blocks are table
            positions ``blocks_before .. blocks_after - 1`` (:meth:`table_row`); ``cow_src ->
            cow_dst`` is the block copy to perform on the device, ``-1, -1`` for none.

        Raises
        ------
        PoolExhausted, InvalidSequence, SequenceReleased, SequenceTooLong, ValueError, TypeError
            As ``append`` and ``set_keys``; nothing is changed by a failed call.
        """
        seq_id, count = _int(seq_id, "seq_id"), _int(count, "count")
        fast = self._pool is None and 0 <= count <= self._max_seq_len
        if keys is not None:
            if not self._block_keys:
                raise ValueError("keys need a manager built with block_keys=True")
            key_start = _int(key_start, "key_start")
            keys = key_array(keys)
            if fast:
                r = self._k_append_one_keys(seq_id, count, key_start, keys, *self._one_args)
                if r[0] == 0:
                    self._after_fast_commit(r)
                    return r[4], r[5], r[6], r[7]
                if r[0] in (E.ST_BAD_KEY_POSITION, E.ST_KEY_CONFLICT):
                    ids = np.array([seq_id], dtype=np.int64)
                    rows = np.array([keys.shape[0]])
                    self._raise_keys(r[0], 0, ids, np.array([key_start]), rows)
        elif fast:
            r = self._k_append_one(seq_id, count, *self._one_args)
            if r[0] == 0:
                self._after_fast_commit(r)
                return r[4], r[5], r[6], r[7]
        ids = np.array([seq_id], dtype=np.int64)
        if keys is not None and self._pool is not None:
            # On a page pool the batched calls run: the positions are checked first, so that
            # set_keys cannot refuse them after the append committed.
            length = int(self.seq_lens(ids)[0]) + max(count, 0)
            if key_start < 0 or key_start + keys.shape[0] > length // self._block_size:
                rows = np.array([keys.shape[0]])
                self._raise_keys(E.ST_BAD_KEY_POSITION, 0, ids, np.array([key_start]), rows)
        result = self.append(ids, np.array([count], dtype=np.int64))
        if keys is not None:
            self.set_keys(ids, [key_start], [keys.shape[0]], keys)
        length = int(self.seq_lens(ids)[0])
        after = -(-length // self._block_size)
        before = -(-(length - count) // self._block_size)
        if result.cow_src.shape[0]:
            return before, after, int(result.cow_src[0]), int(result.cow_dst[0])
        return before, after, -1, -1

    def admit_one(
        self, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None
    ) -> tuple[int, int]:
        """Admit one prompt (atomic), reusing its longest cached prefix.

        Parameters
        ----------
        tokens : 1-D integer array-like, optional
            The prompt's token ids; None with ``block_keys=True`` (then ``length`` is
            required).
        length : int, optional
            The prompt's length; default ``len(tokens)``.
        salt : int, default 0
            Cache salt.
        keys : integer array-like of shape (K, 4), optional
            ``block_keys=True``: the engine keys of the prompt's first K full blocks.
        max_hit_blocks : int, optional
            Cap on the blocks reused.

        Returns
        -------
        tuple of int
            ``(seq_id, num_cached_tokens)``.

        Raises
        ------
        PoolExhausted, SequenceTooLong, TooManySequences, ValueError, TypeError
            As ``admit``; nothing is changed by a failed call.
        """
        # An engine's common call first, with the fewest tests: keys of the documented type
        # and plain ints. The kernel takes any strides and checks the row width; numba's
        # unboxing checks neither dtype nor rank, so those are tested here.
        if (
            tokens is None
            and self._keyed_fast
            and type(keys) is np.ndarray
            and keys.dtype is _UINT64
            and keys.ndim == 2
            and type(length) is int
            and 1 <= length <= self._max_seq_len
            and type(salt) is int
        ):
            cap = _CAP_NONE if max_hit_blocks is None else max_hit_blocks
            if type(cap) is int and cap >= 0:
                r = self._k_admit_one_keys(length, salt, keys, cap, *self._one_args)
                if r[0] == 0:
                    if self._event_chunks is not None or self._on_evict is not None:
                        self._after_fast_commit(r)
                    return r[1], r[2]
        if type(salt) is not int:
            salt = _int(salt, "salt")
        if max_hit_blocks is None:
            cap = _CAP_NONE
        elif type(max_hit_blocks) is int:
            cap = max_hit_blocks
        else:
            cap = _int(max_hit_blocks, "max_hit_blocks")
        if tokens is None:
            tokens_in, has_tokens = _NO_TOKENS, False
        elif type(tokens) is np.ndarray and tokens.dtype == _INT64 and tokens.ndim == 1:
            tokens_in, has_tokens = np.ascontiguousarray(tokens), True
        else:
            tokens_in, has_tokens = index_array(tokens, "tokens"), True
        if length is None:
            if tokens is None:
                raise ValueError("admit_one needs tokens or a length")
            length = tokens_in.shape[0]
        elif type(length) is not int:
            length = _int(length, "length")
        keyed = self._block_keys
        if keys is not None and keyed:
            keys = key_array(keys)
        if self._pool is None and cap >= 0 and 1 <= length <= self._max_seq_len:
            r = None
            if keyed and not has_tokens:
                r = self._k_admit_one_keys(
                    length, salt, _NO_KEYS if keys is None else keys, cap, *self._one_args
                )
            elif not keyed and keys is None and length == tokens_in.shape[0]:
                r = self._k_admit_one(tokens_in, salt, cap, *self._one_args)
            if r is not None and r[0] == 0:
                if self._event_chunks is not None or self._on_evict is not None:
                    self._after_fast_commit(r)
                return r[1], r[2]
        # The keys are the first K full blocks, as on the fast path (the batched default
        # would be every full block): a prompt that does not fit is PoolExhausted.
        keyed = keys is not None and self._block_keys
        result = self.admit(
            None if tokens is None else tokens_in,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=[keys.shape[0]] if keyed else None,
            max_hit_blocks=max_hit_blocks,
        )
        return int(result.ids[0]), int(result.num_cached_tokens[0])

    def lookup_one(self, *, length, salt=0, keys, max_hit_blocks=None) -> np.ndarray:
        """The blocks ``admit_one(None, length=..., keys=...)`` would reuse now, claiming
        nothing (``block_keys=True``; the one-request form of :meth:`lookup`).

        Parameters
        ----------
        length : int
            The prompt's length.
        salt : int, default 0
            Cache salt.
        keys : integer array-like of shape (K, 4)
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
            As :meth:`lookup`.
        """
        length, salt = _int(length, "length"), _int(salt, "salt")
        cap = _CAP_NONE if max_hit_blocks is None else _int(max_hit_blocks, "max_hit_blocks")
        keys = key_array(keys)
        if self._block_keys and cap >= 0 and 1 <= length <= self._max_seq_len:
            status, _, hits = self._k_lookup_one_keys(length, salt, keys, cap, *self._one_args)
            if status == 0:
                return hits
        result = self.lookup(
            None,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=[keys.shape[0]],
            max_hit_blocks=max_hit_blocks,
        )
        return result.block_ids[0][result.block_ids[0] >= 0].astype(np.int64)

    def _after_fast_commit(self, result) -> None:
        """What ``_run`` does after a commit, for a first-try success without a pool."""
        if self._event_chunks is not None:
            self._collect_events()
        if self._on_evict is not None:
            deliver_all((self._deliver_evictions,), result)

    def table_row(self, seq_id) -> np.ndarray:
        """The block table row of a live sequence: a read-only view of the state.

        It follows the sequence as it grows (entries past its blocks read -1) for as long as
        the sequence lives; read it, do not keep it past ``release``.

        Raises
        ------
        InvalidSequence, SequenceReleased
            For an id that is not live.
        """
        ids = np.array([_int(seq_id, "seq_id")], dtype=np.int64)
        self.seq_lens(ids)  # validates the id
        return self._views.seq_table[split_id(int(ids[0]), self._max_seqs)[2]]


_NO_KEYS = np.empty((0, 4), dtype=np.uint64)
