"""``Sequence``: a one-sequence handle over the batched calls of a :class:`BlockManager`."""

from __future__ import annotations

import operator

import numpy as np

from kvnumba.errors import InvalidPosition, SequenceReleased
from kvnumba.inputs import index_array
from kvnumba.results import AppendResult


class Sequence:
    """One sequence of a manager; every method runs the same kernels as the batched calls.

    Parameters
    ----------
    manager : BlockManager
        The owning manager.
    seq_id : int
        A live id of that manager (use ``manager.sequence()`` to create one).
    """

    __slots__ = ("_manager", "_id")

    def __init__(self, manager, seq_id: int):
        self._manager = manager
        self._id = int(seq_id)

    def __repr__(self) -> str:
        state = "released" if self.released else f"{len(self)} tokens"
        return f"Sequence(id={self._id}, {state})"

    @property
    def id(self) -> int:
        """The sequence id (int64, never reused)."""
        return self._id

    @property
    def released(self) -> bool:
        """Whether the sequence has been released."""
        return not self._manager.is_live(self._id)

    def __len__(self) -> int:
        return int(self._manager.seq_lens([self._id])[0])

    def append(self, tokens=None, *, count: int | None = None) -> AppendResult:
        """Append token ids (or ``count`` tokens without ids).

        Parameters
        ----------
        tokens : 1-D integer array-like, optional
            Token ids (>= 0) to append.
        count : int, optional
            Tokens to append without ids; exclusive with ``tokens``.

        Returns
        -------
        AppendResult
            As ``BlockManager.append`` for this one sequence.
        """
        if (tokens is None) == (count is None):
            raise ValueError("pass exactly one of tokens or count")
        if tokens is None:
            if isinstance(count, bool):  # True is an int to operator.index, not a count
                raise TypeError("count must be an integer, not a bool")
            assert count is not None
            return self._manager.append([self._id], [operator.index(count)])
        tokens = index_array(tokens, "tokens")
        return self._manager.append([self._id], [tokens.shape[0]], tokens)

    def fork(self) -> Sequence:
        """A child sequence sharing all blocks of this one (copy-on-write)."""
        return Sequence(self._manager, int(self._manager.fork([self._id], 1)[0, 0]))

    def release(self) -> None:
        """Drop this sequence's references, tail block first; the id becomes invalid."""
        self._manager.release([self._id])

    @property
    def table(self) -> np.ndarray:
        """Copy of the block table (int32, one entry per block held)."""
        return self._manager.block_tables([self._id])[0]

    @property
    def tokens(self) -> np.ndarray:
        """Copy of the token payload (int64; -1 for tokens appended without ids, and for
        those whose blocks left a window)."""
        table = self.table
        length = len(self)
        payload = self._manager.state.tokens[table]  # a copy
        payload[table < 0] = -1  # NULL_BLOCK: the block left the window
        return payload.reshape(-1)[:length]

    def _check_position(self, pos) -> tuple[int, int]:
        if self.released:
            raise SequenceReleased(self._id)
        pos = operator.index(pos)
        length = len(self)
        if not 0 <= pos < length:
            raise InvalidPosition(
                f"position {pos} is outside sequence {self._id} of length {length}"
            )
        return pos, self._manager.block_size

    def token_at(self, pos: int) -> int:
        """Token id at position ``pos`` (-1 if it was appended without an id, or its block
        left a window)."""
        pos, block_size = self._check_position(pos)
        block = self.block_for(pos)
        if block < 0:
            return -1
        return int(self._manager.state.tokens[block, pos % block_size])

    def block_for(self, pos: int) -> int:
        """Physical block that holds position ``pos`` (``kvnumba.NULL_BLOCK`` once it left a
        window)."""
        pos, block_size = self._check_position(pos)
        return int(self._manager.block_tables([self._id])[0, pos // block_size])
