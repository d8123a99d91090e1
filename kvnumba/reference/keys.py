"""Engine block keys and block events in the model: prompt parsing, hits, ``lookup``,
``set_keys``, ``take_events`` and the keyed part of ``check()``.

With ``block_keys=True`` the engine names its blocks: a block is registered under the key
``(salt, w0, w1, w2, w3)`` (the sequence's salt and the engine's four uint64 words) when
``admit`` or ``set_keys`` gives it one, never by hashing its tokens. ``_key[b]`` holds that
tuple and ``_hash[b]`` its word 0 (what ``on_evict`` reports); ``_prefix`` maps a key to the
first block registered with it. A later block given an equal key keeps the key but stays
unregistered, as a token-mode duplicate keeps its chained hash; with ``cache_duplicates`` it is
registered too, in ``_twins`` (see ``BlocksMixin._register``).

A key hits when a registered block has an equal key (all 256 bits and the salt) and, when both
the block's content and the query's tokens are known, equal tokens. The hits of a prompt are
the longest run of its leading keys that hit, capped by ``max_hit_blocks`` and by the
last-token rule (at most ``(length - 1) // block_size``); a windowed manager's, the prefix
``window_hit`` picks (``docs/windows.md``).

Block events (``block_events=True``, either mode) are ``(kind, block, key words)`` records in
``_events``, part of the snapshot so that a rolled-back call leaves none: stored when a block
gets registered, removed when a registered block is evicted or unregistered. In token mode the
key words are ``(chained hash, 0, 0, 0)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvnumba.errors import SequenceTooLong
from kvnumba.inputs import hit_caps, key_rows
from kvnumba.reference._common import _as_int_array
from kvnumba.reference._parts import ModelState
from kvnumba.reference.eviction import ROOT
from kvnumba.results import BlockEvents, LookupResult
from kvnumba.windows import NULL_BLOCK, group_hit, window_hit


class _Prompt(NamedTuple):
    """One validated prompt of ``admit`` / ``lookup``."""

    tokens: list[int] | None  # None: content unknown (block_keys=True only)
    length: int
    salt: int
    keys: list[tuple[int, int, int, int]]  # its rows of ``keys``, in position order
    cap: int | None  # max_hit_blocks, None for no cap


class KeysMixin(ModelState):
    """Engine keys and block events of :class:`ReferenceBlockManager` (``_key``, ``_hash``,
    ``_prefix``, ``_unknown``, ``_events``, ``_block_keys``, ``_block_events``)."""

    # ------------------------------------------------------------------ events

    def _event(self, kind: int, block: int) -> None:
        """Record an event of ``block`` under its current key (before the key is dropped)."""
        if not self._block_events:
            return
        if self._block_keys:
            key = self._key[block]
            assert key is not None  # events are recorded while the block is keyed
            words = key[1:]
        else:
            words = (self._hash[block], 0, 0, 0)
        self._events.append((kind, block, words))

    def take_events(self) -> BlockEvents:
        """Drain the block events recorded since the last drain, in the order they happened.

        Returns
        -------
        BlockEvents
            ``kind`` uint8 (1 stored, 2 removed), ``block`` int32, ``key`` uint64 ``[n, 4]``;
            empty unless the manager was built with ``block_events=True``.
        """
        events, self._events = self._events, []
        return BlockEvents(
            kind=np.array([e[0] for e in events], dtype=np.uint8),
            block=np.array([e[1] for e in events], dtype=np.int32),
            key=np.array([e[2] for e in events], dtype=np.uint64).reshape(len(events), 4),
        )

    # ------------------------------------------------------------------ prompts and hits

    def _parse_prompts(self, tokens, lengths, salts, keys, key_counts, max_hit_blocks):
        """Validate the input of ``admit`` / ``lookup`` and split it into :class:`_Prompt` s.

        Raises ``TypeError`` / ``ValueError`` for bad input; the sizes against the manager
        (``max_seq_len``, free slots) are the caller's to check.
        """
        if tokens is None:
            if not self._block_keys:
                raise ValueError("tokens are required unless the manager has block_keys=True")
        else:
            tokens = _as_int_array(tokens, "tokens")
        lengths = _as_int_array(lengths, "lengths")
        if (lengths < 1).any():
            raise ValueError("every prompt needs at least one token")
        if tokens is not None:
            if len(tokens) != int(lengths.sum()):
                raise ValueError(f"{len(tokens)} tokens given, lengths sum to {int(lengths.sum())}")
            if (tokens < 0).any():
                raise ValueError("token ids must be >= 0")
        if salts is None:
            salts = np.zeros(len(lengths), dtype=np.int64)
        salts = _as_int_array(salts, "salts")
        if len(salts) != len(lengths):
            raise ValueError(f"{len(salts)} salts given for {len(lengths)} prompts")
        groups = len(self._groups)
        low, high = -(2**63 // groups), (2**63 - groups) // groups
        if groups > 1 and any(not low <= s <= high for s in salts.tolist()):
            raise ValueError(
                f"salts of a manager of {groups} KV cache groups must lie in [{low}, {high}]"
            )
        counts = np.zeros(len(lengths), dtype=np.int64)
        rows: list[tuple[int, int, int, int]] = []
        if not self._block_keys:
            if keys is not None or key_counts is not None:
                raise ValueError("keys need a manager with block_keys=True")
        elif keys is not None or key_counts is not None:
            # key_counts without keys: zero rows, so every count must be 0.
            rows = [] if keys is None else [tuple(row) for row in key_rows(keys).tolist()]
            full = lengths // self._block_size
            if key_counts is None:
                counts = full
            else:
                counts = _as_int_array(key_counts, "key_counts")
                if len(counts) != len(lengths):
                    raise ValueError(f"{len(counts)} key_counts given for {len(lengths)} prompts")
                if (counts < 0).any():
                    raise ValueError("key_counts must be >= 0")
                if (counts > full).any():
                    i = int(np.argmax(counts > full))
                    raise ValueError(
                        f"key_counts[{i}] = {int(counts[i])} exceeds the {int(full[i])} full "
                        f"blocks of prompt {i}"
                    )
            if int(counts.sum()) != len(rows):
                raise ValueError(f"{len(rows)} keys given, key_counts sum to {int(counts.sum())}")
        caps = hit_caps(max_hit_blocks, len(lengths))

        flat = None if tokens is None else tokens.tolist()
        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        key_bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        return [
            _Prompt(
                tokens=None if flat is None else flat[bounds[i] : bounds[i + 1]],
                length=int(lengths[i]),
                salt=int(salts[i]),
                keys=rows[key_bounds[i] : key_bounds[i + 1]],
                cap=None if caps is None else int(caps[i]),
            )
            for i in range(len(lengths))
        ]

    def _hit_limit(self, p: _Prompt) -> int:
        """Blocks of ``p`` that may hit: the last-token rule, the keys given, the cap."""
        limit = (p.length - 1) // self._block_size
        if self._block_keys:
            limit = min(limit, len(p.keys))
        if p.cap is not None:
            limit = min(limit, p.cap)
        return limit

    def _group_prompts(self, p: _Prompt) -> list[_Prompt]:
        """``p`` once per KV cache group, its salt that of the group: ``salt * groups + g``."""
        groups = len(self._groups)
        return [p._replace(salt=p.salt * groups + g) for g in range(groups)]

    def _hits(self, p: _Prompt) -> list[list[int]]:
        """The ``k`` hit blocks of ``p`` in every KV cache group: ``NULL_BLOCK`` at the
        positions below the needed ones (a windowed group), then the registered blocks to
        claim."""
        return [hits for hits, _ in self._prompt_hits(p)]

    def _prompt_hits(self, p: _Prompt) -> list[tuple[list[int], int | None]]:
        """Per KV cache group, the hits of ``p`` (see :meth:`_hits`) and the anchor of a
        sequence admitted with them.

        One full-attention group: the registered blocks matching the leading full blocks, up
        to the first miss. Otherwise every position below the limit is looked up in every
        group, misses included, and ``group_hit`` picks the one prefix every group's rule
        allows (``window_hit`` then each group's first needed block). The anchor is the
        chained hash of the prompt's block before the first needed one (token mode; ``None``
        otherwise): a block that fills right after the gap chains onto it.
        """
        prompts = self._group_prompts(p)
        if not self._prefix_caching:
            return [([], None) for _ in prompts]
        limit = self._hit_limit(p)
        if not self._windowed:
            if not self._block_keys:
                return [(self._lookup_prefix(p.tokens, p.salt)[:limit], None)]
            hits: list[int] = []
            for j in range(limit):
                block = self._key_hit(p, j)
                if block < 0:
                    break
                hits.append(block)
            return [(hits, None)]
        rows: list = []
        chains: list = []
        for q in prompts:
            if self._block_keys:
                rows.append([self._key_hit(q, j) for j in range(limit)])
                chains.append(None)
            else:
                found, hashes = self._chain_prefix(q.tokens, q.salt, limit)
                rows.append(found)
                chains.append(hashes)
        bs, groups = self._block_size, len(self._groups)
        windows, chunks = [w for w, _ in self._groups], [c for _, c in self._groups]
        k = group_hit(rows, limit, bs, windows, chunks, groups)
        out = []
        for found, hashes, (window, chunk) in zip(rows, chains, self._groups, strict=True):
            first = window_hit(found, k, bs, window, chunk)[1]
            anchor = hashes[first - 1] if first and hashes is not None else None
            out.append(([NULL_BLOCK] * first + found[first:k], anchor))
        return out

    def _key_hit(self, p: _Prompt, j: int) -> int:
        """The registered block that keyed block ``j`` of ``p`` hits, or -1."""
        block = self._prefix.get((p.salt, *p.keys[j]))
        if block is None:
            return -1
        # Tokens are compared only where both sides know them (no trust in the key alone).
        bs = self._block_size
        if (
            p.tokens is not None
            and block not in self._unknown
            and self._tokens[block] != p.tokens[j * bs : (j + 1) * bs]
        ):
            return -1
        return block

    def _set_key(self, block: int, key: tuple, prev: int, pos: int) -> None:
        """Give ``block`` the key ``(salt, w0, w1, w2, w3)``; register it if the key is new.

        ``prev`` is the block before it in the sequence being keyed (-1 at position 0,
        ``NULL_BLOCK`` after a window's gap): its parent in the prefix forest if it is
        registered (the engine's chain is not known here); ``ROOT`` when it is no block.
        """
        self._key[block] = key
        self._hash[block] = key[1]
        if self._register(block):  # else the first block with this key stays registered
            self._event(BlockEvents.STORED, block)
            parent = prev if prev >= 0 and self._is_registered(prev) else ROOT
            self._policy.registered(block, parent, pos)

    def _register_keys(self, slot: int, p: _Prompt, hits: int) -> None:
        """After ``admit`` allocated prompt ``p`` in ``slot``: key its non-hit keyed blocks.

        Every one is a block (the ``NULL_BLOCK`` entries are hits); the one after a window's
        gap gets ``NULL_BLOCK`` as ``prev``, so it is a root of the prefix forest.
        """
        if not (self._block_keys and self._prefix_caching):
            return
        table = self._table[slot]
        for j in range(hits, len(p.keys)):
            self._set_key(table[j], (p.salt, *p.keys[j]), table[j - 1] if j else -1, j)

    # ------------------------------------------------------------------ public API

    def lookup(
        self, tokens, lengths, *, salts=None, keys=None, key_counts=None, max_hit_blocks=None
    ) -> LookupResult:
        """Report the cache hits ``admit`` would claim now, claiming nothing.

        Matching is ``admit``'s (keys or chained hashes, salt, tokens, the cap and the
        last-token rule), each prompt on its own: what an earlier prompt of the same ``admit``
        would register does not count. No state, LRU order or counter changes.

        Parameters
        ----------
        tokens : array-like of int, shape (sum(lengths),), or None
            As for :meth:`admit` (``None`` only with ``block_keys=True``).
        lengths, salts, keys, key_counts, max_hit_blocks
            As for :meth:`admit`.

        Returns
        -------
        LookupResult
            ``num_cached_tokens`` int64 per prompt, ``block_ids`` int32 ``[n, width]`` padded
            with -1 (``width`` the most hits); a windowed prompt's row holds ``NULL_BLOCK``
            at the positions below the blocks it would claim.

        Raises
        ------
        TypeError, ValueError
            Bad input, as for :meth:`admit`.
        SequenceTooLong
            A prompt beyond ``max_seq_len`` (more prompts than free slots is no error).
        """
        prompts = self._parse_prompts(tokens, lengths, salts, keys, key_counts, max_hit_blocks)
        for p in prompts:  # validated as admit validates it (no slots are taken, though)
            if p.length > self._max_seq_len:
                raise SequenceTooLong(-1, p.length, self._max_seq_len)
        hits = [self._hits(p) for p in prompts]  # per prompt, per group
        width = max((len(h[0]) for h in hits), default=0)
        groups = len(self._groups)
        block_ids = np.full((len(prompts), groups, width), -1, dtype=np.int32)
        for i, rows in enumerate(hits):
            for g, h in enumerate(rows):
                block_ids[i, g, : len(h)] = h
        if groups == 1:
            block_ids = block_ids[:, 0]
        return LookupResult(
            num_cached_tokens=np.array([len(h[0]) * self._block_size for h in hits], np.int64),
            block_ids=block_ids,
        )

    def set_keys(self, ids, starts, counts, keys) -> int:
        """Key (and register) full blocks of live sequences, e.g. blocks filled by decode.

        Table positions ``starts[i] .. starts[i] + counts[i] - 1`` of sequence ``ids[i]`` get
        the next ``counts[i]`` rows of ``keys`` (under the sequence's salt) and are registered
        unless a block with an equal key and salt is. A block that already has that key is
        skipped. The whole input is validated before anything changes; nothing is allocated.

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live sequence ids, no duplicates.
        starts, counts : array-like of int, shape (m,)
            First position and number of positions per sequence, ``>= 0``; every position
            must be a full block (``< seq_len // block_size``).
        keys : array-like of int, shape (sum(counts), 4)
            uint64 key words (or non-negative integers that fit).

        Returns
        -------
        int
            Blocks newly registered.

        Raises
        ------
        ValueError
            Without ``block_keys=True``, bad shapes or counts, a position that is not a full
            block or that left a windowed sequence's window (``NULL_BLOCK``), a block that
            already has a different key (also within this call).
        TypeError
            Non-integer input.
        InvalidSequence, SequenceReleased
            An unknown or released id.
        """
        if not self._block_keys:
            raise ValueError("set_keys needs a manager with block_keys=True")
        ids = _as_int_array(ids, "ids")
        starts = _as_int_array(starts, "starts")
        counts = _as_int_array(counts, "counts")
        rows = [tuple(row) for row in key_rows(keys).tolist()]
        if len(starts) != len(ids) or len(counts) != len(ids):
            raise ValueError(
                f"{len(ids)} ids, {len(starts)} starts and {len(counts)} counts differ in length"
            )
        if (starts < 0).any() or (counts < 0).any():
            raise ValueError("starts and counts must be >= 0")
        if int(counts.sum()) != len(rows):
            raise ValueError(f"{len(rows)} keys given, counts sum to {int(counts.sum())}")
        slots = self._resolve_all(ids, unique=True)
        bs = self._block_size
        planned: dict[int, tuple] = {}  # block -> the key this call gives it
        work: list[tuple[int, tuple, int, int]] = []  # (block, key, the block before, position)
        r = 0
        for i, (slot, start, count) in enumerate(
            zip(slots, starts.tolist(), counts.tolist(), strict=True)
        ):
            full = self._len[slot] // bs
            if start + count > full:  # even with count 0: a start past the end is a caller bug
                raise ValueError(
                    f"positions {start}..{start + count - 1} of ids[{i}]: the sequence has "
                    f"{full} full blocks"
                )
            for j in range(start, start + count):
                block = self._table[slot][j]
                key = (self._salt[slot], *rows[r])
                r += 1
                if block == NULL_BLOCK:  # left the window: the sequence holds no block there
                    raise ValueError(f"position {j} of ids[{i}] left the window: no block to key")
                current = planned.get(block, self._key[block])
                if current is not None and current != key:
                    raise ValueError(f"block {block} (position {j} of ids[{i}]) has another key")
                planned[block] = key
                work.append((block, key, self._table[slot][j - 1] if j else -1, j))
        if not self._prefix_caching:
            return 0  # nothing is ever registered: the keys were validated and are dropped
        registered = self._registered_count()
        for block, key, prev, pos in work:
            if self._key[block] is None:  # an equal key given before (or in this call): skip
                self._set_key(block, key, prev, pos)
        return self._registered_count() - registered

    # ------------------------------------------------------------------ check

    def _check_keys(self, fail) -> None:
        """The keyed-mode invariants of ``check()`` (the token-mode ones are in ``checks``)."""
        bs = self._block_size
        for block, key in enumerate(self._key):
            if key is None:
                continue
            if len(key) != 5 or self._hash[block] != key[1]:
                fail(f"block {block}: key {key} and hash {self._hash[block]} do not match")
            if not self._prefix_caching:
                fail(f"block {block} has a key without prefix caching")
        for slot in range(self._max_seqs):
            if not self._live[slot]:
                continue
            table = self._table[slot]
            for j, block in enumerate(table):
                key = None if block == NULL_BLOCK else self._key[block]
                if key is None:
                    continue
                if key[0] != self._salt[slot]:
                    fail(f"block {block} of slot {slot}: key salt {key[0]} is not the sequence's")
                # Keys name full blocks; only a tail a truncation cut while shared may be cut.
                if (j + 1) * bs > self._len[slot] and block not in self._trimmed:
                    fail(f"block {block} of slot {slot}: keyed but not full")
