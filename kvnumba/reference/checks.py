"""``check()`` of the model: its invariants recomputed from scratch (pages: ``pages.py``)."""

from __future__ import annotations

from kvnumba.errors import InvariantViolation
from kvnumba.reference._common import ROOT_HASH, _blocks_for, _hash64
from kvnumba.reference._parts import ModelState
from kvnumba.windows import NULL_BLOCK, first_needed_block


class ChecksMixin(ModelState):
    """``check()`` of :class:`ReferenceBlockManager` (reads the whole state, writes nothing)."""

    def check(self) -> None:
        """Recompute the model's invariants from scratch.

        Raises
        ------
        InvariantViolation
            Naming the first inconsistency found.
        """
        bs, nb = self._block_size, self._num_blocks
        chained = not self._block_keys  # token mode: chained hashes (keyed: ``keys.py``)

        def fail(message: str):
            raise InvariantViolation(message)

        live = [s for s in range(self._max_seqs) if self._live[s]]
        if sorted(self._slots + live) != list(range(self._max_seqs)):
            fail("slot stack and live slots do not partition the sequence slots")
        refs = [0] * nb
        for slot in range(self._max_seqs):
            table, length = self._table[slot], self._len[slot]
            if not self._live[slot]:
                if table or length or self._anchor[slot] is not None:
                    fail(f"free slot {slot} holds blocks, tokens or an anchor")
                continue
            if len(table) != _blocks_for(length, bs) or length > self._max_seq_len:
                fail(f"slot {slot}: {len(table)} blocks for {length} tokens")
            # Windowed: the positions that left the window (NULL_BLOCK) are a prefix of the
            # table, below the first block the sequence still needs; full attention has none.
            gone = 0
            while gone < len(table) and table[gone] == NULL_BLOCK:
                gone += 1
            if NULL_BLOCK in table[gone:]:
                fail(f"slot {slot}: NULL_BLOCK entries are not a prefix of its table")
            needed = first_needed_block(length, bs, *self._kind(slot))
            if gone > needed:
                fail(f"slot {slot}: {gone} positions left the window, it needs block {needed}")
            for j, block in enumerate(table):
                if block == NULL_BLOCK:
                    continue
                if not 0 <= block < nb:
                    fail(f"slot {slot} references block {block} out of range")
                refs[block] += 1
                key = self._key[block]
                if j == 0:
                    prev: int | None = ROOT_HASH
                elif table[j - 1] == NULL_BLOCK:  # across the gap: the anchor
                    prev = self._anchor[slot]
                else:
                    prev = self._hash[table[j - 1]]
                if chained and key is not None and (key[0] != prev or key[1] != self._salt[slot]):
                    fail(f"block {block} of slot {slot}: hash chain or salt mismatch")
                full = (j + 1) * bs <= length
                eligible = chained and self._prefix_caching and full and prev is not None
                if key is None and eligible and block not in self._unknown:
                    fail(f"block {block} of slot {slot}: full known block without a hash")
            # A tail a truncation cut while it was shared may end inside another holder's
            # content (and hash), or a former holder's: the next append reclaims it.
            if length % bs and table[-1] not in self._trimmed:
                tail = table[-1]
                if any(t != -1 for t in self._tokens[tail][length % bs :]):
                    fail(f"slot {slot}: payload beyond the sequence end in block {tail}")
                if self._key[tail] is not None:
                    fail(f"slot {slot}: partial tail block {tail} has a hash")
        for block in range(nb):
            if refs[block] != self._ref[block]:
                fail(f"block {block}: refcount {self._ref[block]}, {refs[block]} references")
        free = list(self._free)
        if self._pool is not None:
            if self._free:
                fail("a manager with a page pool uses its free stack")
            free = [b for blocks in self._page_free for b in blocks]
            free += [b for v in self._unmapped for b in self._page_blocks(v)]
        if len(set(free)) != len(free) or set(free) & set(self._lru):
            fail("free stack holds a block twice or a cached block")
        for block in free:
            if self._ref[block] or self._key[block] is not None:
                fail(f"free block {block} is referenced or hashed")
            if any(t != -1 for t in self._tokens[block]):
                fail(f"free block {block} is not scrubbed")
        for block in self._lru:
            if self._ref[block] or not self._is_registered(block):
                fail(f"cached block {block} is referenced or not registered")
        self._policy.check(self._lru, self._is_registered, fail)
        for block in range(self._reserved):
            if self._ref[block] or block in free or block in self._lru:
                fail(f"reserved block {block} is referenced, free or cached")
            if self._key[block] is not None or any(t != -1 for t in self._tokens[block]):
                fail(f"reserved block {block} is hashed or written")
        unused = sum(1 for r in self._ref if r == 0) - self._reserved
        if unused != len(free) + len(self._lru):
            fail(f"{unused} unreferenced blocks, {len(free) + len(self._lru)} free/cached")
        if self._pool is not None:
            self._check_pages(fail)
        if not chained:
            self._check_keys(fail)
        for block in range(nb):
            key = self._key[block]
            if key is None or not chained:
                continue
            if tuple(self._tokens[block]) != key[2] or self._hash[block] != _hash64(key):
                fail(f"block {block}: payload or hash does not match its key")
        entries = [(key, block) for key, block in self._prefix.items()]
        entries += [(key, block) for key, twins in self._twins.items() for block in twins]
        for key, block in entries:
            if self._key[block] != key or not (self._ref[block] or block in self._lru):
                fail(f"prefix entry of block {block} is stale")
        if len({block for _, block in entries}) != len(entries):
            fail("a block is registered twice")
        if any(key not in self._prefix or not twins for key, twins in self._twins.items()):
            fail("a twin outlives the first block of its key, or an empty twin list")
        c = self._counters
        if min(c.values()) < 0 or c["prefix_hits"] > c["prefix_queries"]:
            fail(f"inconsistent counters {c}")
        if c["evictions"] > c["allocations"] or c["cow_copies"] > c["allocations"]:
            fail(f"inconsistent counters {c}")
