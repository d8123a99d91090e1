"""``BlockManager``: the public calls of the facade over the kernels.

Each public call validates and converts its input and hands it to one of the parts a manager
owns (``docs/design.md``, "Layers"):

- :class:`~kvnumba._arenas.Arenas`: the state and scratch arenas;
- :class:`~kvnumba._kernel_set.KernelSet`: the entry kernels, ``k_append`` and so on;
- :class:`~kvnumba._pipeline.CallPipeline`: run, retry, roll back, raise, deliver callbacks;
- :class:`~kvnumba._engine_keys.EngineKeys`: engine keys and block events;
- :class:`~kvnumba._one_request.OneRequest`: the one-request calls past their fast path;
- :class:`~kvnumba.pages.member.PageSide`: membership of a page pool (None without one).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from kvnumba import errors as E
from kvnumba._arenas import Arenas, check_arena_bytes, validated_geometry
from kvnumba._engine_keys import EngineKeys
from kvnumba._kernel_set import KernelSet
from kvnumba._kernels.check import MESSAGES
from kvnumba._layout import M_LIVE_SEQS, S_FAILED
from kvnumba._one_request import OneRequest
from kvnumba._pipeline import CallPipeline, Facts, part_call
from kvnumba._policy_hints import PolicyHints
from kvnumba.eviction import PRIORITY_CODE, policy_code
from kvnumba.ids import new_tag
from kvnumba.inputs import (
    CAP_NONE,
    INT64,
    NO_TOKENS,
    UINT64,
    count_arg,
    index_array,
    int64_vector,
    prompt_arrays,
    switch,
)
from kvnumba.kernels import (
    ADMIT_ONE_CACHED,
    ADMIT_ONE_ID,
    APPEND_ONE_RESULT,
    APPEND_RESULT,
    STATUS,
    admit_result_of,
    append_result_of,
    bad_of,
    count_of,
    needed_of,
    new_ids_of,
    status_of,
    values_of,
    violation_of,
)
from kvnumba.pages.member import PageSide
from kvnumba.priority import resolve as resolve_priority
from kvnumba.results import AdmitResult, AppendResult, Stats
from kvnumba.windows import KVCacheGroup

DEFAULT_MAX_SEQS = 1024
_INT64_MAX = np.iinfo(np.int64).max
# Building a NamedTuple from a tuple skips its keyword-argument __new__.
_new_append_result = AppendResult._make
_new_admit_result = AdmitResult._make


def _append_result(result) -> AppendResult:
    """The :class:`AppendResult` of an ``AppendLayout``."""
    return _new_append_result(append_result_of(result))


def _admit_result(result) -> AdmitResult:
    """The :class:`AdmitResult` of an ``AdmitLayout``."""
    return _new_admit_result(admit_result_of(result))


# A copy would share nothing sound: the views alias one arena, the one-request calls its address.
_NOT_COPYABLE = (
    "a BlockManager cannot be copied; snapshot() copies its state arrays, and a new manager "
    "replays the calls that built it"
)


def _geometry_property(name: str, doc: str) -> property:
    return property(operator.attrgetter("_geometry." + name), doc=doc)


class BlockManager:
    """A paged KV-cache block manager over a fixed pool of equal-size blocks.

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool.
    block_size : int
        Token slots per block.
    max_seqs : int, default 1024
        Live sequences at most.
    max_seq_len : int, optional
        Tokens per sequence at most; ``min(num_blocks * block_size, 32768)`` by default.
    prefix_caching : bool, default True
        Keep released full blocks with known content cached for reuse by ``admit``.
    on_evict : callable, optional
        ``on_evict(block_ids, block_hashes, tokens)`` (int64 ids, uint64 hashes, int64
        ``(n, block_size)`` payload copies), once per call that reclaimed cached blocks, after
        it committed.
    page_pool : PagePool, optional
        Two-level allocation: virtual page ``b // blocks_per_page`` of block ``b`` is backed by
        a physical page of this pool while any of its blocks is referenced or cached.
    blocks_per_page : int, optional
        Blocks per virtual page; required with ``page_pool`` and must divide ``num_blocks``.
    max_state_bytes : int, optional
        Refuse (``InvalidGeometry``) a geometry whose arrays need more bytes; without it the
        bound is what the process may use (physical memory, ``RLIMIT_AS``).
    reserved_blocks : int, default 0
        Blocks ``0 .. reserved_blocks - 1`` are never handed out (vLLM's null block) and count
        as used; 0 with a page pool.
    block_keys : bool, default False
        Register full blocks under the engine's 256-bit keys (``admit(keys=...)``,
        :meth:`set_keys`) instead of chained token hashes.
    block_events : bool, default False
        Record stored/removed block events, drained by :meth:`take_events`.
    eviction : str or PriorityPolicy, default "lru"
        The eviction policy: a name of ``kvnumba.EVICTION_POLICIES``, a
        :class:`kvnumba.priority.PriorityPolicy` of your own, or ``"module:attribute"`` naming
        one (``docs/eviction.md``).
    sliding_window : int, optional
        Sliding-window attention of ``W`` tokens: blocks no later token can reach leave each
        sequence as it grows, and a prompt's hit needs only its last window
        (``docs/windows.md``).
    attention_chunk_size : int, optional
        Chunked local attention with chunks of ``C`` tokens (a multiple of ``block_size``):
        blocks before the current chunk leave each sequence as it grows. Not with
        ``sliding_window``.
    kv_cache_groups : sequence of KVCacheGroup, optional
        Several KV cache groups over the one pool (a model whose layers differ in attention
        kind): every prompt is admitted into each group, as one sequence per group, with the
        hit all the groups' rules allow; ``admit`` and ``new_sequences`` return one column of
        ids per group (``docs/windows.md``). Not with ``sliding_window`` or
        ``attention_chunk_size``.
    window_release : {"append", "explicit"}, default "append"
        Who releases the blocks that leave a window: every ``append`` (for the sequences it
        grows), or only :meth:`release_window`, with the lengths the engine has processed.
    cache_duplicates : bool, default False
        Register a full block even when an equal block (same key) is registered already, as
        vLLM does: the copy is cached when released, evicted like any cached block (with its
        removed event), and found by lookups once every copy registered before it is gone.
        By default only the first is registered and a copy is freed when released.

    Notes
    -----
    Not thread-safe: use one manager from one thread at a time. ``docs/design.md`` describes
    the state layout and the allocation policy.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_seqs: int = DEFAULT_MAX_SEQS,
        max_seq_len: int | None = None,
        prefix_caching: bool = True,
        on_evict: Callable | None = None,
        page_pool=None,
        blocks_per_page: int | None = None,
        max_state_bytes: int | None = None,
        reserved_blocks: int = 0,
        block_keys: bool = False,
        block_events: bool = False,
        eviction="lru",
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        kv_cache_groups=None,
        window_release: str = "append",
        cache_duplicates: bool = False,
        _hash_bits: int = 64,
        _hindsight: bool = False,
    ):
        switches: dict[str, Any] = {"prefix_caching": prefix_caching, "block_keys": block_keys}
        switches["block_events"] = block_events
        switches["eviction"] = policy_code(eviction, hindsight=_hindsight)
        priority = resolve_priority(eviction) if switches["eviction"] == PRIORITY_CODE else None
        switches["priority_leaves"] = priority is not None and priority.leaves_only
        switches["priority_forest"] = priority is not None and priority.needs_forest()
        switches["priority_features"] = 0 if priority is None else priority.stored_features()
        switches["sliding_window"] = sliding_window
        switches["attention_chunk_size"] = attention_chunk_size
        switches["kv_cache_groups"] = kv_cache_groups
        switches["window_release"] = window_release
        switches["cache_duplicates"] = cache_duplicates
        pages = (page_pool, blocks_per_page)
        sizes = (num_blocks, block_size, max_seqs, max_seq_len, reserved_blocks, _hash_bits)
        geometry = validated_geometry(*sizes, *pages, **switches)
        if on_evict is not None and not callable(on_evict):
            raise TypeError("on_evict must be callable")
        check_arena_bytes(geometry, on_evict is not None, max_state_bytes)
        self._geometry = geometry
        self._id_tag = new_tag(self)
        self._arenas = Arenas(geometry, self._id_tag, on_evict is not None)
        # A policy other than LRU, a window or several groups: the kernels' extended version
        # (``docs/design.md``).
        extended = geometry.eviction != 0 or geometry.windowed
        self._groups = len(geometry.groups)
        self._kernels = KernelSet(page_pool is not None, policy=extended)
        self._facts = Facts(self._arenas, self._kernels)
        self._policy = PolicyHints(geometry, self._arenas, self._kernels, self._facts, priority)
        self._keys = EngineKeys(self._arenas, self._kernels, self._facts, block_keys, block_events)
        parts = (self._arenas, self._kernels, self._keys, self._facts, on_evict)
        self._pages = None if page_pool is None else PageSide(self, page_pool, *parts)
        self._pipeline = CallPipeline(*parts, self._pages)
        self._one = OneRequest(self._pipeline, self._keys)
        # The one-request fast paths: LRU managers without a pool (keyed admits: with keys).
        self._fast = self._one.fast
        # The batched append's first try: any manager without a page pool (on a pool, the
        # pipeline's reclaim loop runs every call).
        self._append_fast = page_pool is None
        self._max_seq_len = geometry.max_seq_len  # read by every append
        # Nothing to deliver after a commit: no eviction callback and no block events.
        self._quiet = on_evict is None and not block_events
        self._keyed_fast = self._fast and geometry.block_keys

    def __copy__(self, memo=None):
        raise TypeError(_NOT_COPYABLE)

    __deepcopy__ = __copy__

    def __repr__(self) -> str:
        s = self.stats()
        pages = f", mapped_pages={s.mapped_pages}" if self._pages is not None else ""
        live = int(self._arenas.s.meta[M_LIVE_SEQS])
        return (
            f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"used={s.used}, cached={s.cached}, free={s.free}, live_seqs={live}{pages})"
        )

    num_blocks = _geometry_property("num_blocks", "Blocks in the pool.")
    block_size = _geometry_property("block_size", "Token slots per block.")
    max_seqs = _geometry_property("max_seqs", "Live sequences at most.")
    max_seq_len = _geometry_property("max_seq_len", "Tokens per sequence at most.")
    reserved_blocks = _geometry_property("reserved_blocks", "Blocks never handed out.")
    prefix_caching = _geometry_property("prefix_caching", "Whether full blocks are cached.")
    block_keys = _geometry_property("block_keys", "Whether blocks carry engine keys.")
    eviction = property(lambda self: self._policy.name, doc="The eviction policy's name.")
    sliding_window = property(
        lambda self: self._single_group[0] or None,
        doc="Sliding window in tokens (None: none, or several KV cache groups).",
    )
    attention_chunk_size = property(
        lambda self: self._single_group[1] or None,
        doc="Attention chunk in tokens (None: none, or several KV cache groups).",
    )
    kv_cache_groups = property(
        lambda self: tuple(KVCacheGroup(w or None, c or None) for w, c in self._geometry.groups),
        doc="The KV cache groups (one but for a manager made with ``kv_cache_groups``).",
    )

    @property
    def _single_group(self) -> tuple[int, int]:
        groups = self._geometry.groups
        return groups[0] if len(groups) == 1 else (0, 0)

    id_tag = property(lambda self: self._id_tag, doc="The tag of this manager's ids.")
    page_pool = property(lambda self: self._pages and self._pages.pool, doc="Its PagePool.")
    blocks_per_page = property(
        lambda self: self._geometry.blocks_per_page or None, doc="Blocks per page (or None)."
    )

    state = property(lambda self: self._arenas.views, doc="Read-only views of the state arrays.")
    snapshot = part_call("_arenas", Arenas.snapshot)

    # ---------------------------------------------------------------------------- batched API
    def new_sequences(self, count: int) -> np.ndarray:
        """Create ``count`` (>= 0) empty sequences; returns their int64 ids
        (``TooManySequences`` if fewer slots are free). With several KV cache groups, one
        sequence per group each: ids of shape ``(count, groups)``.
        """
        if type(count) is not int or count < 0:
            count = count_arg(count, "count", 0)
        slots = count * self._groups
        if slots > self._geometry.max_seqs:  # before anything is allocated for the ids
            raise E.TooManySequences(slots, self._facts.free_slots(), self.max_seqs)
        result = self._kernels.k_new_sequences(slots, *self._arenas.args)
        if status_of(result):
            self._pipeline.fail(status_of(result), -1, requested=slots)
        ids = new_ids_of(result)
        return ids if self._groups == 1 else ids.reshape(count, self._groups)

    def append(self, ids, counts, tokens=None, *, atomic: bool = True) -> AppendResult:
        """Grow each sequence ``ids[i]`` by ``counts[i]`` tokens; ``tokens`` holds their ids.

        Without ``tokens`` the slots read -1 and the blocks are never cached. Returns an
        :class:`AppendResult` (``slot_mapping`` per token, ``cow_src -> cow_dst`` copies, ``ok``
        per sequence). ``atomic=False`` serves each sequence in input order, all-or-nothing.
        A failed call changes nothing and raises ``PoolExhausted``, ``InvalidSequence``,
        ``SequenceTooLong``, ``ValueError`` or ``TypeError``; a callback that raised after the
        commit, ``CallbackError`` (``.result`` is the result).
        """
        # C-contiguous int64 vectors pass without a call (``==``: numba's own dtype objects).
        if not (type(ids) is np.ndarray and ids.dtype == INT64 and ids.flags.c_contiguous):
            ids = int64_vector(ids, "ids")
        if not (type(counts) is np.ndarray and counts.dtype == INT64 and counts.flags.c_contiguous):
            counts = int64_vector(counts, "counts")
        if ids.ndim != 1 or counts.ndim != 1:
            ids, counts = int64_vector(ids, "ids"), int64_vector(counts, "counts")
        if tokens is None:
            tokens_in, has_tokens = NO_TOKENS, False
        else:
            tokens_in, has_tokens = index_array(tokens, "tokens"), True
        if atomic is not True:  # the common case skips a call
            atomic = switch(atomic, "atomic")
        inputs = (ids, counts, tokens_in, has_tokens, atomic, self._max_seq_len)
        first = None
        if self._append_fast:
            # The decode step commits here without the pipeline's generality; anything else
            # (a failure, more record buffers) continues in the pipeline from this result.
            first = self._kernels.k_append(*inputs, *self._arenas.args)
            if first[STATUS] == 0:
                if atomic is not True and self._arenas.scr[S_FAILED]:
                    self._pipeline.failed_calls += 1
                out = _new_append_result(first[APPEND_RESULT])
                if not self._quiet:
                    self._pipeline.after_commit(out)
                return out
        arenas = self._arenas
        return self._pipeline.run(
            self._kernels.k_append,
            inputs,
            atomic=atomic,
            grow=lambda result: arenas.grow_records(needed_of(result)),
            build=_append_result,
            first=first,
            ids=ids,
            counts=counts,
        )

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
        """Create one sequence per prompt, reusing the longest cached prefix of each.

        Parameters
        ----------
        tokens : 1-D integer array-like, or None
            All prompts' token ids (>= 0), concatenated; None only with ``block_keys=True``.
        lengths : 1-D integer array-like
            Tokens per prompt (each >= 1).
        salts : 1-D integer array-like, optional
            Per-prompt cache salt (default 0); blocks are never shared across salts.
        keys, key_counts : optional
            ``block_keys=True``: the engine keys (uint64 ``[K, 4]``) of the prompts' leading
            full blocks, ``key_counts[i]`` rows per prompt (default ``lengths // block_size``).
        max_hit_blocks : int or 1-D integer array-like, optional
            Cap on the blocks reused per prompt.
        atomic : bool, default True
            All prompts or none; otherwise prompts in order, each all-or-nothing.

        Returns
        -------
        AdmitResult
            ``ids`` (-1 for a prompt that did not fit), ``num_cached_tokens``, ``slot_mapping``
            of the uncached tokens in prompt order, ``ok``. A failed call changes nothing and
            raises ``PoolExhausted``, ``SequenceTooLong``, ``TooManySequences``,
            ``ValueError`` or ``TypeError``; ``CallbackError`` as for :meth:`append`.
        """
        if atomic is not True:
            atomic = switch(atomic, "atomic")
        keyed = keys is not None or max_hit_blocks is not None or tokens is None
        if keyed or self._geometry.block_keys:
            inputs, named = self._keys.admit_inputs(
                tokens, lengths, salts, keys, key_counts, max_hit_blocks, atomic
            )
            return self._admit(self._kernels.k_admit_keys, inputs, atomic, named)
        if key_counts is not None:
            raise ValueError("key_counts without keys")
        tokens_in, lengths, salts = prompt_arrays(tokens, lengths, salts, self._groups)
        inputs = (tokens_in, lengths, salts, atomic)
        return self._admit(
            self._kernels.k_admit, inputs, atomic, {"lengths": lengths, "tokens": tokens_in}
        )

    def _admit(self, kernel, inputs, atomic, named):
        """Run an admit kernel, its record buffers sized for its prompts."""
        prompts, arenas, blocks = named["lengths"].shape[0], self._arenas, self.num_blocks
        build, groups = _admit_result, self._groups
        if groups > 1:

            def build(r):
                ids, num_cached_tokens, slot_mapping, ok = admit_result_of(r)
                return AdmitResult(
                    ids.reshape(prompts, groups), num_cached_tokens, slot_mapping, ok
                )

        return self._pipeline.run(
            kernel,
            inputs,
            atomic=atomic,
            grow=lambda r: arenas.grow_records(min(needed_of(r), blocks), needed_of(r), prompts),
            build=build,
            **named,
        )

    def fork(self, ids, n: int = 1) -> np.ndarray:
        """Give every sequence of ``ids`` ``n`` (>= 1) children that share all of its blocks;
        returns their int64 ids, shape ``(len(ids), n)``.
        """
        ids = index_array(ids, "ids")
        if type(n) is not int or n < 1:
            n = count_arg(n, "n", 1)
        if (
            ids.shape[0] * n > self._geometry.max_seqs
        ):  # before anything is allocated for the children
            self.seq_lens(ids)  # an invalid id still takes precedence
            free = self._facts.free_slots()
            raise E.TooManySequences(ids.shape[0] * n, free, self.max_seqs)
        if n > _INT64_MAX:  # no parents, so no TooManySequences; the kernel takes an int64
            raise ValueError(f"n must be below 2**63, got {n}")
        result = self._kernels.k_fork(ids, n, *self._arenas.args)
        if status_of(result):
            requested = ids.shape[0] * n
            self._pipeline.fail(status_of(result), bad_of(result), requested=requested, ids=ids)
        return values_of(result)

    def release(self, ids) -> None:
        """Drop every reference of each sequence, tail block first; the ids become invalid.
        Full blocks with known content stay cached, every other block is freed."""
        ids = index_array(ids, "ids")
        self._pipeline.run(self._kernels.k_release, (ids,), ids=ids)

    def truncate(self, ids, new_lens) -> None:
        """Shorten each sequence ``ids[i]`` to ``new_lens[i]`` tokens (rejected speculative tokens).

        Whole blocks past the new end drop one reference each, tail first (as :meth:`release`); a
        block the new end cuts into stays as the partial tail (``docs/design.md``, "Shrinking").
        Never fails for lack of blocks; nothing is changed by a failed call.
        """
        ids = index_array(ids, "ids")
        new_lens = index_array(new_lens, "new_lens")
        if new_lens.shape != ids.shape:
            raise ValueError(f"new_lens has {new_lens.shape[0]} entries for {ids.shape[0]} ids")
        self._pipeline.run(self._kernels.k_truncate, (ids, new_lens), ids=ids, new_lens=new_lens)

    def release_window(self, ids, lengths) -> int:
        """Release, for each sequence ``ids[i]``, the blocks that its tokens from position
        ``lengths[i]`` on cannot reach (its group's window; ``docs/windows.md``), highest
        position first, as an ``append`` at that length would; returns how many.

        For an engine that frees on the tokens it has processed (``window_release="explicit"``:
        appends then release nothing themselves). ``0 <= lengths[i] <= seq_len``; ids live and
        distinct (``ValueError``, ``InvalidSequence``, ``SequenceReleased``: nothing changed).
        Never allocates or evicts; a full-attention sequence releases nothing.
        """
        ids = index_array(ids, "ids")
        lengths = index_array(lengths, "lengths")
        if lengths.shape != ids.shape:
            raise ValueError(f"lengths has {lengths.shape[0]} entries for {ids.shape[0]} ids")
        return self._pipeline.run(
            self._kernels.k_release_window,
            (ids, lengths),
            build=lambda result: int(count_of(result)),
            ids=ids,
            lengths=lengths,
        )

    def evict(self, block_ids) -> int:
        """Evict the given cached blocks, in order, as the LRU eviction does; returns the count.

        Free and reserved blocks are skipped; an id outside the pool or a referenced block is
        ``ValueError`` (nothing changed). ``CallbackError.result`` is the count.
        """
        blocks = index_array(block_ids, "block_ids")
        return self._pipeline.run_evicting(self._kernels.k_evict, (blocks,), block_ids=blocks)

    set_next_use = part_call("_policy", PolicyHints.set_next_use)
    set_tags = part_call("_policy", PolicyHints.set_tags)
    set_sequence_tags = part_call("_policy", PolicyHints.set_sequence_tags)

    def reset_prefix_cache(self) -> int:
        """Evict every cached block and unregister those live sequences hold, so that nothing
        computed before the reset is hit afterwards; returns the blocks evicted.
        """
        return self._pipeline.run_evicting(self._kernels.k_reset_prefix_cache, ())

    def block_tables(self, ids) -> np.ndarray:
        """Block tables of ``ids`` as int32 ``(len(ids), width)``, padded with -1."""
        return self._pipeline.read(self._kernels.k_block_tables, index_array(ids, "ids"))

    def seq_lens(self, ids) -> np.ndarray:
        """Tokens held by each sequence of ``ids`` (int64)."""
        return self._pipeline.read(self._kernels.k_seq_lens, index_array(ids, "ids"))

    def can_append(self, ids, counts) -> bool:
        """Whether ``append(ids, counts, atomic=True)`` would succeed now (input validated)."""
        ids, counts = index_array(ids, "ids"), index_array(counts, "counts")
        if self._pages is not None:
            return self._pages.can_append(ids, counts)
        return self._pipeline.can_append(ids, counts)

    lookup = part_call("_keys", EngineKeys.lookup)
    set_keys = part_call("_keys", EngineKeys.set_keys)
    take_events = part_call("_keys", EngineKeys.take_events)
    lookup_one = part_call("_one", OneRequest.lookup_one)

    pending_events = property(lambda self: self._keys.pending, doc="Whether events wait.")

    # ---------------------------------------------------------------------- one request
    def append_one(self, seq_id, count, *, key_start=0, keys=None) -> tuple[int, int, int, int]:
        """Grow one sequence by ``count`` tokens without token ids (atomic); with ``keys``,
        register the blocks at positions ``key_start ..`` once full (as :meth:`set_keys`).

        Returns ``(blocks_before, blocks_after, cow_src, cow_dst)``: the new blocks are table
        positions ``blocks_before .. blocks_after - 1``; ``-1, -1`` for no block copy. Raises as
        ``append`` and ``set_keys``, changing nothing.
        """
        if keys is None and self._fast and type(seq_id) is int and type(count) is int:
            if 0 <= count <= self._max_seq_len:
                r = self._kernels.k_append_one(seq_id, count, *self._arenas.one_args)
                if r[STATUS] == 0:
                    out = r[APPEND_ONE_RESULT]
                    if not self._quiet:
                        self._pipeline.after_commit(out)
                    return out
                return self._one.append_one(self, seq_id, count, key_start, keys, tried=True)
        return self._one.append_one(self, seq_id, count, key_start, keys)

    def admit_one(
        self, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None
    ) -> tuple[int | tuple[int, ...], int]:
        """Admit one prompt (atomic) by its ``tokens``, or by ``length`` and engine ``keys``
        (``block_keys=True``), reusing its longest cached prefix (at most ``max_hit_blocks``);
        returns ``(seq_id, num_cached_tokens)``. Raises as ``admit``, changing nothing.
        """
        # An engine's common call first, with the fewest tests. numba's unboxing checks
        # neither dtype nor rank of the keys, so those are tested here.
        if (
            tokens is None
            and self._keyed_fast
            and type(keys) is np.ndarray
            and keys.dtype is UINT64
            and keys.ndim == 2
            and type(length) is int
            and 1 <= length <= self._max_seq_len
            and type(salt) is int
        ):
            cap = CAP_NONE if max_hit_blocks is None else max_hit_blocks
            if type(cap) is int and cap >= 0:
                r = self._kernels.k_admit_one_keys(length, salt, keys, cap, *self._arenas.one_args)
                if r[STATUS] == 0:
                    out = r[ADMIT_ONE_ID], r[ADMIT_ONE_CACHED]
                    if not self._quiet:
                        self._pipeline.after_commit(out)
                    return out
                # It failed and changed nothing: the batched call raises, without a second try.
                return self._one.admit_one(
                    self, tokens, length, salt, keys, max_hit_blocks, tried=True
                )
        return self._one.admit_one(self, tokens, length, salt, keys, max_hit_blocks)

    table_row = part_call("_one", OneRequest.table_row)

    def sequence(self):
        """A new empty sequence as a :class:`kvnumba.Sequence` handle."""
        from kvnumba.sequence import Sequence

        return Sequence(self, int(self.new_sequences(1)[0]))

    is_live = part_call("_facts", Facts.is_live)

    # ------------------------------------------------------------------------------ page pool
    def trim(self) -> int:
        """Give every cache-only page (cached blocks, no referenced one) back to the page pool,
        evicting its blocks; returns the pages unmapped (0 without a page pool).
        """
        return 0 if self._pages is None else self._pages.trim()

    def close(self) -> None:
        """Give every page back to the pool and retire the manager (a page pool's managers).

        Sequences and cached blocks are dropped without callbacks but ``on_unmap``; any later call
        that reaches a kernel raises ``ValueError``. Idempotent; without a pool, a no-op.
        """
        if self._pages is not None:
            self._pages.close()

    def mapped_pages(self) -> np.ndarray:
        """Physical page ids this manager holds, in virtual page order (empty without a pool)."""
        if self._pages is None:
            return np.empty(0, dtype=np.int64)
        return self._pages.mapped_pages()

    def check(self) -> None:
        """Recompute every invariant from scratch (O(pool)); ``InvariantViolation`` names the
        first inconsistency.
        """
        if self._pages is not None:
            code, a, b = violation_of(self._pages.check())
        else:
            code, a, b = violation_of(self._kernels.k_check(*self._arenas.args))
        if code:
            raise E.InvariantViolation(MESSAGES[code].format(a=a, b=b))

    def stats(self) -> Stats:
        """Block counts and counters of committed work (see :class:`kvnumba.Stats`)."""
        return self._arenas.stats(self._pipeline.failed_calls)

    def ref_count(self, block: int) -> int:
        """Reference count of ``block``."""
        block = operator.index(block)
        if not 0 <= block < self.num_blocks:
            raise E.InvalidPosition(f"block {block} is outside the pool of {self.num_blocks}")
        return int(self._arenas.s.ref[block])
