"""The model's engine conveniences: ``truncate``, ``evict`` and ``reset_prefix_cache``.

Each validates its whole input before it changes anything, so none needs a snapshot; the
policy is the one of ``docs/design.md``, "Shrinking and engine conveniences".
"""

from __future__ import annotations

from kvnumba.reference._common import _as_int_array, _blocks_for
from kvnumba.reference._parts import ModelState
from kvnumba.results import BlockEvents
from kvnumba.windows import NULL_BLOCK, first_needed_block


class EngineMixin(ModelState):
    """``truncate``, ``evict`` and ``reset_prefix_cache`` of :class:`ReferenceBlockManager`
    (through the block, prefix and page helpers of the other mixins; ``_trimmed``, ``_unknown``)."""

    def truncate(self, ids, new_lens) -> None:
        """Shorten each sequence ``ids[i]`` to its first ``new_lens[i]`` tokens.

        Whole blocks past the new end drop one reference each, tail first (as
        :meth:`release`). A block the new end cuts into stays: held by this sequence alone
        it is scrubbed past the end and unhashed; shared, it stays intact for the other
        holders, and this sequence's next append copies it while it is still shared, or
        reclaims it (scrubbed past the end, unhashed) once it holds it alone.

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live sequence ids, no duplicates.
        new_lens : array-like of int, shape (m,)
            ``0 <= new_lens[i] <= len(ids[i])``.

        Raises
        ------
        TypeError, ValueError
            Bad input, duplicate ids, a length out of range, or (windowed) a length whose first
            needed block already left the window: the shorter sequence would need it again.
        InvalidSequence, SequenceReleased
        """
        slots, new_lens = self._slots_and_lengths(ids, new_lens, "new_lens", "new length")
        bs = self._block_size
        for i, (slot, new) in enumerate(zip(slots, new_lens, strict=True)):
            # The released positions are the table's prefix [0, gone): a length that needs
            # one of them again is refused (also why truncation never pops a NULL_BLOCK).
            gone = self._leading_nulls(slot)
            needed = first_needed_block(new, bs, *self._kind(slot))
            if needed < gone:
                raise ValueError(
                    f"ids[{i}]: length {new} needs table position {needed}, which already "
                    f"left the window"
                )
        self._begin_call()
        for slot, new in zip(slots, new_lens, strict=True):
            if new == self._len[slot]:
                continue
            keep = _blocks_for(new, bs)
            table = self._table[slot]
            self._policy.releasing(new, self._seq_tag[slot])
            while len(table) > keep:
                self._drop_ref(table.pop())
            self._len[slot] = new
            fill = new - (keep - 1) * bs
            if keep == 0 or fill == bs:
                continue
            cut = table[-1]
            if self._ref[cut] == 1:
                self._reclaim_tail(cut, fill)
            else:
                # The other holders keep it intact; this sequence's next append copies it
                # while it is shared, or reclaims it once it is this sequence's alone.
                self._trimmed.add(cut)
        self._commit_call()

    def release_window(self, ids, lengths) -> int:
        """Release, for each sequence ``ids[i]``, the blocks its tokens from position
        ``lengths[i]`` on cannot reach, highest position first, as an append at that length
        would (``docs/windows.md``); returns how many.

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live sequence ids, no duplicates.
        lengths : array-like of int, shape (m,)
            ``0 <= lengths[i] <= len(ids[i])``: the tokens the engine has processed.

        Raises
        ------
        TypeError, ValueError
            Bad input, duplicate ids, a length out of range.
        InvalidSequence, SequenceReleased
        """
        slots, lengths = self._slots_and_lengths(ids, lengths, "lengths", "length")
        self._begin_call()
        released = sum(
            self._drop_window(slot, length) for slot, length in zip(slots, lengths, strict=True)
        )
        self._commit_call()
        return released

    def _slots_and_lengths(self, ids, lengths, name: str, noun: str):
        """The slots of distinct live ``ids`` and ``lengths`` as a list, each within
        ``0 .. seq_len`` (``truncate`` and ``release_window``); raises before any change."""
        ids = _as_int_array(ids, "ids")
        lengths = _as_int_array(lengths, name)
        if len(lengths) != len(ids):
            raise ValueError(f"{name} has {len(lengths)} entries for {len(ids)} ids")
        if (lengths < 0).any():
            raise ValueError(f"{name} must be >= 0")
        slots = self._resolve_all(ids, unique=True)
        lengths = lengths.tolist()
        for slot, length in zip(slots, lengths, strict=True):
            if length > self._len[slot]:
                raise ValueError(f"{noun} {length} exceeds the {self._len[slot]} tokens held")
        return slots, lengths

    def _leading_nulls(self, slot: int) -> int:
        """Table positions of ``slot`` that left the window (a prefix of its table)."""
        gone = 0
        for block in self._table[slot]:
            if block != NULL_BLOCK:
                break
            gone += 1
        return gone

    def _reclaim_tail(self, block: int, fill: int) -> None:
        """Make ``block`` the unshared partial tail of the one sequence holding its first
        ``fill`` tokens: payload past ``fill`` scrubbed, key and registration forgotten."""
        bs = self._block_size
        self._tokens[block] = self._tokens[block][:fill] + [-1] * (bs - fill)
        self._unhash(block)
        self._trimmed.discard(block)

    def _unhash(self, block: int) -> None:
        """Forget ``block``'s key (and its registration, if it is the registered one)."""
        if self._is_registered(block):
            self._event(BlockEvents.REMOVED, block)
            self._unregister(block)
            self._policy.unregistered(block)
        self._key[block] = None
        self._hash[block] = None

    def evict(self, block_ids) -> int:
        """Evict the cached blocks among ``block_ids``, in order; free ones are skipped.

        Returns
        -------
        int
            Blocks evicted.

        Raises
        ------
        TypeError, ValueError
            Bad input, a block out of range or referenced (nothing changed).
        """
        blocks = _as_int_array(block_ids, "block_ids").tolist()
        for i, block in enumerate(blocks):
            if not 0 <= block < self._num_blocks:
                raise ValueError(f"block_ids[{i}] = {block} is outside the pool")
            if self._ref[block]:
                raise ValueError(f"block {block} is referenced; only cached blocks can be evicted")
        self._begin_call()
        count = 0
        for block in blocks:
            if block in self._lru:
                self._evict_to_free(block)
                count += 1
        self._commit_call()
        return count

    def reset_prefix_cache(self) -> int:
        """Evict every cached block (LRU head first); unhash the blocks of live sequences
        and mark them of unknown content, and forget their anchors (the hash of a block that
        left the window is forgotten as a held block's is).

        Returns
        -------
        int
            Blocks evicted.
        """
        self._begin_call()
        evicted = list(self._lru)
        for block in evicted:
            self._evict_to_free(block)
        for slot in range(self._max_seqs):
            if self._live[slot]:
                self._anchor[slot] = None
                for block in self._table[slot]:
                    if block != NULL_BLOCK:
                        self._unhash(block)
                        self._unknown.add(block)
        self._commit_call()
        return len(evicted)
