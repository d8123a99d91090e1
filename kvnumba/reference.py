"""A deliberately simple pure-Python model of the kvnumba contract.

:class:`ReferenceBlockManager` implements the batched API of ``kvnumba.BlockManager`` with
plain lists, dicts and an :class:`collections.OrderedDict` (numpy only builds the result arrays),
following the deterministic policies of ``docs/design.md`` exactly. It serves two purposes:

* the test oracle: the jitted kernels must hand out the same block ids, slot mappings, copy-on-
  write pairs, evictions, free-stack and LRU orders;
* the benchmark baseline the kernels are quoted against.

Clarity beats speed here. The model imports no numba and, like the real manager, is meant to be
used by one thread at a time.

Model state (``N = num_blocks``):

* ``_ref[b]``: references held by live sequences on block ``b``.
* ``_tokens[b]``: payload of block ``b`` (a list of ``block_size`` ints, -1 = no token id).
  NOTE: a block's row is replaced by a fresh list whenever the block is handed out or scrubbed,
  and written in place only afterwards; ``admit`` writes only to blocks it took itself, so a
  shallow copy of ``_tokens`` is a valid snapshot for rolling back an atomic ``admit``.
* ``_key[b]`` / ``_hash[b]``: the prefix-cache key ``(previous hash, salt, tokens)`` of a full
  block with known content and hashed parent, and its 64-bit hash; ``None`` otherwise.
* ``_prefix``: key -> the registered block with that key (the first block that filled with it).
* ``_lru``: registered blocks at refcount 0, least recently released first.
* ``_free``: the LIFO free stack (bottom..top); every free block is scrubbed and unhashed.
* per sequence slot: ``_gen``, ``_live``, ``_table`` (block ids), ``_len``, ``_salt``;
  ``_slots`` is the LIFO stack of free slots.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from kvnumba.errors import (
    InvalidGeometry,
    InvalidSequence,
    InvariantViolation,
    PoolExhausted,
    SequenceReleased,
    SequenceTooLong,
    TooManySequences,
)
from kvnumba.results import AdmitResult, AppendResult, Stats

__all__ = ["ReferenceBlockManager"]

_MASK64 = (1 << 64) - 1
_SLOT_MASK = (1 << 32) - 1
_INT64_MAX = (1 << 63) - 1
#: Chained-hash seed of a sequence's first block (any constant; only the model uses it).
ROOT_HASH = 0x9E3779B97F4A7C15
_COUNTERS = ("allocations", "evictions", "cow_copies", "prefix_queries", "prefix_hits")
# Attributes saved (shallow copies) and restored around an atomic multi-prompt admit.
_STATE = (
    "_ref",
    "_tokens",
    "_key",
    "_hash",
    "_prefix",
    "_lru",
    "_free",
    "_gen",
    "_live",
    "_table",
    "_len",
    "_salt",
    "_slots",
    "_counters",
)


def _hash64(key: tuple) -> int:
    """Deterministic 64-bit hash of a prefix-cache key (ints and tuples hash reproducibly)."""
    return hash(key) & _MASK64


def _as_int(value, name: str) -> int:
    """Return ``value`` as a Python int; bools and non-integers raise ``TypeError``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


