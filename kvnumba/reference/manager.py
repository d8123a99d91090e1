"""The model's block manager: constructor, properties, sequences and the remaining public API.

:class:`ReferenceBlockManager` is composed of the mixins of ``blocks``, ``prefix``, ``pages``,
``calls`` and ``checks``; this module holds its state (built in the constructor), the sequence
slots and ids, ``new_sequences``, ``fork``, ``release``, ``trim``, the block tables and the
introspection that is not about pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from kvnumba.errors import (
    InvalidGeometry,
    InvalidSequence,
    SequenceReleased,
    SequenceTooLong,
    TooManySequences,
)
from kvnumba.eviction import policy_code
from kvnumba.ids import ID_TAG_BITS, make_id, new_tag, next_generation, split_id
from kvnumba.reference._common import _COUNTERS, _as_int, _as_int_array
from kvnumba.reference.blocks import BlocksMixin
from kvnumba.reference.calls import CallsMixin
from kvnumba.reference.checks import ChecksMixin
from kvnumba.reference.engine import EngineMixin
from kvnumba.reference.eviction import PriorityRulePolicy, make_policy
from kvnumba.reference.keys import KeysMixin
from kvnumba.reference.one_request import OneRequestMixin
from kvnumba.reference.pages import PagesMixin
from kvnumba.reference.pool import ReferencePagePool
from kvnumba.reference.prefix import PrefixMixin
from kvnumba.results import Stats
from kvnumba.windows import NULL_BLOCK, KVCacheGroup, group_geometry, window_geometry


class ReferenceBlockManager(
    OneRequestMixin,
    KeysMixin,
    EngineMixin,
    CallsMixin,
    PagesMixin,
    PrefixMixin,
    BlocksMixin,
    ChecksMixin,
):
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
    page_pool : ReferencePagePool, optional
        Physical page pool shared with other managers (two-level allocation). The manager
        registers itself on the pool.
    blocks_per_page : int, optional
        Blocks per virtual page ``k``; required with ``page_pool`` (and only with it) and must
        divide ``num_blocks``.
    id_tag : int, optional
        The tag in the top bits of the ids (``kvnumba.ids``): pass a ``BlockManager``'s
        ``id_tag`` to hand out the same ids as it does; a process-unique tag by default.
    reserved_blocks : int, default 0
        Blocks ``0 .. reserved_blocks - 1`` are never handed out; 0 with a page pool.
    block_keys : bool, default False
        Blocks are registered only under engine keys (``admit(keys=...)``, :meth:`set_keys`),
        never by hashing their tokens (``reference.keys``).
    block_events : bool, default False
        Record stored/removed block events for :meth:`take_events`.
    eviction : str, default "lru"
        The eviction policy, a name of ``kvnumba.EVICTION_POLICIES`` (``docs/eviction.md``).
    sliding_window : int, optional
        Windowed attention (``docs/windows.md``): the token at position ``p`` attends to
        ``p - sliding_window + 1 .. p``; the blocks that leave the window are released.
    attention_chunk_size : int, optional
        Chunked local attention: the token at ``p`` attends to its own chunk of this many
        tokens (a multiple of ``block_size``). At most one of the two; neither is full
        attention.
    _hash_bits : int, default 64
        Accepted for the kernels' test knob (it narrows their table hash to force collisions);
        the model compares whole keys, so it changes nothing here.
    _hindsight : bool, default False
        Also accept the policies that need the future of a trace (``"oracle"``): the
        simulator's managers only.

    Raises
    ------
    InvalidGeometry
        If a size argument is smaller than 1, if only one of ``page_pool`` and
        ``blocks_per_page`` is given, if ``blocks_per_page`` does not divide ``num_blocks``,
        or for a bad attention kind (both set, below 1, a chunk not a multiple of
        ``block_size``).
    ValueError
        If ``eviction`` names no policy (or ``"oracle"`` without ``_hindsight``).

    Notes
    -----
    Follows the deterministic policies of ``docs/design.md``: LIFO free-block and slot stacks,
    ids ``tag << 47 | generation << slot_bits | slot``, release tail block first, eviction of
    the policy's victim (the LRU head with ``lru``); with a page pool, its page policy
    (fullest mapped page first, then map a page, then evict).
    Not thread-safe: one thread at a time (for all managers of one pool together).
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
        page_pool: ReferencePagePool | None = None,
        blocks_per_page: int | None = None,
        id_tag: int | None = None,
        reserved_blocks: int = 0,
        block_keys: bool = False,
        block_events: bool = False,
        eviction: str = "lru",
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        kv_cache_groups=None,
        window_release: str = "append",
        cache_duplicates: bool = False,
        _hash_bits: int = 64,
        _hindsight: bool = False,
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
        if (page_pool is None) != (blocks_per_page is None):
            raise InvalidGeometry("page_pool and blocks_per_page go together")
        if page_pool is not None:
            if not isinstance(page_pool, ReferencePagePool):
                raise TypeError(f"page_pool must be a ReferencePagePool, got {type(page_pool)}")
            blocks_per_page = _as_int(blocks_per_page, "blocks_per_page")
            if blocks_per_page < 1 or num_blocks % blocks_per_page:
                raise InvalidGeometry(
                    f"blocks_per_page={blocks_per_page} does not divide num_blocks={num_blocks}"
                )
        reserved_blocks = _as_int(reserved_blocks, "reserved_blocks")
        if not 0 <= reserved_blocks < num_blocks:
            raise InvalidGeometry(
                f"reserved_blocks must be in [0, {num_blocks}), got {reserved_blocks}"
            )
        if reserved_blocks and page_pool is not None:
            raise InvalidGeometry("reserved_blocks must be 0 with a page pool")
        if not 0 <= _as_int(_hash_bits, "_hash_bits") <= 64:
            raise InvalidGeometry("_hash_bits must be in [0, 64]")
        policy_code(eviction, hindsight=bool(_hindsight))  # ValueError for an unknown name
        # Every KV cache group's sliding window and attention chunk in tokens, 0 when unset
        # (kvnumba.windows). A sequence's group is its salt modulo the number of groups: the
        # salt of a prompt's sequence in group g is salt * groups + g.
        self._groups = [window_geometry(sliding_window, attention_chunk_size, block_size)]
        if kv_cache_groups is not None:
            if self._groups != [(0, 0)]:
                raise InvalidGeometry(
                    "give the attention kind in kv_cache_groups, not also on the manager"
                )
            self._groups = list(group_geometry(kv_cache_groups, block_size))
        if window_release not in ("append", "explicit"):
            raise ValueError(
                f"window_release must be 'append' or 'explicit', got {window_release!r}"
            )
        # Appends release no out-of-window block; only release_window does.
        self._explicit_release = window_release == "explicit"
        # The window code runs: some group is windowed, or there are several.
        self._windowed = len(self._groups) > 1 or any(map(any, self._groups))
        self._block_keys = bool(block_keys)
        self._block_events = bool(block_events)
        self._events: list[tuple[int, int, tuple]] = []  # (kind, block, key words), undrained
        self._reserved = reserved_blocks
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
        self._twins: dict[tuple, tuple[int, ...]] = {}
        # Register a full block even when its key is registered (after the first).
        self._cache_duplicates = bool(cache_duplicates)
        self._lru: OrderedDict[int, None] = OrderedDict()
        # Picks the victims among _lru.
        self._policy = make_policy(eviction, num_blocks, block_size)
        # Pops reserved_blocks, reserved_blocks + 1, ...; reserved blocks are never listed.
        self._free = list(range(num_blocks - 1, reserved_blocks - 1, -1))
        # Blocks whose content counts as unknown (a token appended without an id, or
        # reset_prefix_cache): never hashed when they fill (the kernels' cleared F_KNOWN).
        self._unknown: set[int] = set()
        # Blocks a truncation cut into while they were shared (the kernels' F_TRIMMED): a
        # holder's partial tail may end inside content and a hash that are not its own.
        self._trimmed: set[int] = set()

        # Page state (see the package notes); without a pool it stays empty and unused.
        self._pool = page_pool
        self._k = blocks_per_page or 0
        num_pages = num_blocks // self._k if page_pool is not None else 0
        self._unmapped = list(range(num_pages - 1, -1, -1))  # pops 0, 1, 2, ...
        self._phys = [-1] * num_pages
        self._page_free: list[list[int]] = [[] for _ in range(num_pages)]
        self._buckets: list[list[int]] = [[] for _ in range(self._k)]  # index 0 unused
        self._cache_only: OrderedDict[int, int] = OrderedDict()
        if page_pool is not None:
            self._free = []  # free blocks live in pages (or in unmapped pages)

        if id_tag is None:
            id_tag = new_tag(self)
        elif not 1 <= _as_int(id_tag, "id_tag") < 1 << ID_TAG_BITS:
            raise InvalidGeometry(f"id_tag must be in 1 .. {(1 << ID_TAG_BITS) - 1}, got {id_tag}")
        self._id_tag = int(id_tag)
        self._gen = [0] * max_seqs
        self._live = [False] * max_seqs
        self._table: list[list[int]] = [[] for _ in range(max_seqs)]
        self._len = [0] * max_seqs
        self._salt = [0] * max_seqs
        self._seq_tag = [0] * max_seqs  # set_sequence_tags: the tag a release gives (0: none)
        # Windowed attention: the hash of the highest-position block that left the window
        # (None: none left, or it had no hash), the parent hash of the block after the gap.
        self._anchor: list[int | None] = [None] * max_seqs
        self._slots = list(range(max_seqs - 1, -1, -1))  # pops 0, 1, 2, ...

        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._failed_calls = 0  # outside the state: never rolled back
        self._evicted: list[tuple[int, int | None, list[int]]] = []  # evictions of the current call
        self._unmapped_log: list[tuple[int, int]] = []  # (physical, virtual) of this call
        self._mapped_log: list[tuple[int, int]] = []
        if page_pool is not None:
            page_pool._register(self)

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
    def reserved_blocks(self) -> int:
        """Blocks ``0 .. reserved_blocks - 1``, never handed out."""
        return self._reserved

    @property
    def id_tag(self) -> int:
        """The tag in the top bits of every id this manager hands out."""
        return self._id_tag

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

    @property
    def block_keys(self) -> bool:
        """Whether blocks are registered under engine keys instead of chained hashes."""
        return self._block_keys

    @property
    def sliding_window(self) -> int | None:
        """Tokens of the sliding window, or ``None`` (also with several KV cache groups)."""
        return self._groups[0][0] or None if len(self._groups) == 1 else None

    @property
    def attention_chunk_size(self) -> int | None:
        """Tokens per chunk of chunked local attention, or ``None`` (also with several KV
        cache groups)."""
        return self._groups[0][1] or None if len(self._groups) == 1 else None

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        """The KV cache groups (one but for a manager made with ``kv_cache_groups``)."""
        return tuple(KVCacheGroup(w or None, c or None) for w, c in self._groups)

    def _kind(self, slot: int) -> tuple[int, int]:
        """``(window, chunk)`` of the KV cache group of sequence ``slot``."""
        return self._groups[self._salt[slot] % len(self._groups)]

    @property
    def eviction(self) -> str:
        """The eviction policy's name."""
        return self._policy.name

    @property
    def page_pool(self) -> ReferencePagePool | None:
        """The page pool, or ``None``."""
        return self._pool

    @property
    def blocks_per_page(self) -> int | None:
        """Blocks per virtual page, or ``None`` without a page pool."""
        return self._k if self._pool is not None else None

    # ------------------------------------------------------------------ sequence helpers

    def _take_slot(self, salt: int) -> int:
        slot = self._slots.pop()
        self._gen[slot] = next_generation(self._gen[slot], self._max_seqs)
        self._live[slot] = True
        self._table[slot] = []  # a new list object (keeps admit snapshots valid)
        self._len[slot] = 0
        self._salt[slot] = salt
        self._anchor[slot] = None
        return slot

    def _seq_id(self, slot: int) -> int:
        return make_id(self._id_tag, self._gen[slot], slot, self._max_seqs)

    def _resolve(self, seq_id: int) -> int:
        """Slot of a live sequence id; raise ``InvalidSequence`` / ``SequenceReleased``."""
        seq_id = int(seq_id)
        tag, gen, slot = split_id(seq_id, self._max_seqs) if seq_id >= 0 else (-1, 0, 0)
        if tag != self._id_tag or slot >= self._max_seqs or gen < 1 or gen > self._gen[slot]:
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
        groups = len(self._groups)
        self._check_slots_free(count * groups)
        taken = [self._seq_id(self._take_slot(i % groups)) for i in range(count * groups)]
        ids = np.array(taken, dtype=np.int64)
        return ids if groups == 1 else ids.reshape(count, groups)

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
            Child ids; children copy the parent's table (``NULL_BLOCK`` entries included),
            length, salt and anchor.

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
                self._seq_tag[child] = self._seq_tag[parent]
                self._anchor[child] = self._anchor[parent]
                for block in self._table[parent]:
                    if block != NULL_BLOCK:  # a position that left the window holds nothing
                        self._ref[block] += 1
                children[i, c] = self._seq_id(child)
        return children

    def release(self, ids) -> None:
        """Release sequences in input order, dropping each one's blocks tail first (the
        blocks still held: not the ``NULL_BLOCK`` entries of a windowed sequence).

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
        slots = self._resolve_all(ids, unique=True)
        self._begin_call()
        for slot in slots:
            self._policy.releasing(self._len[slot], self._seq_tag[slot])
            for block in reversed(self._table[slot]):
                if block != NULL_BLOCK:
                    self._drop_ref(block)
            self._live[slot] = False
            self._table[slot] = []
            self._len[slot] = 0
            self._salt[slot] = 0
            self._seq_tag[slot] = 0
            self._anchor[slot] = None
            self._slots.append(slot)
        self._commit_call()  # pages that emptied: the pool's on_unmap

    def trim(self) -> int:
        """Evict the cached blocks of cache-only pages and unmap those pages.

        Walks the cache-only list from its head (least recently stamped first); per page,
        evicts its cached blocks in ascending block id (hash entry removed, reported to
        ``on_evict``, payload scrubbed, counted) and gives the page back to the pool.

        Returns
        -------
        int
            Pages unmapped (0 without a page pool).
        """
        if self._pool is None:
            return 0
        self._begin_call()
        count = self._give_up_pages(len(self._cache_only))
        self._commit_call()
        return count

    def set_next_use(self, block_ids, next_use) -> None:
        """Tell the ``oracle`` policy when blocks are used next, in order (a later entry for
        the same block wins).

        Registering a block resets its next use to -1; prefix hits leave it. A cached block's
        new next use counts at once.

        Parameters
        ----------
        block_ids : array-like of int, shape (n,)
            Blocks, ``0 <= block_ids[i] < num_blocks``.
        next_use : array-like of int, shape (n,)
            Each block's next use (e.g. the position in the trace of the next request using
            its content), ``>= -1``; -1: never used again.

        Raises
        ------
        ValueError
            A policy other than ``oracle``, lengths that differ, a block out of range or a
            next use below -1 (nothing changed).
        TypeError
            Non-integer input.
        """
        if self._policy.name != "oracle" and not isinstance(self._policy, PriorityRulePolicy):
            raise ValueError(
                f"set_next_use needs the oracle policy or a priority policy, not "
                f"{self._policy.name!r}"
            )
        blocks, uses = self._per_block(block_ids, next_use, "next_use")
        if (uses < -1).any():
            raise ValueError("next_use must be >= -1")
        for block, use in zip(blocks.tolist(), uses.tolist(), strict=True):
            self._policy.set_next_use(block, use)

    def set_tags(self, block_ids, tags) -> None:
        """Tag blocks for a priority policy (its ``tag`` feature), in order (a later entry for
        the same block wins). Registering a block resets its tag to 0.

        Parameters
        ----------
        block_ids : array-like of int, shape (n,)
            Blocks, ``0 <= block_ids[i] < num_blocks``.
        tags : array-like of int, shape (n,)
            Each block's tag.

        Raises
        ------
        ValueError
            A policy other than a priority policy, lengths that differ or a block out of range
            (nothing changed).
        TypeError
            Non-integer input.
        """
        if not isinstance(self._policy, PriorityRulePolicy):
            raise ValueError(f"set_tags needs a priority policy, not {self._policy.name!r}")
        blocks, values = self._per_block(block_ids, tags, "tags")
        for block, tag in zip(blocks.tolist(), values.tolist(), strict=True):
            self._policy.set_tag(block, tag)

    def set_sequence_tags(self, seq_ids, tags) -> None:
        """Tag live sequences for a priority policy, in order (a later entry for the same
        sequence wins): a block that a tagged sequence's release caches takes the sequence's
        tag as its ``tag`` feature (0: no tag, the block keeps its own). Children of ``fork``
        inherit the parent's tag; a released sequence's slot forgets it.

        Parameters
        ----------
        seq_ids : array-like of int, shape (n,)
            Live sequence ids (repeats allowed).
        tags : array-like of int, shape (n,)
            Each sequence's tag.

        Raises
        ------
        ValueError
            A policy other than a priority policy, or lengths that differ (nothing changed).
        InvalidSequence, SequenceReleased
            An unknown or released id (nothing changed).
        TypeError
            Non-integer input.
        """
        if not isinstance(self._policy, PriorityRulePolicy):
            raise ValueError(
                f"set_sequence_tags needs a priority policy, not {self._policy.name!r}"
            )
        ids = _as_int_array(seq_ids, "seq_ids")
        values = _as_int_array(tags, "tags")
        if len(ids) != len(values):
            raise ValueError(f"{len(ids)} seq_ids and {len(values)} tags")
        slots = self._resolve_all(ids, unique=False)
        for slot, tag in zip(slots, values.tolist(), strict=True):
            self._seq_tag[slot] = tag

    def _per_block(self, block_ids, values, name: str):
        """Validated ``(blocks, values)`` of a call giving one value per block of the pool."""
        blocks = _as_int_array(block_ids, "block_ids")
        values = _as_int_array(values, name)
        if len(blocks) != len(values):
            raise ValueError(f"{len(blocks)} block_ids and {len(values)} {name} values")
        for i, block in enumerate(blocks.tolist()):
            if not 0 <= block < self._num_blocks:
                raise ValueError(f"block_ids[{i}] = {block} is outside the pool")
        return blocks, values

    def block_tables(self, ids) -> np.ndarray:
        """Block tables of ``ids``, padded with -1.

        Returns
        -------
        numpy.ndarray of int32, shape (len(ids), width)
            ``width`` is the most table entries any of ``ids`` has (0 for none); the positions
            that left a windowed sequence's window read ``NULL_BLOCK`` (-2).
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
        """Token ids of a live sequence (-1 for tokens appended without ids, and for the
        positions that left a windowed sequence's window), int64[len]."""
        slot = self._resolve(_as_int(seq_id, "seq_id"))
        gone = [-1] * self._block_size
        flat = [
            t
            for block in self._table[slot]
            for t in (gone if block == NULL_BLOCK else self._tokens[block])
        ]
        return np.array(flat[: self._len[slot]], dtype=np.int64)

    def free_blocks(self) -> list[int]:
        """Free block ids in stack order, bottom to top (the last one is handed out next).

        With a page pool there is no single free stack: this returns the free lists of the
        mapped pages (each bottom to top) concatenated in ascending virtual page order, which is
        not a hand-out order (see :meth:`page_free_list`); blocks of unmapped pages are free
        too but not listed.
        """
        if self._pool is None:
            return list(self._free)
        return [b for blocks in self._page_free for b in blocks]

    def lru_blocks(self) -> list[int]:
        """Cached block ids in release order, oldest first (with ``lru``, evicted first)."""
        return list(self._lru)

    def stats(self) -> Stats:
        """Counters and block census (``free`` includes the blocks of unmapped pages)."""
        cached = len(self._lru)
        used = sum(1 for r in self._ref if r) + self._reserved  # reserved blocks count as used
        return Stats(
            used=used,
            cached=cached,
            free=self._num_blocks - used - cached,
            mapped_pages=len(self._phys) - len(self._unmapped),
            failed_calls=self._failed_calls,
            **self._counters,
        )
