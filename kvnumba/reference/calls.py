"""The model's allocating calls: ``append``, ``admit``, ``can_append`` and their bookkeeping.

Growing a sequence (new blocks, copy-on-write of a shared tail), releasing the blocks that left
a windowed sequence's window (``docs/windows.md``), snapshots and rollback of an atomic call,
sibling reclaim on ``PoolExhausted`` and the delivery of a committed call's callbacks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from kvnumba.errors import PoolExhausted, SequenceTooLong
from kvnumba.reference._common import (
    _PAGE_STATE,
    _STATE,
    _as_int_array,
    _blocks_for,
    _exhausted,
)
from kvnumba.reference._parts import ModelState
from kvnumba.reference.keys import _Prompt
from kvnumba.results import AdmitResult, AppendResult
from kvnumba.windows import NULL_BLOCK, first_needed_block


class CallsMixin(ModelState):
    """Append/admit and call bookkeeping of :class:`ReferenceBlockManager` (the whole state,
    through the other mixins; ``_evicted``, ``_unmapped_log``, ``_mapped_log``,
    ``_failed_calls``, ``_on_evict``)."""

    # ------------------------------------------------------------------ growing sequences

    def _append_need(self, slot: int, count: int, pending_cow: dict[int, int]) -> int:
        """Blocks that growing ``slot`` by ``count`` takes (new plus copy-on-write).

        ``pending_cow`` counts references that earlier sequences of the same call will have
        dropped from a tail by copy-on-write (the last holder of a shared tail writes in place).
        """
        if count == 0:
            return 0
        bs, n = self._block_size, self._len[slot]
        need = _blocks_for(n + count, bs) - _blocks_for(n, bs)
        if n % bs:
            tail = self._table[slot][-1]
            if self._ref[tail] - pending_cow.get(tail, 0) > 1:
                pending_cow[tail] = pending_cow.get(tail, 0) + 1
                need += 1
        return need

    def _grow(self, slot: int, count: int, tokens, out: list[int], cow: list[tuple]) -> None:
        """Append ``count`` tokens (``tokens`` None or a sequence of ids) to ``slot``.

        Capacity must have been checked. Physical slots go to ``out``, copy-on-write pairs to
        ``cow``.
        """
        if count == 0:
            return
        bs = self._block_size
        table, n = self._table[slot], self._len[slot]
        if n % bs and self._ref[table[-1]] > 1:  # copy-on-write of a shared partial tail
            old = table[-1]
            new = self._take_block()
            self._tokens[new][: n % bs] = self._tokens[old][: n % bs]
            table[-1] = new
            if old in self._unknown:
                self._unknown.add(new)
            self._drop_ref(old)
            self._counters["cow_copies"] += 1
            cow.append((old, new))
        elif n % bs and table[-1] in self._trimmed:
            # Cut by a truncation while shared, now this sequence's alone: written in place.
            self._reclaim_tail(table[-1], n % bs)
        for i in range(count):
            pos = n + i
            offset = pos % bs
            if offset == 0:
                table.append(self._take_block())
            block = table[-1]
            if tokens is not None:
                self._tokens[block][offset] = int(tokens[i])
            else:
                self._unknown.add(block)
            out.append(block * bs + offset)
            if offset == bs - 1:
                self._register_if_full(slot, len(table) - 1)
        self._len[slot] = n + count

    # ------------------------------------------------------------------ windows

    def _window_drops(self, slot: int, length: int | None = None) -> list[int]:
        """Table positions of ``slot`` that its tokens from ``length`` on (default: its
        length) cannot reach and that still hold a block, highest first (the order they are
        released in, as :meth:`release` goes tail first).

        The released positions are a prefix of the table, so the scan down from the first
        needed block stops at the first ``NULL_BLOCK``. Empty for full attention.
        """
        table = self._table[slot]
        length = self._len[slot] if length is None else length
        first = first_needed_block(length, self._block_size, *self._kind(slot))
        drops: list[int] = []
        for j in range(first - 1, -1, -1):
            if table[j] == NULL_BLOCK:
                break
            drops.append(j)
        return drops

    def _window_gain(self, slots: list[int]) -> int:
        """Blocks whose last reference the window drops of ``slots`` (in order) release: what
        an append growing them adds to what is available (none with
        ``window_release="explicit"``, whose appends release nothing).

        Simulated on counts, nothing changed: a block two of them share counts once, when its
        last reference goes. Each such block becomes cached or free, one more available block
        (with a page pool too: a page it empties is unmapped, and mappable again).
        """
        if self._explicit_release:
            return 0
        dropped: dict[int, int] = {}
        gain = 0
        for slot in slots:
            table = self._table[slot]
            for j in self._window_drops(slot):
                block = table[j]
                dropped[block] = dropped.get(block, 0) + 1
                if dropped[block] == self._ref[block]:
                    gain += 1
        return gain

    def _drop_window(self, slot: int, length: int | None = None) -> int:
        """Release the blocks that ``slot``'s tokens from ``length`` on (default: its length)
        cannot reach, highest position first; their entries become ``NULL_BLOCK``. Returns how
        many.

        The anchor takes the hash of the highest one first (a dropped block may be scrubbed):
        the block that fills after the gap chains onto it.
        """
        table = self._table[slot]
        drops = self._window_drops(slot, length)
        if drops:
            self._anchor[slot] = self._hash[table[drops[0]]]
            released = self._len[slot] if length is None else length
            self._policy.releasing(released, self._seq_tag[slot])
        for j in drops:
            block = table[j]
            table[j] = NULL_BLOCK
            self._drop_ref(block)
        return len(drops)

    # ------------------------------------------------------------------ call bookkeeping

    def _begin_call(self) -> None:
        self._evicted = []
        self._unmapped_log = []
        self._mapped_log = []

    def _commit_call(self) -> None:
        """Deliver this call's callbacks (after it committed): ``on_evict``, then the pool's
        ``on_unmap``, then ``on_map``."""
        evicted, self._evicted = self._evicted, []
        unmapped, self._unmapped_log = self._unmapped_log, []
        mapped, self._mapped_log = self._mapped_log, []
        if evicted and self._on_evict is not None:
            self._on_evict(
                np.array([e[0] for e in evicted], dtype=np.int64),
                np.array([e[1] for e in evicted], dtype=np.uint64),
                np.array([e[2] for e in evicted], dtype=np.int64).reshape(
                    len(evicted), self._block_size
                ),
            )
        if self._pool is not None:
            self._pool._deliver(unmapped, mapped)

    def _snapshot(self) -> dict:
        """Copies of the state: shallow for blocks and sequences (see the package notes on why
        that suffices), deep for the page lists, plus the pool's state."""
        snap = {name: getattr(self, name).copy() for name in _STATE}
        if self._pool is not None:
            snap.update({name: copy.deepcopy(getattr(self, name)) for name in _PAGE_STATE})
            snap["pool"] = self._pool._snapshot()
        return snap

    def _restore(self, snap: dict) -> None:
        for name, value in snap.items():
            if name == "pool":
                self._the_pool()._restore(value)
            elif name in _PAGE_STATE:
                setattr(self, name, copy.deepcopy(value))  # the snapshot stays reusable
            else:
                setattr(self, name, value)
        self._begin_call()

    def _run(self, attempt: Callable, atomic: bool):
        """Run one call: ``attempt()`` (which begins the call and either returns its result or
        raises ``PoolExhausted`` with nothing changed), with sibling reclaim for atomic calls,
        failure counting and the callbacks of committed work (siblings' first)."""
        try:
            result = attempt()
        except PoolExhausted as first:
            shortfall = first.shortfall  # type: ignore[attr-defined]  # set by _exhausted
            reclaimed = self._ask_siblings(shortfall) if atomic else None
            if reclaimed is None:
                self._failed_calls += 1
                raise
            try:
                result = attempt()
            except PoolExhausted:
                for sibling, snap in reversed(reclaimed):
                    sibling._restore(snap)
                self._failed_calls += 1
                raise first from None
            for sibling, _ in reclaimed:
                sibling._commit_call()
        self._commit_call()
        return result

    # ------------------------------------------------------------------ append and admit

    def _validate_append(self, ids, counts, tokens):
        ids = _as_int_array(ids, "ids")
        counts = _as_int_array(counts, "counts")
        if len(ids) != len(counts):
            raise ValueError(f"ids and counts differ in length ({len(ids)} != {len(counts)})")
        if (counts < 0).any():
            raise ValueError("counts must be >= 0")
        total = int(counts.sum())
        if tokens is not None:
            tokens = _as_int_array(tokens, "tokens")
            if len(tokens) != total:
                raise ValueError(f"{len(tokens)} tokens given, counts sum to {total}")
            if (tokens < 0).any():
                raise ValueError("token ids must be >= 0")
        counts = counts.tolist()
        return self._resolve_all(ids, unique=True, counts=counts), counts, tokens

    def append(self, ids, counts, tokens=None, *, atomic: bool = True) -> AppendResult:
        """Grow each sequence ``ids[i]`` by ``counts[i]`` tokens, in input order.

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live sequence ids, no duplicates.
        counts : array-like of int, shape (m,)
            Tokens to append to each, ``>= 0``.
        tokens : array-like of int, shape (sum(counts),), optional
            Token ids (``>= 0``), the flat concatenation in ``ids`` order; without them the
            payload reads -1 and the blocks are never cached.
        atomic : bool, default True
            All or nothing (raise ``PoolExhausted``); otherwise each sequence in order, all or
            nothing, failures reported in ``ok``.

        Returns
        -------
        AppendResult
            ``slot_mapping`` int64 (-1 for failed sequences), ``cow_src``/``cow_dst`` int32,
            ``ok`` bool.

        Raises
        ------
        TypeError, ValueError
            Bad input (dtype, shape, negative counts or tokens, duplicate ids, token count).
        InvalidSequence, SequenceReleased, SequenceTooLong
            Bad ids or growth beyond ``max_seq_len``.
        PoolExhausted
            Atomic mode only, when the call needs more blocks than available (free plus
            cached, plus mappable pages times ``blocks_per_page``, plus the blocks the call's
            window drops release) even after sibling reclaim.

        Notes
        -----
        A windowed manager first releases, for every sequence grown by at least one token,
        the blocks below its first needed block (``docs/windows.md``): an atomic call all of
        them before it grows any, a non-atomic one each sequence's right before it grows it
        (a sequence that does not fit keeps them).
        """
        slots, counts, tokens = self._validate_append(ids, counts, tokens)
        return self._run(lambda: self._append(slots, counts, tokens, atomic), atomic)

    def _append(self, slots, counts, tokens, atomic: bool) -> AppendResult:
        """One attempt of :meth:`append` on validated input (callbacks left pending)."""
        self._begin_call()
        if atomic:
            pending: dict[int, int] = {}
            needed = sum(
                self._append_need(s, c, pending) for s, c in zip(slots, counts, strict=True)
            )
            grown = [s for s, c in zip(slots, counts, strict=True) if c]
            # What the window drops release counts for the call (nothing dropped yet).
            available = self._available() + self._window_gain(grown)
            if needed > available:
                raise _exhausted(needed, available, needed - available)
            for slot in grown if not self._explicit_release else ():
                self._drop_window(slot)  # every drop before any growth
        out: list[int] = []
        cow: list[tuple] = []
        ok = np.ones(len(slots), dtype=bool)
        start = 0
        for i, (slot, count) in enumerate(zip(slots, counts, strict=True)):
            chunk = None if tokens is None else tokens[start : start + count]
            if atomic:
                self._grow(slot, count, chunk, out, cow)
            elif self._append_need(slot, count, {}) > self._available() + self._window_gain(
                [slot] if count else []
            ):
                ok[i] = False  # untouched, its out-of-window blocks included
                out.extend([-1] * count)
            else:
                if count and not self._explicit_release:
                    self._drop_window(slot)
                self._grow(slot, count, chunk, out, cow)
            start += count
        if not ok.all():
            self._failed_calls += 1
        return AppendResult(
            slot_mapping=np.array(out, dtype=np.int64),
            cow_src=np.array([c[0] for c in cow], dtype=np.int32),
            cow_dst=np.array([c[1] for c in cow], dtype=np.int32),
            ok=ok,
        )

    def can_append(self, ids, counts) -> bool:
        """Whether ``append(ids, counts, atomic=True)`` would succeed now.

        Parameters
        ----------
        ids, counts : array-like of int, shape (m,)
            As for :meth:`append` (validated the same way, errors included).

        Returns
        -------
        bool
        """
        slots, counts, _ = self._validate_append(ids, counts, None)
        pending: dict[int, int] = {}
        needed = sum(self._append_need(s, c, pending) for s, c in zip(slots, counts, strict=True))
        gain = self._window_gain([s for s, c in zip(slots, counts, strict=True) if c])
        if self._pool is None:
            return needed <= self._available() + gain
        # Sibling reclaim can add the siblings' cache-only pages to the pool's free ones, as
        # far as this manager has virtual pages to map them to.
        free_mapped = sum(len(blocks) for blocks in self._page_free)
        pages = self._pool.num_free + self._cache_only_pages_of_siblings()
        mappable = min(pages, len(self._unmapped))
        return needed <= free_mapped + len(self._lru) + mappable * self._k + gain

    def _admit_one(self, p: _Prompt):
        """Admit prompt ``p`` if it fits now: one sequence in every KV cache group.

        Returns ``(needed, served)``: the blocks the prompt takes beyond its cache hits, and
        ``(ids, cached tokens, slot mapping)`` or ``None`` if it did not fit (nothing
        changed); ``ids`` one per group.
        """
        bs, length = self._block_size, p.length
        requests = self._prompt_hits(p)
        k = len(requests[0][0])  # NULL_BLOCK entries included: positions a window skips
        needed = len(requests) * (_blocks_for(length, bs) - k)
        cached_hits = sum(self._cached_hits(hits) for hits, _ in requests)
        if needed > self._available() - cached_hits:
            return needed, None
        prompts = self._group_prompts(p)
        slots = []
        # Every group claims its hits before any grows, so that no group's new blocks evict
        # another group's hits.
        for q, (hits, anchor) in zip(prompts, requests, strict=True):
            slot = self._take_slot(q.salt)
            slots.append(slot)
            self._anchor[slot] = anchor
            claimed = 0
            for block in hits:
                if block == NULL_BLOCK:  # not needed: no block, no reference
                    self._table[slot].append(block)
                    continue
                claimed += 1
                if self._ref[block] == 0:
                    self._uncache(block)
                    if self._pool is not None:  # its page holds a referenced block again
                        self._cache_only.pop(block // self._k, None)
                self._ref[block] += 1
                self._policy.hit(block)  # cached or held by another sequence alike
                self._table[slot].append(block)
            self._len[slot] = k * bs
            if self._prefix_caching:
                self._counters["prefix_queries"] += self._hit_limit(p)
                self._counters["prefix_hits"] += claimed
        out: list[int] = []
        rest = None if p.tokens is None else p.tokens[k * bs :]
        for q, slot in zip(prompts, slots, strict=True):
            self._grow(slot, length - k * bs, rest, out, [])
            # Keys after allocation: its evictions' removed events precede its stored ones.
            self._register_keys(slot, q, k)
        return needed, ([self._seq_id(slot) for slot in slots], k * bs, out)

    def _cached_hits(self, hits: list[int]) -> int:
        """Hits that are cached blocks (claiming them uses up capacity); ``NULL_BLOCK`` is none."""
        return sum(1 for b in hits if b != NULL_BLOCK and self._ref[b] == 0)

    def _prompt_need(self, p: _Prompt) -> int:
        hits = self._hits(p)
        return len(hits) * (_blocks_for(p.length, self._block_size) - len(hits[0]))

    def admit(
        self,
        tokens,
        lengths,
        *,
        salts=None,
        keys=None,
        key_counts=None,
        max_hit_blocks=None,
        atomic: bool = True,
    ) -> AdmitResult:
        """Create one sequence per prompt, reusing cached blocks of the longest prefix.

        Parameters
        ----------
        tokens : array-like of int, shape (sum(lengths),), or None
            The prompts' token ids (``>= 0``), concatenated. ``None`` only with
            ``block_keys=True``: content unknown (payload -1, never compared).
        lengths : array-like of int, shape (p,)
            Tokens per prompt, each ``>= 1``.
        salts : array-like of int, shape (p,), optional
            Cache salt per prompt (0 by default); blocks are shared only within one salt.
        keys : array-like of int, shape (K, 4), optional
            ``block_keys=True`` only: the engine's uint64 keys of the prompts' leading full
            blocks, ``key_counts[i]`` rows per prompt in order. Hits are looked up by key, and
            the keyed blocks that are not hits are registered under their keys.
        key_counts : array-like of int, shape (p,), optional
            Keys per prompt, ``0 <= key_counts[i] <= lengths[i] // block_size``, summing to
            ``K``; ``lengths // block_size`` by default.
        max_hit_blocks : int or array-like of int, shape (p,), optional
            At most this many hit blocks per prompt (``>= 0``); no cap by default.
        atomic : bool, default True
            All prompts or none (raise ``PoolExhausted``); otherwise each prompt in order, all
            or nothing, failures reported in ``ok``.

        Returns
        -------
        AdmitResult
            ``ids`` (-1 if failed), ``num_cached_tokens`` (whole reused blocks, leaving at least
            one token uncached; 0 if failed; a windowed prompt's count includes the blocks
            below its window, which its table holds as ``NULL_BLOCK``), ``slot_mapping`` of
            the uncached tokens in prompt order (all ``length`` tokens -1 for a failed prompt),
            ``ok``.

        Raises
        ------
        TypeError, ValueError
            Bad input (dtype, shape, negative tokens, empty prompt, length mismatches, keys or
            ``tokens=None`` without ``block_keys=True``, bad key counts or caps).
        SequenceTooLong, TooManySequences
            A prompt beyond ``max_seq_len``; more prompts than free sequence slots.
        PoolExhausted
            Atomic mode only; ``needed`` sums ``blocks - hits`` over all prompts, with the hits
            of the failing and later prompts looked up at the failure point.
        """
        prompts = self._parse_prompts(tokens, lengths, salts, keys, key_counts, max_hit_blocks)
        for p in prompts:
            if p.length > self._max_seq_len:
                raise SequenceTooLong(-1, p.length, self._max_seq_len)
        self._check_slots_free(len(prompts) * len(self._groups))
        return self._run(lambda: self._admit(prompts, atomic), atomic)

    def _admit(self, prompts: list[_Prompt], atomic: bool) -> AdmitResult:
        """One attempt of :meth:`admit` on validated input (callbacks left pending)."""
        self._begin_call()
        available = self._available()
        # NOTE: a prompt of n blocks with k hits (c of them cached) uses up n - k + c <= n of
        # ``free + cached``, so when the prompts' blocks sum to at most ``available`` the call
        # cannot fail and needs no rollback. Otherwise an atomic call of several prompts keeps
        # a snapshot (a single prompt is checked before anything changes).
        total = sum(_blocks_for(p.length, self._block_size) for p in prompts) * len(self._groups)
        tight = atomic and len(prompts) > 1 and total > available
        snap = self._snapshot() if tight else None

        groups = len(self._groups)
        ids = np.full((len(prompts), groups), -1, dtype=np.int64)
        cached = np.zeros(len(prompts), dtype=np.int64)
        ok = np.zeros(len(prompts), dtype=bool)
        out: list[int] = []
        needed_so_far = 0
        for i, p in enumerate(prompts):
            needed, served = self._admit_one(p)
            if served is None and atomic:
                # later prompts: hits looked up at the failure point, before the rollback
                later = sum(self._prompt_need(q) for q in prompts[i + 1 :])
                # What the call lacks here: this prompt's cached hits use up capacity too.
                cached_hits = sum(self._cached_hits(hits) for hits in self._hits(p))
                shortfall = needed + later - (self._available() - cached_hits)
                needed += needed_so_far + later
                if snap is not None:
                    self._restore(snap)
                raise _exhausted(needed, available, shortfall)
            if served is None:
                out.extend([-1] * (p.length * groups))
                continue
            ids[i], cached[i], slots = served
            ok[i] = True
            out.extend(slots)
            needed_so_far += needed
        if not ok.all():
            self._failed_calls += 1
        return AdmitResult(
            ids=ids[:, 0] if groups == 1 else ids,
            num_cached_tokens=cached,
            slot_mapping=np.array(out, dtype=np.int64),
            ok=ok,
        )
