"""The one-request calls of the model (``append_one``, ``admit_one``, ``lookup_one``,
``table_row``): the batched calls of one sequence, with the results the kernels' one-request
entry points return. The model has no boundary cost to save; these exist so that tests and
benchmarks can call either implementation the same way."""

from __future__ import annotations

import numpy as np

from kvnumba.reference._parts import ModelState


class OneRequestMixin(ModelState):
    """``append_one``, ``admit_one``, ``lookup_one`` and ``table_row`` of the model."""

    def append_one(self, seq_id, count, *, key_start=0, keys=None) -> tuple[int, int, int, int]:
        """``append([seq_id], [count])`` then ``set_keys`` of ``keys`` from ``key_start``:
        ``(blocks_before, blocks_after, cow_src, cow_dst)`` (see ``BlockManager.append_one``).
        Positions are checked before the append, so a bad one changes nothing: among them a
        position that left a windowed sequence's window, or that this append's window drop
        releases (``set_keys`` would find ``NULL_BLOCK`` there)."""
        ids = np.array([seq_id], dtype=np.int64)
        if keys is not None:
            keys = np.asarray(keys)
            length = int(self.seq_lens(ids)[0]) + int(count)
            if not self._block_keys:
                raise ValueError("keys need a manager built with block_keys=True")
            if key_start < 0 or key_start + len(keys) > length // self._block_size:
                raise ValueError(
                    f"key positions {key_start} .. {key_start + len(keys) - 1} of sequence "
                    f"{seq_id} are not all full blocks"
                )
            # The window's released positions are a prefix; after this append it reaches up
            # to the first block the sequence needs now (count >= 1), or its NULL prefix.
            slot = self._resolve(seq_id)
            drops = count and not self._explicit_release
            gone = self._leading_nulls(slot) + (len(self._window_drops(slot)) if drops else 0)
            if len(keys) and key_start < gone:
                raise ValueError(
                    f"key position {key_start} of sequence {seq_id} left the window: no block "
                    f"to key"
                )
        result = self.append(ids, np.array([count], dtype=np.int64))
        if keys is not None:
            self.set_keys(ids, [key_start], [len(keys)], keys)
        length = int(self.seq_lens(ids)[0])
        after = -(-length // self._block_size)
        before = -(-(length - int(count)) // self._block_size)
        if len(result.cow_src):
            return before, after, int(result.cow_src[0]), int(result.cow_dst[0])
        return before, after, -1, -1

    def admit_one(
        self, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None
    ) -> tuple[int, int]:
        """``admit`` of one prompt: ``(seq_id, num_cached_tokens)``."""
        if length is None:
            if tokens is None:
                raise ValueError("admit_one needs tokens or a length")
            length = len(tokens)
        result = self.admit(
            tokens,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=None if keys is None else [len(keys)],  # keys may cover fewer blocks
            max_hit_blocks=max_hit_blocks,
        )
        return int(result.ids[0]), int(result.num_cached_tokens[0])

    def lookup_one(
        self, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None
    ) -> np.ndarray:
        """``lookup`` of one prompt, by its tokens or by a length and keys: its hit blocks
        (int64), ``NULL_BLOCK`` at the positions a windowed prompt skips (their number times
        ``block_size`` is the cached length)."""
        if tokens is None and (keys is None or length is None):
            raise ValueError("lookup_one needs tokens, or a length and keys")
        if tokens is not None and length is None:
            length = len(tokens)
        result = self.lookup(
            tokens,
            [length],
            salts=[salt],
            keys=keys,
            key_counts=None if keys is None else [len(keys)],
            max_hit_blocks=max_hit_blocks,
        )
        row = result.block_ids[0]
        return row[row != -1].astype(np.int64)  # -1 pads; NULL_BLOCK (-2) is a skipped hit

    def table_row(self, seq_id) -> np.ndarray:
        """The sequence's block table (a copy here: the model keeps Python lists)."""
        return self.block_tables([seq_id])[0]

    @property
    def pending_events(self) -> bool:
        """Whether :meth:`take_events` would return any event."""
        return bool(self._events)
