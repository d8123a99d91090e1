"""The model's prefix table: chained hashes of full blocks and the longest cached prefix.

A full block of known content whose parent has a hash gets the key ``(previous hash, salt,
tokens)``; the first block that filled with a key is the one registered in ``_prefix`` (later
ones, with ``cache_duplicates``, in ``_twins``). In a
windowed sequence the parent of the first block after the gap (the entry before it is
``NULL_BLOCK``) is the block that left the window there: its hash is the sequence's anchor.
"""

from __future__ import annotations

from kvnumba.reference._common import ROOT_HASH, _hash64
from kvnumba.reference._parts import ModelState
from kvnumba.reference.eviction import ORPHAN_AT_BIRTH, ROOT
from kvnumba.results import BlockEvents
from kvnumba.windows import NULL_BLOCK


class PrefixMixin(ModelState):
    """Prefix-table helpers of :class:`ReferenceBlockManager` (``_prefix``, ``_key``, ``_hash``,
    ``_tokens``, ``_table``, ``_salt``, ``_anchor``, ``_prefix_caching``)."""

    # ------------------------------------------------------------------ prefix helpers

    def _register_if_full(self, slot: int, index: int) -> None:
        """Hash block ``index`` of sequence ``slot`` (just filled) and register it if new."""
        if not self._prefix_caching or self._block_keys:  # keyed: only the engine's keys
            return
        table = self._table[slot]
        block = table[index]
        row = self._tokens[block]
        if block in self._unknown:  # a token appended without an id, or reset_prefix_cache
            return
        prev = self._parent_hash(slot, index)
        if prev is None:  # parent block without a hash
            return
        key = (prev, self._salt[slot], tuple(row))
        self._key[block] = key
        self._hash[block] = _hash64(key)
        if self._register(block):  # else the first block with this key stays registered
            self._event(BlockEvents.STORED, block)
            self._policy.registered(block, self._content_parent(table, index), index)

    def _parent_hash(self, slot: int, index: int) -> int | None:
        """The hash block ``index`` of sequence ``slot`` chains onto (``None``: unhashed).

        ``ROOT_HASH`` at position 0; across a window's gap the anchor, so that a windowed
        sequence's blocks get the keys a full-attention sequence's would.
        """
        if index == 0:
            return ROOT_HASH
        prev = self._table[slot][index - 1]
        return self._anchor[slot] if prev == NULL_BLOCK else self._hash[prev]

    def _content_parent(self, table: list[int], index: int) -> int:
        """Parent in the prefix forest of block ``index`` of ``table``, registered by content.

        The previous block itself when it is registered, else the block registered with its
        key (the copy registered before it); ``ROOT`` at position 0 and after a window's gap
        (the sequence holds no block there to link under), ``ORPHAN_AT_BIRTH`` when no block is
        registered with that key.
        """
        if index == 0 or table[index - 1] == NULL_BLOCK:
            return ROOT
        if self._is_registered(table[index - 1]):
            return table[index - 1]
        key = self._key[table[index - 1]]
        return ORPHAN_AT_BIRTH if key is None else self._prefix.get(key, ORPHAN_AT_BIRTH)

    def _lookup_prefix(self, prompt: list[int], salt: int) -> list[int]:
        """Registered blocks matching the prompt's leading full blocks (at most ``(L-1)//bs``),
        up to the first miss (full attention)."""
        if not self._prefix_caching:
            return []
        bs = self._block_size
        hits: list[int] = []
        prev: int | None = ROOT_HASH
        for j in range((len(prompt) - 1) // bs):
            block = self._prefix.get((prev, salt, tuple(prompt[j * bs : (j + 1) * bs])))
            if block is None:
                break
            hits.append(block)
            prev = self._hash[block]
        return hits

    def _chain_prefix(
        self, prompt: list[int], salt: int, limit: int
    ) -> tuple[list[int], list[int]]:
        """Per block ``pos < limit`` of the prompt: the registered block with its key, or -1,
        past misses too (a windowed prompt may hit after a miss); and the chained hashes.

        The chain runs over the tokens, not over the hit blocks, so a position after a miss
        still gets the key a full-attention sequence would have registered it under.
        """
        bs = self._block_size
        found: list[int] = []
        hashes: list[int] = []
        prev = ROOT_HASH
        for j in range(limit):
            key = (prev, salt, tuple(prompt[j * bs : (j + 1) * bs]))
            found.append(self._prefix.get(key, -1))
            prev = _hash64(key)
            hashes.append(prev)
        return found, hashes
