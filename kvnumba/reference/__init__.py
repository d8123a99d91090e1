"""A deliberately simple pure-Python model of the kvnumba contract.

:class:`ReferenceBlockManager` implements the batched API of ``kvnumba.BlockManager`` with
plain lists, dicts and an :class:`collections.OrderedDict` (numpy only builds the result arrays),
following the deterministic policies of ``docs/design.md`` and ``docs/eviction.md`` exactly. It
serves two purposes:

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
  block with known content and hashed parent, and its 64-bit hash; ``None`` otherwise. With
  ``block_keys=True`` the engine's key ``(salt, w0, w1, w2, w3)`` and its word 0 instead.
* ``_prefix``: key -> the registered block with that key (the first block that filled with it).
* ``_twins``: key -> the later blocks registered with it, oldest first (``cache_duplicates``);
  when the block in ``_prefix`` leaves, the oldest twin takes its place.
* ``_events``: undrained block events ``(kind, block, key words)`` (``block_events=True``).
* ``_lru``: registered blocks at refcount 0, least recently released first (for every
  eviction policy).
* ``_policy_hints``: the eviction policy's state (``reference.eviction``), which picks the victim of
  an allocation among ``_lru``.
* ``_free``: the LIFO free stack (bottom..top); every free block is scrubbed and unhashed.
* per sequence slot: ``_gen``, ``_live``, ``_table`` (block ids), ``_len``, ``_salt``,
  ``_anchor``; ``_slots`` is the LIFO stack of free slots.

Windowed attention (``docs/windows.md``; ``_window`` / ``_chunk`` in tokens, 0 when unset, at
most one set): a table entry whose block left the window is ``NULL_BLOCK`` (-2), never a block
id; those entries are a prefix of the table, below the sequence's first needed block, and hold
no reference. ``_anchor[slot]`` is the hash of the highest-position block that left the window
(``None`` when none left or it had no hash): the parent hash of the block that fills right
after the gap, so that a windowed sequence registers the keys a full-attention one would. The
rules themselves (first needed block, the hit of a windowed prompt) are ``kvnumba.windows``'s,
called as they are.

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

The package splits the model along the seams of the kernels (each module says what it models):

* ``_common``: constants (``ROOT_HASH``, the state names) and small validation helpers;
* ``pool``: :class:`ReferencePagePool`;
* ``blocks``: taking, releasing, evicting and scrubbing blocks (free stack and LRU list);
* ``eviction``: the eviction policies (``lru``, ``lfu``, ``sieve``, ``leaf-lru``, ``oracle``),
  one dataclass each, told of blocks entering and leaving the cache;
* ``prefix``: the prefix table (registering full blocks, looking up a prompt's prefix);
* ``keys``: engine block keys and block events (prompt parsing, hits, ``lookup``,
  ``set_keys``, ``take_events``, the keyed part of ``check()``);
* ``pages``: virtual pages on a page pool (buckets, map/unmap, sibling reclaim, trim);
* ``calls``: ``append``, ``admit``, ``can_append``, the window drops of ``append`` and the call
  bookkeeping (snapshot, rollback, callbacks);
* ``engine``: ``truncate``, ``evict``, ``reset_prefix_cache``;
* ``checks``: ``check()``, the invariants recomputed from scratch;
* ``manager``: :class:`ReferenceBlockManager`, composed of the mixins above.
"""

from __future__ import annotations

from kvnumba.reference._common import ROOT_HASH as ROOT_HASH
from kvnumba.reference.manager import ReferenceBlockManager
from kvnumba.reference.pool import ReferencePagePool

# The public classes keep the module they had before the split: ``kvnumba.reference`` is their
# documented home (reprs, pickles), and the benchmarks tell the model from the kernels by it.
ReferenceBlockManager.__module__ = __name__
ReferencePagePool.__module__ = __name__

__all__ = ["ReferenceBlockManager", "ReferencePagePool"]