def _as_int_array(values, name: str) -> np.ndarray:
    """Validate a 1-D integer array-like and return it as an int64 array.

    An empty list or tuple is accepted whatever dtype numpy infers for it; an empty ndarray
    must still have an integer dtype.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {arr.ndim} dimensions")
    if arr.dtype == np.bool_:
        raise TypeError(f"{name} must hold integers, got bool")
    if arr.size == 0 and not isinstance(values, np.ndarray):
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds values beyond the int64 range")
    return arr.astype(np.int64)


def _blocks_for(length: int, block_size: int) -> int:
    """Blocks needed to hold ``length`` tokens."""
    return -(-length // block_size)


class ReferenceBlockManager:
    """Pure-Python model of ``kvnumba.BlockManager`` (the test oracle and benchmark baseline).

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool, ids ``0 .. num_blocks - 1``; at least 1.
    block_size : int
        Tokens per block; at least 1.
    max_seqs : int, default 1024
        Live sequences at most (sequence slots).
    max_seq_len : int, optional
        Tokens per sequence at most; ``min(num_blocks * block_size, 32768)`` by default.
    prefix_caching : bool, default True
        Register full blocks of known content and reuse them in :meth:`admit`.
    on_evict : callable, optional
        ``on_evict(block_ids int64[n], block_hashes uint64[n], tokens int64[n, block_size])``,
        called once after each call that evicted cached blocks (committed work only).

    Raises
    ------
    InvalidGeometry
        If a size argument is smaller than 1.

    Notes
    -----
    Follows the deterministic policies of ``docs/design.md``: LIFO free-block and slot stacks,
    ids ``generation << 32 | slot``, release tail block first, eviction from the LRU head.
    Not thread-safe: one thread at a time.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_seqs: int = 1024,
        max_seq_len: int | None = None,
        prefix_caching: bool = True,
        on_evict: Callable | None = None,
    ):
        num_blocks = _as_int(num_blocks, "num_blocks")
        block_size = _as_int(block_size, "block_size")
        max_seqs = _as_int(max_seqs, "max_seqs")
        if max_seq_len is None:
            max_seq_len = min(max(num_blocks, 0) * max(block_size, 0), 32768)
        max_seq_len = _as_int(max_seq_len, "max_seq_len")
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("max_seqs", max_seqs),
            ("max_seq_len", max_seq_len),
        ):
            if value < 1:
                raise InvalidGeometry(f"{name} must be at least 1, got {value}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_seqs = max_seqs
        self._max_seq_len = max_seq_len
        self._prefix_caching = bool(prefix_caching)
        self._on_evict = on_evict

        self._ref = [0] * num_blocks
        self._tokens = [[-1] * block_size for _ in range(num_blocks)]
        self._key: list[tuple | None] = [None] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._prefix: dict[tuple, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._free = list(range(num_blocks - 1, -1, -1))  # pops 0, 1, 2, ...

        self._gen = [0] * max_seqs
        self._live = [False] * max_seqs
        self._table: list[list[int]] = [[] for _ in range(max_seqs)]
        self._len = [0] * max_seqs
        self._salt = [0] * max_seqs
        self._slots = list(range(max_seqs - 1, -1, -1))  # pops 0, 1, 2, ...

        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._failed_calls = 0  # outside the state: never rolled back
        self._evicted: list[tuple[int, int, list[int]]] = []  # evictions of the current call

    # ------------------------------------------------------------------ properties

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def max_seqs(self) -> int:
        """Live sequences at most."""
        return self._max_seqs

    @property
    def max_seq_len(self) -> int:
        """Tokens per sequence at most."""
        return self._max_seq_len

    @property
    def prefix_caching(self) -> bool:
        """Whether full blocks are registered and reused by :meth:`admit`."""
        return self._prefix_caching

    # ------------------------------------------------------------------ block helpers

    def _available(self) -> int:
        """Blocks that can be taken now: free plus cached."""
        return len(self._free) + len(self._lru)

    def _is_registered(self, block: int) -> bool:
        key = self._key[block]
        return key is not None and self._prefix.get(key) == block

    def _scrub(self, block: int) -> None:
        """Forget a block's content: fresh -1 payload row, no hash."""
        self._tokens[block] = [-1] * self._block_size
        self._key[block] = None
        self._hash[block] = None

    def _take_block(self) -> int:
        """Hand out one block (refcount set to 1): free stack top, else evict the LRU head."""
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._lru.popitem(last=False)
            del self._prefix[self._key[block]]
            self._evicted.append((block, self._hash[block], list(self._tokens[block])))
            self._counters["evictions"] += 1
        self._scrub(block)
        self._ref[block] = 1
        self._counters["allocations"] += 1
        return block

    def _drop_ref(self, block: int) -> None:
        """Drop one reference; at 0 a registered block is cached, any other one freed."""
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._is_registered(block):
                self._lru[block] = None  # most recently released at the tail
            else:
                self._scrub(block)
                self._free.append(block)

    def _register_if_full(self, slot: int, index: int) -> None:
        """Hash block ``index`` of sequence ``slot`` (just filled) and register it if new."""
        if not self._prefix_caching:
            return
        table = self._table[slot]
        block = table[index]
        row = self._tokens[block]
        if -1 in row:  # a token appended without an id: content unknown
            return
        prev = ROOT_HASH if index == 0 else self._hash[table[index - 1]]
        if prev is None:  # parent block without a hash
            return
        key = (prev, self._salt[slot], tuple(row))
        self._key[block] = key
        self._hash[block] = _hash64(key)
        self._prefix.setdefault(key, block)  # the first block with this key stays registered

    def _lookup_prefix(self, prompt: list[int], salt: int) -> list[int]:
        """Registered blocks matching the prompt's leading full blocks (at most ``(L-1)//bs``)."""
        if not self._prefix_caching:
            return []
        bs = self._block_size
        hits: list[int] = []
        prev = ROOT_HASH
        for j in range((len(prompt) - 1) // bs):
            block = self._prefix.get((prev, salt, tuple(prompt[j * bs : (j + 1) * bs])))
            if block is None:
                break
            hits.append(block)
            prev = self._hash[block]
        return hits

    # ------------------------------------------------------------------ sequence helpers

    def _take_slot(self, salt: int) -> int:
        slot = self._slots.pop()
        self._gen[slot] += 1
        self._live[slot] = True
        self._table[slot] = []  # a new list object (keeps admit snapshots valid)
        self._len[slot] = 0
        self._salt[slot] = salt
        return slot

    def _seq_id(self, slot: int) -> int:
        return self._gen[slot] << 32 | slot

    def _resolve(self, seq_id: int) -> int:
        """Slot of a live sequence id; raise ``InvalidSequence`` / ``SequenceReleased``."""
        seq_id = int(seq_id)
        slot, gen = seq_id & _SLOT_MASK, seq_id >> 32
        if seq_id < 0 or slot >= self._max_seqs or gen < 1 or gen > self._gen[slot]:
            raise InvalidSequence(seq_id)
        if gen != self._gen[slot] or not self._live[slot]:
            raise SequenceReleased(seq_id)
        return slot

    def _resolve_all(self, ids: np.ndarray, *, unique: bool, counts=None) -> list[int]:
        """Slots of ``ids``; per id in order: unknown/released, duplicate, too long."""
        slots: list[int] = []
        seen: set[int] = set()
        for i, seq_id in enumerate(ids.tolist()):
            slot = self._resolve(seq_id)
            if unique:
                if slot in seen:
                    raise ValueError(f"sequence id {seq_id} appears twice in one call")
                seen.add(slot)
            if counts is not None and self._len[slot] + counts[i] > self._max_seq_len:
                raise SequenceTooLong(seq_id, self._len[slot] + counts[i], self._max_seq_len)
            slots.append(slot)
        return slots

    def _check_slots_free(self, requested: int) -> None:
        if requested > len(self._slots):
            raise TooManySequences(requested, len(self._slots), self._max_seqs)

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
            self._drop_ref(old)
            self._counters["cow_copies"] += 1
            cow.append((old, new))
        for i in range(count):
            pos = n + i
            offset = pos % bs
            if offset == 0:
                table.append(self._take_block())
            block = table[-1]
            if tokens is not None:
                self._tokens[block][offset] = int(tokens[i])
            out.append(block * bs + offset)
            if offset == bs - 1:
                self._register_if_full(slot, len(table) - 1)
        self._len[slot] = n + count

    # ------------------------------------------------------------------ call bookkeeping

    def _begin_call(self) -> None:
        self._evicted = []

    def _commit_call(self) -> None:
        """Deliver this call's evictions to ``on_evict`` (after the call committed)."""
        evicted, self._evicted = self._evicted, []
        if evicted and self._on_evict is not None:
            self._on_evict(
                np.array([e[0] for e in evicted], dtype=np.int64),
                np.array([e[1] for e in evicted], dtype=np.uint64),
                np.array([e[2] for e in evicted], dtype=np.int64).reshape(
                    len(evicted), self._block_size
                ),
            )

    def _snapshot(self) -> dict:
        """Shallow copies of the state (see the module notes on why that suffices)."""
        return {name: getattr(self, name).copy() for name in _STATE}

    def _restore(self, snap: dict) -> None:
        for name, value in snap.items():
            setattr(self, name, value)
        self._evicted = []

    # ------------------------------------------------------------------ public API

    def new_sequences(self, count: int) -> np.ndarray:
        """Create ``count`` empty sequences (salt 0).

        Parameters
        ----------
        count : int
            Sequences to create, ``>= 0``.

        Returns
        -------
        numpy.ndarray of int64, shape (count,)
            The new ids, in slot-stack order.

        Raises
        ------
        TooManySequences
            If fewer than ``count`` sequence slots are free.
        """
        count = _as_int(count, "count")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._check_slots_free(count)
        return np.array([self._seq_id(self._take_slot(0)) for _ in range(count)], dtype=np.int64)

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
            Atomic mode only, when the call needs more blocks than free plus cached.
        """
        slots, counts, tokens = self._validate_append(ids, counts, tokens)
        available = self._available()
        if atomic:
            pending: dict[int, int] = {}
            needed = sum(
                self._append_need(s, c, pending) for s, c in zip(slots, counts, strict=True)
            )
            if needed > available:
                self._failed_calls += 1
                raise PoolExhausted(needed, available)
        self._begin_call()
        out: list[int] = []
        cow: list[tuple] = []
        ok = np.ones(len(slots), dtype=bool)
        start = 0
        for i, (slot, count) in enumerate(zip(slots, counts, strict=True)):
            chunk = None if tokens is None else tokens[start : start + count]
            if not atomic and self._append_need(slot, count, {}) > self._available():
                ok[i] = False
                out.extend([-1] * count)
            else:
                self._grow(slot, count, chunk, out, cow)
            start += count
        if not ok.all():
            self._failed_calls += 1
        self._commit_call()
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
        return needed <= self._available()

    def _admit_one(self, prompt: list[int], salt: int):
        """Admit one prompt if it fits now.

        Returns ``(needed, served)``: the blocks the prompt takes beyond its cache hits, and
        ``(id, cached tokens, slot mapping)`` or ``None`` if it did not fit (nothing changed).
        """
        bs, length = self._block_size, len(prompt)
        hits = self._lookup_prefix(prompt, salt)
        k = len(hits)
        needed = _blocks_for(length, bs) - k
        cached_hits = sum(1 for b in hits if self._ref[b] == 0)
        if needed > self._available() - cached_hits:
            return needed, None
        slot = self._take_slot(salt)
        for block in hits:  # claim the hits before allocating, so they are never evicted
            if self._ref[block] == 0:
                del self._lru[block]
            self._ref[block] += 1
            self._table[slot].append(block)
        self._len[slot] = k * bs
        if self._prefix_caching:
            self._counters["prefix_queries"] += (length - 1) // bs
            self._counters["prefix_hits"] += k
        out: list[int] = []
        self._grow(slot, length - k * bs, prompt[k * bs :], out, [])
        return needed, (self._seq_id(slot), k * bs, out)

    def _prompt_need(self, prompt: list[int], salt: int) -> int:
        return _blocks_for(len(prompt), self._block_size) - len(self._lookup_prefix(prompt, salt))

    def admit(self, tokens, lengths, *, salts=None, atomic: bool = True) -> AdmitResult:
        """Create one sequence per prompt, reusing cached blocks of the longest prefix.

        Parameters
        ----------
        tokens : array-like of int, shape (sum(lengths),)
            The prompts' token ids (``>= 0``), concatenated.
        lengths : array-like of int, shape (p,)
            Tokens per prompt, each ``>= 1``.
        salts : array-like of int, shape (p,), optional
            Cache salt per prompt (0 by default); blocks are shared only within one salt.
        atomic : bool, default True
            All prompts or none (raise ``PoolExhausted``); otherwise each prompt in order, all
            or nothing, failures reported in ``ok``.

        Returns
        -------
        AdmitResult
            ``ids`` (-1 if failed), ``num_cached_tokens`` (whole reused blocks, leaving at least
            one token uncached; 0 if failed), ``slot_mapping`` of the uncached tokens in prompt
            order (all ``length`` tokens -1 for a failed prompt), ``ok``.

        Raises
        ------
        TypeError, ValueError
            Bad input (dtype, shape, negative tokens, empty prompt, length mismatches).
        SequenceTooLong, TooManySequences
            A prompt beyond ``max_seq_len``; more prompts than free sequence slots.
        PoolExhausted
            Atomic mode only; ``needed`` sums ``blocks - hits`` over all prompts, with the hits
            of the failing and later prompts looked up at the failure point.
        """
        tokens = _as_int_array(tokens, "tokens")
        lengths = _as_int_array(lengths, "lengths")
        if (lengths < 1).any():
            raise ValueError("every prompt needs at least one token")
        if len(tokens) != int(lengths.sum()):
            raise ValueError(f"{len(tokens)} tokens given, lengths sum to {int(lengths.sum())}")
        if (tokens < 0).any():
            raise ValueError("token ids must be >= 0")
        if salts is None:
            salts = np.zeros(len(lengths), dtype=np.int64)
        salts = _as_int_array(salts, "salts")
        if len(salts) != len(lengths):
            raise ValueError(f"{len(salts)} salts given for {len(lengths)} prompts")
        for length in lengths:
            if length > self._max_seq_len:
                raise SequenceTooLong(-1, length, self._max_seq_len)
        self._check_slots_free(len(lengths))

        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        flat = tokens.tolist()
        prompts = [flat[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]
        salts = salts.tolist()
        available = self._available()
        # NOTE: a prompt of n blocks with k hits (c of them cached) uses up n - k + c <= n of
        # ``free + cached``, so when the prompts' blocks sum to at most ``available`` the call
        # cannot fail and needs no rollback. Otherwise an atomic call of several prompts keeps
        # a snapshot (a single prompt is checked before anything changes).
        total = sum(_blocks_for(len(p), self._block_size) for p in prompts)
        tight = atomic and len(prompts) > 1 and total > available
        snap = self._snapshot() if tight else None

        self._begin_call()
        ids = np.full(len(prompts), -1, dtype=np.int64)
        cached = np.zeros(len(prompts), dtype=np.int64)
        ok = np.zeros(len(prompts), dtype=bool)
        out: list[int] = []
        needed_so_far = 0
        for i, (prompt, salt) in enumerate(zip(prompts, salts, strict=True)):
            needed, served = self._admit_one(prompt, salt)
            if served is None and atomic:
                # later prompts: hits looked up at the failure point, before the rollback
                needed += needed_so_far + sum(
                    self._prompt_need(p, s)
                    for p, s in zip(prompts[i + 1 :], salts[i + 1 :], strict=True)
                )
                if snap is not None:
                    self._restore(snap)
                self._failed_calls += 1
                raise PoolExhausted(needed, available)
            if served is None:
                out.extend([-1] * len(prompt))
                continue
            ids[i], cached[i], slots = served
            ok[i] = True
            out.extend(slots)
            needed_so_far += needed
        if not ok.all():
            self._failed_calls += 1
        self._commit_call()
        return AdmitResult(
            ids=ids, num_cached_tokens=cached, slot_mapping=np.array(out, dtype=np.int64), ok=ok
        )

    def fork(self, ids, n: int = 1) -> np.ndarray:
        """Give each parent ``n`` children sharing all its blocks (refcount += n).

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live parent ids (repeats allowed).
        n : int, default 1
            Children per parent, ``>= 1``.

        Returns
        -------
        numpy.ndarray of int64, shape (m, n)
            Child ids; children copy the parent's table, length and salt.

        Raises
        ------
        ValueError
            ``n < 1`` or bad ``ids``.
        InvalidSequence, SequenceReleased, TooManySequences
        """
        ids = _as_int_array(ids, "ids")
        n = _as_int(n, "n")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        parents = self._resolve_all(ids, unique=False)
        self._check_slots_free(len(parents) * n)
        children = np.empty((len(parents), n), dtype=np.int64)
        for i, parent in enumerate(parents):
            for c in range(n):
                child = self._take_slot(self._salt[parent])
                self._table[child] = list(self._table[parent])
                self._len[child] = self._len[parent]
                for block in self._table[parent]:
                    self._ref[block] += 1
                children[i, c] = self._seq_id(child)
        return children

    def release(self, ids) -> None:
        """Release sequences in input order, dropping each one's blocks tail first.

        Parameters
        ----------
        ids : array-like of int, shape (m,)
            Live sequence ids, no duplicates.

        Raises
        ------
        ValueError
            Duplicate or malformed ids.
        InvalidSequence, SequenceReleased
        """
        ids = _as_int_array(ids, "ids")
        for slot in self._resolve_all(ids, unique=True):
            for block in reversed(self._table[slot]):
                self._drop_ref(block)
            self._live[slot] = False
            self._table[slot] = []
            self._len[slot] = 0
            self._salt[slot] = 0
            self._slots.append(slot)

    def block_tables(self, ids) -> np.ndarray:
        """Block tables of ``ids``, padded with -1.

        Returns
        -------
        numpy.ndarray of int32, shape (len(ids), width)
            ``width`` is the most blocks any of ``ids`` holds (0 for none).
        """
        slots = self._resolve_all(_as_int_array(ids, "ids"), unique=False)
        width = max((len(self._table[s]) for s in slots), default=0)
        out = np.full((len(slots), width), -1, dtype=np.int32)
        for i, slot in enumerate(slots):
            out[i, : len(self._table[slot])] = self._table[slot]
        return out

    def seq_lens(self, ids) -> np.ndarray:
        """Tokens held by each of ``ids``.

        Returns
        -------
        numpy.ndarray of int64, shape (len(ids),)
        """
        slots = self._resolve_all(_as_int_array(ids, "ids"), unique=False)
        return np.array([self._len[s] for s in slots], dtype=np.int64)

    # ------------------------------------------------------------------ introspection

    def _check_block(self, block) -> int:
        block = _as_int(block, "block")
        if not 0 <= block < self._num_blocks:
            raise IndexError(f"block {block} out of range 0..{self._num_blocks - 1}")
        return block

    def ref_count(self, block: int) -> int:
        """References live sequences hold on ``block``."""
        return self._ref[self._check_block(block)]

    def block_payload(self, block: int) -> np.ndarray:
        """Token payload of ``block``: int64[block_size], -1 where no token id is stored."""
        return np.array(self._tokens[self._check_block(block)], dtype=np.int64)

    def seq_tokens(self, seq_id: int) -> np.ndarray:
        """Token ids of a live sequence (-1 for tokens appended without ids), int64[len]."""
        slot = self._resolve(_as_int(seq_id, "seq_id"))
        flat = [t for block in self._table[slot] for t in self._tokens[block]]
        return np.array(flat[: self._len[slot]], dtype=np.int64)

    def free_blocks(self) -> list[int]:
        """Free block ids in stack order, bottom to top (the last one is handed out next)."""
        return list(self._free)

    def lru_blocks(self) -> list[int]:
        """Cached block ids from the LRU head (evicted next) to the tail."""
        return list(self._lru)

    def stats(self) -> Stats:
        """Counters and block census (``mapped_pages`` is always 0 in the model)."""
        free, cached = len(self._free), len(self._lru)
        return Stats(
            used=self._num_blocks - free - cached,
            cached=cached,
            free=free,
            mapped_pages=0,
            failed_calls=self._failed_calls,
            **self._counters,
        )

    def check(self) -> None:
        """Recompute the model's invariants from scratch.

        Raises
        ------
        InvariantViolation
            Naming the first inconsistency found.
        """
        bs, nb = self._block_size, self._num_blocks

        def fail(message: str):
            raise InvariantViolation(message)

        live = [s for s in range(self._max_seqs) if self._live[s]]
        if sorted(self._slots + live) != list(range(self._max_seqs)):
            fail("slot stack and live slots do not partition the sequence slots")
        refs = [0] * nb
        for slot in range(self._max_seqs):
            table, length = self._table[slot], self._len[slot]
            if not self._live[slot]:
                if table or length:
                    fail(f"free slot {slot} holds blocks or tokens")
                continue
            if len(table) != _blocks_for(length, bs) or length > self._max_seq_len:
                fail(f"slot {slot}: {len(table)} blocks for {length} tokens")
            for j, block in enumerate(table):
                if not 0 <= block < nb:
                    fail(f"slot {slot} references block {block} out of range")
                refs[block] += 1
                key = self._key[block]
                prev = ROOT_HASH if j == 0 else self._hash[table[j - 1]]
                if key is not None and (key[0] != prev or key[1] != self._salt[slot]):
                    fail(f"block {block} of slot {slot}: hash chain or salt mismatch")
                full = (j + 1) * bs <= length
                eligible = self._prefix_caching and full and prev is not None
                if key is None and eligible and -1 not in self._tokens[block]:
                    fail(f"block {block} of slot {slot}: full known block without a hash")
            if length % bs and any(t != -1 for t in self._tokens[table[-1]][length % bs :]):
                fail(f"slot {slot}: payload beyond the sequence end in block {table[-1]}")
        for block in range(nb):
            if refs[block] != self._ref[block]:
                fail(f"block {block}: refcount {self._ref[block]}, {refs[block]} references")
        if len(set(self._free)) != len(self._free) or set(self._free) & set(self._lru):
            fail("free stack holds a block twice or a cached block")
        for block in self._free:
            if self._ref[block] or self._key[block] is not None:
                fail(f"free block {block} is referenced or hashed")
            if any(t != -1 for t in self._tokens[block]):
                fail(f"free block {block} is not scrubbed")
        for block in self._lru:
            if self._ref[block] or not self._is_registered(block):
                fail(f"cached block {block} is referenced or not registered")
        unused = sum(1 for r in self._ref if r == 0)
        if unused != len(self._free) + len(self._lru):
            fail(f"{unused} unreferenced blocks, {len(self._free) + len(self._lru)} free/cached")
        for block in range(nb):
            key = self._key[block]
            if key is None:
                continue
            if tuple(self._tokens[block]) != key[2] or self._hash[block] != _hash64(key):
                fail(f"block {block}: payload or hash does not match its key")
        for key, block in self._prefix.items():
            if self._key[block] != key or not (self._ref[block] or block in self._lru):
                fail(f"prefix entry of block {block} is stale")
        c = self._counters
        if min(c.values()) < 0 or c["prefix_hits"] > c["prefix_queries"]:
            fail(f"inconsistent counters {c}")
        if c["evictions"] > c["allocations"] or c["cow_copies"] > c["allocations"]:
            fail(f"inconsistent counters {c}")
