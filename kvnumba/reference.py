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

With a page pool (:class:`ReferencePagePool`, ``blocks_per_page = k``, ``P = N / k`` virtual
pages; block ``b`` lives in page ``b // k``) ``_free`` stays empty and free blocks live in pages
instead (the page policy of ``docs/design.md``):

* ``_unmapped``: the LIFO stack of unmapped virtual pages (bottom..top); their blocks are free,
  scrubbed and on no list.
* ``_phys[v]``: physical page backing virtual page ``v``, -1 if unmapped.
* ``_page_free[v]``: LIFO free list of mapped page ``v`` (bottom..top), ``[]`` if unmapped.
* ``_buckets[c]`` (``1 <= c <= k-1``): mapped pages with ``c`` free blocks, front first.
* ``_cache_only``: virtual page -> stamp (a tick of the pool clock), head (oldest) first: the
  mapped pages holding cached blocks but no referenced block.

A page's referenced-block and cached-block counts are derived from ``_ref`` and ``_lru`` when
needed (``_page_used`` / ``_page_cached``) instead of being stored: fewer things to keep in
step, and ``check()`` compares the lists above against them.
"""

from __future__ import annotations

import copy
import numbers
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from kvnumba._ids import make_id, new_tag, next_generation, split_id
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

__all__ = ["ReferenceBlockManager", "ReferencePagePool"]

_MASK64 = (1 << 64) - 1
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
# Page state of a manager on a page pool, saved with deep copies (the lists inside are mutated).
_PAGE_STATE = ("_unmapped", "_phys", "_page_free", "_buckets", "_cache_only")


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


def _exhausted(needed: int, available: int, shortfall: int) -> PoolExhausted:
    """``PoolExhausted(needed, available)`` that also carries the blocks the call lacked."""
    error = PoolExhausted(needed, available)
    error.shortfall = shortfall
    return error


def _blocks_for(length: int, block_size: int) -> int:
    """Blocks needed to hold ``length`` tokens."""
    return -(-length // block_size)


class ReferencePagePool:
    """Pure-Python model of ``kvnumba.PagePool`` (private, one process) for the page policy.

    Parameters
    ----------
    num_pages : int
        Physical pages, ids ``0 .. num_pages - 1``; at least 1.
    on_map : callable, optional
        ``on_map(physical_ids int64[n], virtual_ids int64[n])``, called by a manager once per
        call that mapped pages, after the call committed.
    on_unmap : callable, optional
        ``on_unmap(physical_ids, virtual_ids)``, likewise for pages given back.

    Raises
    ------
    InvalidGeometry
        If ``num_pages`` is smaller than 1.

    Notes
    -----
    Free pages sit on a LIFO stack (a new pool pops ``0, 1, 2, ...``; a page given back is
    pushed on top). Each taken page records its owner ``(manager, virtual page)``. The logical
    clock stamps pages that become cache-only, so that sibling reclaim can pick the least
    recently used ones across managers. Managers on the pool register themselves in
    construction order; that order is the "registration order" of sibling reclaim.
    """

    def __init__(
        self,
        num_pages: int,
        on_map: Callable | None = None,
        on_unmap: Callable | None = None,
    ):
        num_pages = _as_int(num_pages, "num_pages")
        if num_pages < 1:
            raise InvalidGeometry(f"num_pages must be at least 1, got {num_pages}")
        self._num_pages = num_pages
        self.on_map = on_map
        self.on_unmap = on_unmap
        self._free = list(range(num_pages - 1, -1, -1))  # pops 0, 1, 2, ...
        self._owner: dict[int, tuple[ReferenceBlockManager, int]] = {}
        self._clock = 0
        self._managers: list[ReferenceBlockManager] = []

    @property
    def num_pages(self) -> int:
        """Physical pages in the pool."""
        return self._num_pages

    @property
    def num_free(self) -> int:
        """Pages on the free stack."""
        return len(self._free)

    @property
    def clock(self) -> int:
        """The logical clock: the last stamp handed out by :meth:`tick` (0 before any)."""
        return self._clock

    @property
    def managers(self) -> list[ReferenceBlockManager]:
        """Managers registered on this pool, in registration order (a copy)."""
        return list(self._managers)

    def free_pages(self) -> list[int]:
        """Free page ids in stack order, bottom to top (the last one is taken next).

        The same order as ``kvnumba.PagePool.state.free[:num_free]``.
        """
        return list(self._free)

    def owner_of(self, physical: int) -> tuple[ReferenceBlockManager, int] | None:
        """``(manager, virtual page)`` holding ``physical``, ``None`` if it is free."""
        return self._owner.get(_as_int(physical, "physical"))

    def tick(self) -> int:
        """Advance the logical clock and return its new value (1, 2, ...)."""
        self._clock += 1
        return self._clock

    # --- used by the managers -------------------------------------------------------------------

    def _register(self, manager: ReferenceBlockManager) -> None:
        self._managers.append(manager)

    def _take(self, manager: ReferenceBlockManager, virtual: int) -> int:
        """Pop the top free page and record its owner; the caller checked one is free."""
        physical = self._free.pop()
        self._owner[physical] = (manager, virtual)
        return physical

    def _give(self, physical: int) -> None:
        """Push ``physical`` back on the free stack (it is the next one taken)."""
        del self._owner[physical]
        self._free.append(physical)

    def _snapshot(self) -> tuple:
        return list(self._free), dict(self._owner), self._clock

    def _restore(self, snap: tuple) -> None:
        free, owner, clock = snap
        self._free, self._owner, self._clock = list(free), dict(owner), clock

    def _deliver(self, unmapped: list[tuple[int, int]], mapped: list[tuple[int, int]]) -> None:
        """Call ``on_unmap`` then ``on_map`` with ``(physical, virtual)`` records, if any."""
        for records, hook in ((unmapped, self.on_unmap), (mapped, self.on_map)):
            if records and hook is not None:
                hook(
                    np.array([r[0] for r in records], dtype=np.int64),
                    np.array([r[1] for r in records], dtype=np.int64),
                )

    def check(self) -> None:
        """Verify that free and owned pages partition the pool.

        Raises
        ------
        InvariantViolation
            Naming the first inconsistency.
        """
        if len(set(self._free)) != len(self._free):
            raise InvariantViolation("a page is on the free stack twice")
        for physical in self._free:
            if physical in self._owner:
                raise InvariantViolation(f"page {physical} is free and owned")
        if sorted(self._free + list(self._owner)) != list(range(self._num_pages)):
            raise InvariantViolation("free and owned pages do not partition the pool")
        for physical, (manager, virtual) in self._owner.items():
            if manager not in self._managers or manager._phys[virtual] != physical:
                raise InvariantViolation(f"page {physical}: owner record does not match")


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
    page_pool : ReferencePagePool, optional
        Physical page pool shared with other managers (two-level allocation). The manager
        registers itself on the pool.
    blocks_per_page : int, optional
        Blocks per virtual page ``k``; required with ``page_pool`` (and only with it) and must
        divide ``num_blocks``.
    id_tag : int, optional
        The tag in the top bits of the ids (``kvnumba._ids``): pass a ``BlockManager``'s
        ``id_tag`` to hand out the same ids as it does; a process-unique tag by default.

    Raises
    ------
    InvalidGeometry
        If a size argument is smaller than 1, if only one of ``page_pool`` and
        ``blocks_per_page`` is given, or if ``blocks_per_page`` does not divide ``num_blocks``.

    Notes
    -----
    Follows the deterministic policies of ``docs/design.md``: LIFO free-block and slot stacks,
    ids ``tag << 47 | generation << slot_bits | slot``, release tail block first, eviction from the LRU head; with
    a page pool, its page policy (fullest mapped page first, then map a page, then evict).
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

        # Page state (see the module notes); without a pool it stays empty and unused.
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

        self._id_tag = new_tag(self) if id_tag is None else _as_int(id_tag, "id_tag")
        self._gen = [0] * max_seqs
        self._live = [False] * max_seqs
        self._table: list[list[int]] = [[] for _ in range(max_seqs)]
        self._len = [0] * max_seqs
        self._salt = [0] * max_seqs
        self._slots = list(range(max_seqs - 1, -1, -1))  # pops 0, 1, 2, ...

        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._failed_calls = 0  # outside the state: never rolled back
        self._evicted: list[tuple[int, int, list[int]]] = []  # evictions of the current call
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
    def page_pool(self) -> ReferencePagePool | None:
        """The page pool, or ``None``."""
        return self._pool

    @property
    def blocks_per_page(self) -> int | None:
        """Blocks per virtual page, or ``None`` without a page pool."""
        return self._k if self._pool is not None else None

    # ------------------------------------------------------------------ block helpers

    def _available(self) -> int:
        """Blocks that can be taken now: free plus cached (plus mappable pages times ``k``)."""
        if self._pool is None:
            return len(self._free) + len(self._lru)
        free_mapped = sum(len(blocks) for blocks in self._page_free)
        mappable = min(self._pool.num_free, len(self._unmapped))
        return free_mapped + len(self._lru) + mappable * self._k

    def _is_registered(self, block: int) -> bool:
        key = self._key[block]
        return key is not None and self._prefix.get(key) == block

    def _scrub(self, block: int) -> None:
        """Forget a block's content: fresh -1 payload row, no hash."""
        self._tokens[block] = [-1] * self._block_size
        self._key[block] = None
        self._hash[block] = None

    def _evict(self, block: int) -> None:
        """Forget cached ``block``: off the LRU list and the prefix table, recorded, counted."""
        del self._lru[block]
        del self._prefix[self._key[block]]
        self._evicted.append((block, self._hash[block], list(self._tokens[block])))
        self._counters["evictions"] += 1
        self._scrub(block)

    def _take_block(self) -> int:
        """Hand out one block (refcount set to 1).

        Without a pool: free stack top, else evict the LRU head. With one: see
        :meth:`_take_paged`.
        """
        if self._pool is not None:
            block = self._take_paged()
        elif self._free:
            block = self._free.pop()
        else:
            block = next(iter(self._lru))
            self._evict(block)
        self._scrub(block)
        self._ref[block] = 1
        self._counters["allocations"] += 1
        return block

    def _drop_ref(self, block: int) -> None:
        """Drop one reference; at 0 a registered block is cached, any other one freed."""
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._pool is not None:
                self._drop_last_paged(block)
            elif self._is_registered(block):
                self._lru[block] = None  # most recently released at the tail
            else:
                self._scrub(block)
                self._free.append(block)

    # ------------------------------------------------------------------ page helpers

    def _page_blocks(self, v: int) -> range:
        return range(v * self._k, (v + 1) * self._k)

    def _page_used(self, v: int) -> int:
        """Blocks of page ``v`` referenced by a sequence."""
        return sum(1 for b in self._page_blocks(v) if self._ref[b])

    def _page_cached(self, v: int) -> int:
        """Blocks of page ``v`` on the LRU list."""
        return sum(1 for b in self._page_blocks(v) if b in self._lru)

    def _enter_bucket(self, v: int) -> None:
        """Put mapped page ``v`` at the front of the bucket of its free count (none if 0)."""
        c = len(self._page_free[v])
        if c:
            self._buckets[c].insert(0, v)

    def _leave_bucket(self, v: int) -> None:
        c = len(self._page_free[v])
        if c:
            self._buckets[c].remove(v)

    def _map_page(self) -> int:
        """Map the top unmapped virtual page to the pool's top page; return the virtual page.

        Its free list holds its blocks with ``v*k`` on top (popped first), then ``v*k+1``, ...
        The caller checked that the pool has a free page and an unmapped page is left.
        """
        v = self._unmapped.pop()
        physical = self._pool._take(self, v)
        self._phys[v] = physical
        self._page_free[v] = list(reversed(self._page_blocks(v)))
        self._mapped_log.append((physical, v))
        return v

    def _unmap_page(self, v: int) -> None:
        """Give page ``v`` (all blocks free, in no bucket) back: physical page, then virtual."""
        physical = self._phys[v]
        self._pool._give(physical)
        self._phys[v] = -1
        self._page_free[v] = []
        self._unmapped.append(v)
        self._unmapped_log.append((physical, v))

    def _take_paged(self) -> int:
        """Take a block under the page policy (refcount still 0; the caller sets it).

        The front page of the lowest non-empty bucket (the fullest mapped page with a free
        block) gives the top of its free list; else a new page is mapped if the pool has a free
        page and a virtual page is left; else the LRU head is evicted.
        """
        for c in range(1, self._k):
            if self._buckets[c]:
                v = self._buckets[c].pop(0)
                block = self._page_free[v].pop()
                self._enter_bucket(v)  # front of bucket c - 1 (none when that is 0)
                break
        else:
            if self._pool.num_free and self._unmapped:
                v = self._map_page()
                block = self._page_free[v].pop()
                self._enter_bucket(v)  # bucket k - 1 (none when k == 1)
            else:
                block = next(iter(self._lru))
                self._evict(block)
                v = block // self._k
        # The page now holds a referenced block, so it is no longer cache-only (a page is on
        # that list exactly when it holds cached blocks but no referenced one).
        self._cache_only.pop(v, None)
        return block

    def _drop_last_paged(self, block: int) -> None:
        """A block's refcount just reached 0 on a manager with a page pool."""
        v = block // self._k
        if self._is_registered(block):
            self._lru[block] = None  # most recently released at the tail
        else:
            self._scrub(block)
            self._leave_bucket(v)
            self._page_free[v].append(block)
            if len(self._page_free[v]) == self._k:
                self._unmap_page(v)
                return
            self._enter_bucket(v)
        if self._page_used(v) == 0:  # cached blocks but no referenced one left
            self._cache_only[v] = self._pool.tick()

    def _give_up_pages(self, count: int) -> int:
        """Trim the first ``count`` pages of the cache-only list (head first); return count.

        Per page: evict its cached blocks in ascending block id (as an eviction for
        allocation does), then unmap it.
        """
        for _ in range(count):
            v, _ = self._cache_only.popitem(last=False)
            for block in self._page_blocks(v):
                if block in self._lru:
                    self._evict(block)
            self._leave_bucket(v)
            self._unmap_page(v)
        return count

    def _cache_only_pages_of_siblings(self) -> int:
        return sum(len(m._cache_only) for m in self._pool._managers if m is not self)

    def _ask_siblings(self, shortfall: int) -> list | None:
        """Sibling reclaim for an atomic call that failed with ``PoolExhausted``.

        Asks the other managers registered on the pool for ``wanted = ceil(shortfall / k)``
        cache-only pages (``shortfall``: the blocks the call lacked where it failed), chosen one at a time by smallest stamp among the
        siblings' next list heads, and makes each sibling (in registration order) give up its
        chosen pages as :meth:`trim` does.

        Returns
        -------
        list of (manager, snapshot) or None
            The siblings that gave up pages, with their state (pool included) from before;
            ``None`` (nothing changed) when no pool, ``wanted < 1``, too few cache-only pages
            among the siblings, or fewer than ``pool.num_free + wanted`` unmapped virtual pages
            here.
        """
        if self._pool is None:
            return None
        wanted = -(-shortfall // self._k)
        if wanted < 1 or self._pool.num_free + wanted > len(self._unmapped):
            return None
        if self._cache_only_pages_of_siblings() < wanted:
            return None
        siblings = [m for m in self._pool._managers if m is not self]
        chosen = [0] * len(siblings)  # a prefix of each sibling's cache-only list
        stamps = [list(m._cache_only.values()) for m in siblings]
        for _ in range(wanted):
            best = min(
                (i for i in range(len(siblings)) if chosen[i] < len(stamps[i])),
                key=lambda i: stamps[i][chosen[i]],
            )
            chosen[best] += 1
        # Snapshots first (each includes the pool as it is now), then the work.
        reclaimed = [(m, m._snapshot()) for m, n in zip(siblings, chosen, strict=True) if n]
        for (m, _), n in zip(reclaimed, [n for n in chosen if n], strict=True):
            m._begin_call()
            m._give_up_pages(n)
        return reclaimed

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
        self._gen[slot] = next_generation(self._gen[slot], self._max_seqs)
        self._live[slot] = True
        self._table[slot] = []  # a new list object (keeps admit snapshots valid)
        self._len[slot] = 0
        self._salt[slot] = salt
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
        """Copies of the state: shallow for blocks and sequences (see the module notes on why
        that suffices), deep for the page lists, plus the pool's state."""
        snap = {name: getattr(self, name).copy() for name in _STATE}
        if self._pool is not None:
            snap.update({name: copy.deepcopy(getattr(self, name)) for name in _PAGE_STATE})
            snap["pool"] = self._pool._snapshot()
        return snap

    def _restore(self, snap: dict) -> None:
        for name, value in snap.items():
            if name == "pool":
                self._pool._restore(value)
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
            reclaimed = self._ask_siblings(first.shortfall) if atomic else None
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
            Atomic mode only, when the call needs more blocks than available (free plus
            cached, plus mappable pages times ``blocks_per_page``) even after sibling reclaim.
        """
        slots, counts, tokens = self._validate_append(ids, counts, tokens)
        return self._run(lambda: self._append(slots, counts, tokens, atomic), atomic)

    def _append(self, slots, counts, tokens, atomic: bool) -> AppendResult:
        """One attempt of :meth:`append` on validated input (callbacks left pending)."""
        self._begin_call()
        available = self._available()
        if atomic:
            pending: dict[int, int] = {}
            needed = sum(
                self._append_need(s, c, pending) for s, c in zip(slots, counts, strict=True)
            )
            if needed > available:
                raise _exhausted(needed, available, needed - available)
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
        if self._pool is None:
            return needed <= self._available()
        # Sibling reclaim can add the siblings' cache-only pages to the pool's free ones, as
        # far as this manager has virtual pages to map them to.
        free_mapped = sum(len(blocks) for blocks in self._page_free)
        pages = self._pool.num_free + self._cache_only_pages_of_siblings()
        mappable = min(pages, len(self._unmapped))
        return needed <= free_mapped + len(self._lru) + mappable * self._k

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
                if self._pool is not None:  # its page holds a referenced block again
                    self._cache_only.pop(block // self._k, None)
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
        return self._run(lambda: self._admit(prompts, salts, atomic), atomic)

    def _admit(self, prompts: list[list[int]], salts: list[int], atomic: bool) -> AdmitResult:
        """One attempt of :meth:`admit` on validated input (callbacks left pending)."""
        self._begin_call()
        available = self._available()
        # NOTE: a prompt of n blocks with k hits (c of them cached) uses up n - k + c <= n of
        # ``free + cached``, so when the prompts' blocks sum to at most ``available`` the call
        # cannot fail and needs no rollback. Otherwise an atomic call of several prompts keeps
        # a snapshot (a single prompt is checked before anything changes).
        total = sum(_blocks_for(len(p), self._block_size) for p in prompts)
        tight = atomic and len(prompts) > 1 and total > available
        snap = self._snapshot() if tight else None

        ids = np.full(len(prompts), -1, dtype=np.int64)
        cached = np.zeros(len(prompts), dtype=np.int64)
        ok = np.zeros(len(prompts), dtype=bool)
        out: list[int] = []
        needed_so_far = 0
        for i, (prompt, salt) in enumerate(zip(prompts, salts, strict=True)):
            needed, served = self._admit_one(prompt, salt)
            if served is None and atomic:
                # later prompts: hits looked up at the failure point, before the rollback
                later = sum(
                    self._prompt_need(p, s)
                    for p, s in zip(prompts[i + 1 :], salts[i + 1 :], strict=True)
                )
                # What the call lacks here: this prompt's cached hits use up capacity too.
                cached_hits = sum(1 for b in self._lookup_prefix(prompt, salt) if self._ref[b] == 0)
                shortfall = needed + later - (self._available() - cached_hits)
                needed += needed_so_far + later
                if snap is not None:
                    self._restore(snap)
                raise _exhausted(needed, available, shortfall)
            if served is None:
                out.extend([-1] * len(prompt))
                continue
            ids[i], cached[i], slots = served
            ok[i] = True
            out.extend(slots)
            needed_so_far += needed
        if not ok.all():
            self._failed_calls += 1
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
        slots = self._resolve_all(ids, unique=True)
        self._begin_call()
        for slot in slots:
            for block in reversed(self._table[slot]):
                self._drop_ref(block)
            self._live[slot] = False
            self._table[slot] = []
            self._len[slot] = 0
            self._salt[slot] = 0
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
        """Cached block ids from the LRU head (evicted next) to the tail."""
        return list(self._lru)

    def mapped_pages(self) -> np.ndarray:
        """Physical pages this manager holds, in ascending virtual page order.

        Returns
        -------
        numpy.ndarray of int64
            Empty without a page pool.
        """
        return np.array([p for p in self._phys if p >= 0], dtype=np.int64)

    def _check_page(self, v) -> int:
        v = _as_int(v, "v")
        if not 0 <= v < len(self._phys):
            raise IndexError(f"virtual page {v} out of range 0..{len(self._phys) - 1}")
        return v

    def page_of_virtual(self, v: int) -> int:
        """Physical page backing virtual page ``v``, -1 if it is unmapped."""
        return self._phys[self._check_page(v)]

    def page_free_list(self, v: int) -> list[int]:
        """Free list of virtual page ``v``, bottom to top (``[]`` if unmapped or full)."""
        return list(self._page_free[self._check_page(v)])

    def unmapped_pages(self) -> list[int]:
        """Unmapped virtual pages in stack order, bottom to top (the last one is mapped next)."""
        return list(self._unmapped)

    def bucket_pages(self, free_count: int) -> list[int]:
        """Mapped virtual pages with ``free_count`` free blocks (1..k-1), front first."""
        free_count = _as_int(free_count, "free_count")
        if not 1 <= free_count < self._k:
            raise IndexError(f"no bucket {free_count}; buckets are 1..{self._k - 1}")
        return list(self._buckets[free_count])

    def cache_only_pages(self) -> list[tuple[int, int]]:
        """``(virtual page, stamp)`` of the cache-only pages, head (given up first) to tail."""
        return list(self._cache_only.items())

    def stats(self) -> Stats:
        """Counters and block census (``free`` includes the blocks of unmapped pages)."""
        cached = len(self._lru)
        used = sum(1 for r in self._ref if r)
        return Stats(
            used=used,
            cached=cached,
            free=self._num_blocks - used - cached,
            mapped_pages=len(self._phys) - len(self._unmapped),
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
        unused = sum(1 for r in self._ref if r == 0)
        if unused != len(free) + len(self._lru):
            fail(f"{unused} unreferenced blocks, {len(free) + len(self._lru)} free/cached")
        if self._pool is not None:
            self._check_pages(fail)
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

    def _check_pages(self, fail: Callable) -> None:
        """Page invariants (the blocks themselves were checked by :meth:`check`)."""
        k, pool = self._k, self._pool
        num_pages = len(self._phys)
        if len(set(self._unmapped)) != len(self._unmapped):
            fail("a virtual page is on the unmapped stack twice")
        if not set(self._unmapped) <= set(range(num_pages)):
            fail("the unmapped stack holds a page out of range")
        if self not in pool._managers:
            fail("manager is not registered on its pool")
        pool.check()
        in_bucket: dict[int, int] = {}
        for c in range(1, k):
            for v in self._buckets[c]:
                if v in in_bucket:
                    fail(f"page {v} is in buckets {in_bucket[v]} and {c}")
                in_bucket[v] = c
        stamps = list(self._cache_only.values())
        if stamps != sorted(set(stamps)) or (stamps and stamps[-1] > pool.clock):
            fail(f"cache-only stamps {stamps} are not increasing up to the pool clock")
        for v in range(num_pages):
            physical, free = self._phys[v], self._page_free[v]
            if v in self._unmapped:
                if physical != -1 or free or v in in_bucket or v in self._cache_only:
                    fail(f"unmapped page {v} is backed, has a free list or is listed")
                if any(self._ref[b] or b in self._lru for b in self._page_blocks(v)):
                    fail(f"unmapped page {v} holds a referenced or cached block")
                continue
            if physical < 0 or pool._owner.get(physical) != (self, v):
                fail(f"page {v}: physical page {physical} is not owned by it in the pool")
            used, cached = self._page_used(v), self._page_cached(v)
            if sorted(free) != [
                b for b in self._page_blocks(v) if not self._ref[b] and b not in self._lru
            ]:
                fail(f"page {v}: free list {free} does not hold exactly its free blocks")
            if len(free) == k:
                fail(f"page {v} is mapped with all {k} blocks free")
            if in_bucket.get(v, 0) != len(free):
                fail(f"page {v} with {len(free)} free blocks is in bucket {in_bucket.get(v)}")
            if (v in self._cache_only) != (used == 0 and cached > 0):
                fail(f"page {v} ({used} used, {cached} cached): wrong cache-only membership")
        mine = sum(1 for manager, _ in pool._owner.values() if manager is self)
        if mine != num_pages - len(self._unmapped):
            fail(f"the pool records {mine} pages of this manager")
