"""``BlockManager``: the facade over the kernels.

Each public call validates and converts its input and calls one entry kernel with the
manager's two arenas (three on a page pool). The calls that change state run through one
pipeline, ``BlockManager._run``: retry with larger record buffers, the pool's lock and reclaim,
a typed exception for a non-zero status (the kernel changed nothing), and, once the kernel has
committed, the callbacks (``on_evict``; ``on_map`` and ``on_unmap`` with a pool). One manager is
used by one thread at a time.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from kvnumba import errors as E
from kvnumba._dispatch import compiled
from kvnumba._engine_keys import EngineKeyCalls
from kvnumba._ids import new_tag, split_id
from kvnumba._inputs import check_state_bytes, index_array, positive_int
from kvnumba._kernels.check import MESSAGES
from kvnumba._kernels.entry import AVAILABLE, BAD, NEEDED, RESULT, STATUS
from kvnumba._kernels.undo import undo_log_rows
from kvnumba._one_request import OneRequestCalls
from kvnumba._state import (
    M_ALLOCATIONS,
    M_CACHED,
    M_COW_COPIES,
    M_EVICTIONS,
    M_LIVE_SEQS,
    M_MAPPED,
    M_PREFIX_HITS,
    M_PREFIX_QUERIES,
    M_SLOT_TOP,
    M_USED,
    S_EV_N,
    S_EV_PAYLOAD,
    S_FAILED,
    S_LOG_ON,
    SCRATCH_FIELDS,
    STATE_FIELDS,
    State,
    arena_bytes,
    new_scratch,
    new_state,
    scratch_dims,
    state_dims,
)
from kvnumba._virtual_pages import PagedCalls, deliver_all
from kvnumba.results import AdmitResult, AppendResult, Stats

_NO_TOKENS = np.empty(0, dtype=np.int64)
_INT64 = np.dtype(np.int64)
_INT64_MAX = np.iinfo(np.int64).max
# Building a NamedTuple from a tuple skips its keyword-argument __new__ (a third of the cost).
_new_append_result = AppendResult._make
_new_admit_result = AdmitResult._make
_KERNELS: dict = {}  # entry kernel name -> compiled entry point, shared by all managers


# A copy would share nothing sound: the state views alias one arena, and the one-request calls
# hold the arenas' addresses (``_one_args``), which a copy would carry over to memory it does
# not own.
_NOT_COPYABLE = (
    "a BlockManager cannot be copied; snapshot() copies its state arrays, and a new manager "
    "replays the calls that built it"
)


def _bind_kernels(manager, paged: bool) -> None:
    """Give ``manager`` an attribute ``_<name>`` per entry kernel.

    On a page pool, ``_<name>`` is the ``<name>_paged`` variant where one exists. A kernel
    already loaded in this process is bound directly; any other is bound to a loader that
    compiles it (or loads it from numba's cache) on first use and rebinds itself, so a program
    pays only for the kernels it calls. A manager on a page pool loads all of its kernels at
    construction, so that no call compiles while it holds the pool's lock.
    """
    from kvnumba._dispatch import LAZY, ONE_REQUEST, SIGNATURES

    for name in SIGNATURES:
        kernel = name + "_paged" if paged and name + "_paged" in SIGNATURES else name
        attribute = "_" + name
        if name in ONE_REQUEST:
            # Never run on a page pool (those calls take the batched path): bound to a loader.
            setattr(manager, attribute, _KERNELS.get(name) or _loader(manager, name, attribute))
            continue
        if name in LAZY:
            continue  # loaded by _kernel() on first use, before the call takes any lock
        if paged and kernel not in _KERNELS:
            # Compiled now, never under the page pool's lock (other processes would wait).
            _KERNELS[kernel] = compiled(kernel)
        setattr(manager, attribute, _KERNELS.get(kernel) or _loader(manager, kernel, attribute))


def _kernel(manager, name: str):
    """The compiled entry kernel ``name`` (its paged variant on a page pool), compiling or
    loading it now if needed: called before a call takes the pool's lock."""
    if manager._pool is not None:
        name += "_paged"
    kernel = _KERNELS.get(name)
    if kernel is None:
        kernel = _KERNELS[name] = compiled(name)
    return kernel


def _loader(manager, name: str, attribute: str):
    def load(*args):
        kernel = _KERNELS.get(name)
        if kernel is None:
            kernel = _KERNELS[name] = compiled(name)
        setattr(manager, attribute, kernel)
        return kernel(*args)

    return load


DEFAULT_MAX_SEQS = 1024
DEFAULT_MAX_SEQ_LEN = 32768


class BlockManager(PagedCalls, EngineKeyCalls, OneRequestCalls):
    """A paged KV-cache block manager over a fixed pool of equal-size blocks.

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool.
    block_size : int
        Token slots per block.
    max_seqs : int, default 1024
        Live sequences at most (the block tables are ``max_seqs x ceil(max_seq_len /
        block_size)`` int32).
    max_seq_len : int, optional
        Tokens per sequence at most; ``min(num_blocks * block_size, 32768)`` by default.
    prefix_caching : bool, default True
        Keep released full blocks with known content cached for reuse by ``admit``.
    on_evict : callable, optional
        ``on_evict(block_ids, block_hashes, tokens)`` with int64 ids, uint64 hashes and an
        int64 ``(n, block_size)`` payload copy, called once per API call that reclaimed cached
        blocks, after the call committed.
    page_pool : PagePool, optional
        Two-level allocation: virtual page ``b // blocks_per_page`` of block ``b`` is backed by
        a physical page of this pool while any of its blocks is referenced or cached
        (``docs/design.md``, "the page policy").
    blocks_per_page : int, optional
        Blocks per virtual page; required with ``page_pool`` and must divide ``num_blocks``.
    max_state_bytes : int, optional
        Refuse (``InvalidGeometry``) a geometry whose state arrays need more bytes. Without it
        the bound is what the process may use: physical memory and the room left under its
        address-space limit (``RLIMIT_AS``); the size is computed before anything is allocated.
    reserved_blocks : int, default 0
        Blocks ``0 .. reserved_blocks - 1`` are never handed out (e.g. vLLM's null block):
        never free or cached; ``stats()`` counts them as used (as vLLM counts its null block).
        ``0 <= reserved_blocks < num_blocks``; must be 0 with a page pool
        (``docs/design.md``, "Shrinking and engine conveniences").
    block_keys : bool, default False
        Register full blocks under the engine's own 256-bit keys (``admit(keys=...)``,
        :meth:`set_keys`) instead of kvnumba's chained token hashes; ``tokens`` may then be
        None (content unknown). Adds 32 bytes per block.
    block_events : bool, default False
        Record a stored event when a block is registered and a removed event when a
        registered block is evicted or unregistered; drained by :meth:`take_events`.

    Notes
    -----
    Not thread-safe: use one manager from one thread at a time. State lives in the flat arrays
    of :attr:`state`; see ``docs/design.md`` for the allocation policy.
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
        _hash_bits: int = 64,
    ):
        geometry = E.InvalidGeometry
        num_blocks = positive_int(num_blocks, "num_blocks", geometry)
        block_size = positive_int(block_size, "block_size", geometry)
        max_seqs = positive_int(max_seqs, "max_seqs", geometry)
        if max_seq_len is None:
            max_seq_len = min(num_blocks * block_size, DEFAULT_MAX_SEQ_LEN)
        max_seq_len = positive_int(max_seq_len, "max_seq_len", geometry)
        if max(num_blocks, max_seqs, max_seq_len) >= 2**31 - 1:
            raise geometry("num_blocks, max_seqs and max_seq_len must be below 2**31 - 1")
        blocks_per_page = self._check_pages(num_blocks, page_pool, blocks_per_page)
        if isinstance(reserved_blocks, (bool, np.bool_)):
            raise TypeError("reserved_blocks must be an integer, not a bool")
        reserved_blocks = operator.index(reserved_blocks)
        if not 0 <= reserved_blocks < num_blocks:
            raise geometry(f"reserved_blocks must be in [0, {num_blocks}), got {reserved_blocks}")
        if reserved_blocks and page_pool is not None:
            # A reserved block is neither free nor in use, so its virtual page could never be
            # unmapped: it would hold a physical page of the shared pool forever.
            raise geometry("reserved_blocks must be 0 with a page pool")
        if on_evict is not None and not callable(on_evict):
            raise TypeError("on_evict must be callable")
        block_keys, block_events = _flag(block_keys), _flag(block_events)
        if not 0 <= _hash_bits <= 64:
            raise geometry("_hash_bits must be in [0, 64]")
        blocks_per_seq = -(-max_seq_len // block_size)
        self._check_state_bytes(
            num_blocks,
            block_size,
            max_seqs,
            blocks_per_seq,
            blocks_per_page,
            on_evict,
            max_state_bytes,
            block_keys,
            block_events,
        )
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_seqs = max_seqs
        self._max_seq_len = max_seq_len
        self._prefix_caching = bool(prefix_caching)
        self._on_evict = on_evict
        self._id_tag = new_tag(self)
        self._arena, self._s = new_state(
            num_blocks,
            block_size,
            max_seqs,
            blocks_per_seq,
            max_seq_len,
            self._prefix_caching,
            _hash_bits,
            blocks_per_page,
            self._id_tag,
            reserved_blocks,
            block_keys,
            block_events,
        )
        self._init_keys(block_keys, block_events)
        self._event_rows = 2 * num_blocks + 8 if block_events else 0
        self._reserved = reserved_blocks
        self._k = blocks_per_page
        self._num_pages = num_blocks // blocks_per_page if blocks_per_page else 0
        self._new_scratch(rows=64, log_rows=64)
        views = []
        for array in self._s:
            view = array.view()
            view.flags.writeable = False
            views.append(view)
        self._views = State(*views)
        self._failed_calls = 0
        _bind_kernels(self, page_pool is not None)
        self._attach_pool(page_pool)
        # admit_one's keyed fast path (engine keys, no page pool), tested once per call.
        self._keyed_fast = self._block_keys and page_pool is None

    @staticmethod
    def _check_state_bytes(
        num_blocks,
        block_size,
        max_seqs,
        blocks_per_seq,
        k,
        on_evict,
        max_state_bytes,
        block_keys=False,
        block_events=False,
    ) -> None:
        """``InvalidGeometry`` if the state and first scratch arenas exceed the memory bound."""
        if max_state_bytes is not None:
            max_state_bytes = positive_int(max_state_bytes, "max_state_bytes", E.InvalidGeometry)
        num_pages = num_blocks // k if k else 0
        state = arena_bytes(
            STATE_FIELDS,
            state_dims(num_blocks, block_size, max_seqs, blocks_per_seq, k, block_keys),
        )
        event_rows = 2 * num_blocks + 8 if block_events else 0
        scratch = arena_bytes(
            SCRATCH_FIELDS,
            scratch_dims(
                block_size,
                max_seqs,
                blocks_per_seq,
                64,
                64,
                on_evict is not None,
                num_pages,
                event_rows,
            ),
        )
        check_state_bytes(
            state + scratch,
            f"a manager of {num_blocks} blocks of {block_size} tokens and {max_seqs} sequences "
            f"of {blocks_per_seq} blocks",
            max_state_bytes,
        )

    def _new_scratch(self, rows: int, log_rows: int, payload: bool = False) -> None:
        """(Re)allocate the scratch arena, keeping its control slots and duplicate marks."""
        old = getattr(self, "_x", None)
        payload = payload or self._on_evict is not None
        self._scratch, self._x = new_scratch(
            self._block_size,
            self._max_seqs,
            self._s.seq_table.shape[1],
            rows,
            log_rows,
            payload,
            self._num_pages,
            self._event_rows,
        )
        if old is None:
            self._x["scr"][S_EV_PAYLOAD] = 1 if self._on_evict is not None else 0
        else:
            self._x["scr"][:] = old["scr"]
            self._x["seq_mark"][:] = old["seq_mark"]
        self._scr = self._x["scr"]
        self._args = (self._arena, self._scratch)
        # The one-request calls take the arenas as addresses and sizes (``carve.arena_at``):
        # four integers cost the call boundary less than two arrays.
        self._one_args = (
            self._arena.ctypes.data,
            self._arena.nbytes,
            self._scratch.ctypes.data,
            self._scratch.nbytes,
        )
        pool = getattr(self, "_pool", None)
        if pool is not None:
            self._pargs = (self._arena, self._scratch, pool.arena)

    def _grow_records(self, evictions: int, blocks: int = 0, prompts: int = 0) -> None:
        """Grow the eviction records (and the undo log) so that a call of this size fits.

        ``blocks`` and ``prompts`` are set for an atomic admit that may need its undo log, which
        also keeps the payload of every eviction.
        """
        rows = max(2 * self._x["ev_ids"].shape[0], int(evictions))
        log_rows = max(
            self._x["ulog"].shape[0],
            undo_log_rows(int(blocks), int(prompts), self._k, self._num_pages),
        )
        self._new_scratch(rows, log_rows, payload=bool(blocks))

    def __copy__(self):
        raise TypeError(_NOT_COPYABLE)

    def __deepcopy__(self, memo):
        raise TypeError(_NOT_COPYABLE)

    def __repr__(self) -> str:
        meta = self._s.meta
        used, cached = int(meta[M_USED]) + self._reserved, int(meta[M_CACHED])
        pages = f", mapped_pages={int(meta[M_MAPPED])}" if self._k else ""
        return (
            f"BlockManager(num_blocks={self._num_blocks}, block_size={self._block_size}, "
            f"used={used}, cached={cached}, "
            f"free={self._num_blocks - used - cached}, "
            f"live_seqs={int(meta[M_LIVE_SEQS])}{pages})"
        )

    # ----------------------------------------------------------------------------- properties
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._block_size

    @property
    def reserved_blocks(self) -> int:
        """Blocks ``0 .. reserved_blocks - 1``, never handed out."""
        return self._reserved

    @property
    def id_tag(self) -> int:
        """The tag in the top bits of every id this manager hands out (unique among the live
        managers of the process; ``docs/design.md``, sequence ids)."""
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
        """Whether released full blocks stay cached for prefix reuse."""
        return self._prefix_caching

    @property
    def state(self) -> State:
        """Read-only views of the state arrays (see :class:`kvnumba._state.State`)."""
        return self._views

    def snapshot(self) -> State:
        """Copies of the state arrays; compare two snapshots field by field."""
        return State(*(array.copy() for array in self._s))

    # ---------------------------------------------------------------------------- batched API
    def new_sequences(self, count: int) -> np.ndarray:
        """Create ``count`` empty sequences.

        Parameters
        ----------
        count : int
            Sequences to create (>= 0).

        Returns
        -------
        numpy.ndarray of int64, shape (count,)
            The new ids.

        Raises
        ------
        TooManySequences
            If fewer than ``count`` sequence slots are free.
        """
        if isinstance(count, bool):
            raise TypeError("count must be an integer, not a bool")
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if count > self._max_seqs:  # before anything is allocated for the ids
            free = int(self._s.meta[M_SLOT_TOP])
            raise E.TooManySequences(count, free, self._max_seqs)
        status, ids = self._k_new_sequences(count, *self._args)
        if status:
            self._raise(status, -1, None, requested=count)
        return ids

    def append(self, ids, counts, tokens=None, *, atomic: bool = True) -> AppendResult:
        """Grow each sequence ``ids[i]`` by ``counts[i]`` tokens.

        Parameters
        ----------
        ids : 1-D integer array-like
            Live sequence ids, no duplicates.
        counts : 1-D integer array-like
            Tokens to append per sequence (>= 0).
        tokens : 1-D integer array-like, optional
            The new token ids (>= 0), concatenated in ``ids`` order; without them the slots
            read -1 and the blocks are never cached.
        atomic : bool, default True
            All or nothing (raise ``PoolExhausted``); otherwise each sequence in input order,
            all-or-nothing, and ``ok`` tells which grew.

        Returns
        -------
        AppendResult
            ``slot_mapping`` per token, the ``cow_src -> cow_dst`` block copies to perform
            on the device, in order, and ``ok`` per sequence.

        Raises
        ------
        PoolExhausted
            Atomic mode, when the blocks needed exceed free plus cached blocks.
        InvalidSequence, SequenceReleased, SequenceTooLong
            For a bad id or a sequence that would exceed ``max_seq_len``.
        ValueError, TypeError
            For malformed input. Nothing is changed by any failed call.
        CallbackError
            If a callback raised after the call committed; ``.result`` is the result.
        """
        # The hot path: int64 vectors are passed through without a call (see index_array).
        if not (type(ids) is np.ndarray and ids.dtype == _INT64 and ids.flags.c_contiguous):
            ids = index_array(ids, "ids")
        if not (
            type(counts) is np.ndarray and counts.dtype == _INT64 and counts.flags.c_contiguous
        ):
            counts = index_array(counts, "counts")
        if ids.ndim != 1 or counts.ndim != 1:
            ids, counts = index_array(ids, "ids"), index_array(counts, "counts")
        if tokens is None:
            tokens_in, has_tokens = _NO_TOKENS, False
        else:
            tokens_in, has_tokens = index_array(tokens, "tokens"), True
        if atomic is not True:  # the common case skips a call
            atomic = _flag(atomic)
        args = (ids, counts, tokens_in, has_tokens, atomic, self._max_seq_len)
        first = None
        if self._pool is None:
            # The decode step without a pool commits here, without _run's calls (measured:
            # they cost a one-sequence append about 0.5 us, a fifth); anything else (a
            # failure, more record buffers) continues in _run from this first result.
            first = self._k_append(*args, *self._args)
            if first[STATUS] == 0:
                if atomic is not True and self._scr[S_FAILED]:
                    self._failed_calls += 1
                out = _new_append_result(first[RESULT])
                if self._event_chunks is not None:
                    self._collect_events()
                if self._on_evict is not None:
                    deliver_all((self._deliver_evictions,), out)
                return out
        return self._run(
            self._k_append,
            args,
            atomic=atomic,
            grow=lambda result: self._grow_records(result[NEEDED]),
            build=_new_append_result,
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
            All prompts' token ids (>= 0), concatenated. None only with ``block_keys=True``:
            the blocks' content is unknown then (the payload reads -1) and only keys match.
        lengths : 1-D integer array-like
            Tokens per prompt (each >= 1).
        salts : 1-D integer array-like, optional
            Per-prompt cache salt (default 0); blocks are never shared across salts.
        keys : integer array-like of shape (K, 4), optional
            ``block_keys=True`` only: the engine's keys of the prompts' leading full blocks,
            ``key_counts[i]`` rows per prompt, in prompt order. Hits are the longest run of
            leading keys whose blocks are registered with an equal key (all 256 bits), salt
            and, when both are known, tokens; the prompt's other keyed blocks are registered
            after allocation (unless a matching block is).
        key_counts : 1-D integer array-like, optional
            Keys per prompt, each ``<= lengths[i] // block_size``; default
            ``lengths // block_size``.
        max_hit_blocks : int or 1-D integer array-like, optional
            Cap on the blocks reused per prompt (e.g. what an engine's lookup decided).
        atomic : bool, default True
            All prompts or none; otherwise prompts are served in order, each all-or-nothing.

        Returns
        -------
        AdmitResult
            ``ids`` (-1 for a prompt that did not fit), ``num_cached_tokens`` per prompt,
            ``slot_mapping`` of the uncached tokens in prompt order, ``ok``.

        Raises
        ------
        PoolExhausted
            Atomic mode, when the prompts do not fit.
        SequenceTooLong, TooManySequences, ValueError, TypeError
            For input that can never be served. Nothing is changed by any failed call.
        CallbackError
            If a callback raised after the call committed; ``.result`` is the result.
        """
        atomic = _flag(atomic)
        if keys is not None or max_hit_blocks is not None or tokens is None or self._block_keys:
            return self._admit_engine(
                tokens, lengths, salts, keys, key_counts, max_hit_blocks, atomic
            )
        if key_counts is not None:
            raise ValueError("key_counts without keys")
        tokens_in = index_array(tokens, "tokens")
        lengths = index_array(lengths, "lengths")
        if salts is None:
            salts = np.zeros(lengths.shape[0], dtype=np.int64)
        else:
            salts = index_array(salts, "salts")
            if salts.shape != lengths.shape:
                raise ValueError(
                    f"salts has {salts.shape[0]} entries for {lengths.shape[0]} prompts"
                )
        return self._run_admit(
            self._k_admit, (tokens_in, lengths, salts, atomic), atomic, lengths, tokens_in
        )

    def _run_admit(self, kernel, args, atomic, lengths, tokens_in, **context):
        """Run an admit kernel through :meth:`_run` (record buffers sized for its prompts)."""
        prompts = lengths.shape[0]
        return self._run(
            kernel,
            args,
            atomic=atomic,
            grow=lambda r: self._grow_records(min(r[NEEDED], self._num_blocks), r[NEEDED], prompts),
            build=_new_admit_result,
            lengths=lengths,
            tokens=tokens_in,
            **context,
        )

    def _lazy_kernel(self, name: str):
        """Entry kernel ``name`` (its paged variant on a page pool, where one exists),
        compiled or loaded on first use, before any lock is taken."""
        from kvnumba._dispatch import SIGNATURES

        if self._pool is not None and name + "_paged" in SIGNATURES:
            name += "_paged"
        kernel = _KERNELS.get(name)
        if kernel is None:
            kernel = _KERNELS[name] = compiled(name)
        return kernel

    def fork(self, ids, n: int = 1) -> np.ndarray:
        """Give every sequence ``n`` children that share all of its blocks.

        Parameters
        ----------
        ids : 1-D integer array-like
            Live parent ids.
        n : int, default 1
            Children per parent (>= 1).

        Returns
        -------
        numpy.ndarray of int64, shape (len(ids), n)
            The children's ids.
        """
        ids = index_array(ids, "ids")
        if isinstance(n, bool):
            raise TypeError("n must be an integer")
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if ids.shape[0] * n > self._max_seqs:  # before anything is allocated for the children
            self.seq_lens(ids)  # an invalid id still takes precedence
            free = int(self._s.meta[M_SLOT_TOP])
            raise E.TooManySequences(ids.shape[0] * n, free, self._max_seqs)
        if n > _INT64_MAX:  # no parents, so no TooManySequences; the kernel takes an int64
            raise ValueError(f"n must be below 2**63, got {n}")
        status, bad, children = self._k_fork(ids, n, *self._args)
        if status:
            self._raise(status, bad, ids, requested=ids.shape[0] * n)
        return children

    def release(self, ids) -> None:
        """Drop every reference of each sequence, tail block first.

        Full blocks with known content stay cached (least recently used reclaimed first);
        every other block returns to the free list. The ids become invalid forever.
        """
        ids = index_array(ids, "ids")
        self._run(self._k_release, (ids,), ids=ids)

    def truncate(self, ids, new_lens) -> None:
        """Shorten sequences (e.g. rejected speculative tokens): each ``ids[i]`` keeps its
        first ``new_lens[i]`` tokens.

        Whole blocks past the new end drop one reference each, tail block first (as
        :meth:`release`: a registered block reaching refcount 0 is cached, any other freed). A
        block the new end cuts into stays as the partial tail: held by this sequence alone,
        its slots past the end are scrubbed and it is unregistered from the prefix cache;
        shared, it stays intact for its other holders. This sequence's next append copies it
        while it is still shared; once the others let go, that append writes into it in place
        after the same scrub and unregistering (``docs/design.md``, "Shrinking and engine
        conveniences"). Nothing grows, so the call never fails for lack of blocks.

        Parameters
        ----------
        ids : 1-D integer array-like
            Live sequence ids, no duplicates.
        new_lens : 1-D integer array-like
            New length per sequence, ``0 <= new_lens[i] <= len(ids[i])``.

        Raises
        ------
        InvalidSequence, SequenceReleased
            For an id that names no live sequence.
        ValueError, TypeError
            For malformed input, duplicate ids or a length out of range. Nothing is changed
            by any failed call.
        CallbackError
            If ``on_unmap`` raised after the call committed (a page pool's emptied pages).
        """
        ids = index_array(ids, "ids")
        new_lens = index_array(new_lens, "new_lens")
        if new_lens.shape != ids.shape:
            raise ValueError(f"new_lens has {new_lens.shape[0]} entries for {ids.shape[0]} ids")
        self._run(_kernel(self, "k_truncate"), (ids, new_lens), ids=ids, new_lens=new_lens)

    def evict(self, block_ids) -> int:
        """Evict the given cached blocks, exactly as the LRU eviction does.

        Each cached block (refcount 0, registered, on the LRU list) loses its prefix-cache
        entry, is reported to ``on_evict``, scrubbed and freed (with a page pool, back to its
        page, which is unmapped once it holds nothing). Free (and reserved) blocks are
        skipped.

        Parameters
        ----------
        block_ids : 1-D integer array-like
            Block ids, evicted in this order (a repeated id is free by its second time).

        Returns
        -------
        int
            Blocks evicted.

        Raises
        ------
        ValueError, TypeError
            For an id outside the pool, a block a sequence references, or malformed input;
            nothing is changed then.
        CallbackError
            If a callback raised after the call committed; ``.result`` is the count.
        """
        blocks = index_array(block_ids, "block_ids")
        return self._run(
            _kernel(self, "k_evict"),
            (blocks,),
            grow=lambda result: self._grow_records(result[NEEDED]),
            build=_first,
            blocks=blocks,
        )

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix: nothing computed before the reset is hit afterwards.

        Evicts every cached block (least recently used first, as :meth:`evict`) and
        unregisters the blocks that live sequences hold: they keep their tokens but lose
        their hashes and count as of unknown content, so neither they nor the blocks these
        sequences fill later are ever reused by :meth:`admit`.

        Returns
        -------
        int
            Blocks evicted.

        Raises
        ------
        CallbackError
            If a callback raised after the call committed; ``.result`` is the count.
        """
        return self._run(
            _kernel(self, "k_reset_prefix_cache"),
            (),
            grow=lambda result: self._grow_records(result[NEEDED]),
            build=_first,
        )

    def block_tables(self, ids) -> np.ndarray:
        """Block tables of ``ids`` as int32 ``(len(ids), width)``, padded with -1."""
        ids = index_array(ids, "ids")
        status, bad, tables = self._k_block_tables(ids, *self._args)
        if status:
            self._raise(status, bad, ids)
        return tables

    def seq_lens(self, ids) -> np.ndarray:
        """Tokens held by each sequence of ``ids`` (int64)."""
        ids = index_array(ids, "ids")
        status, bad, lengths = self._k_seq_lens(ids, *self._args)
        if status:
            self._raise(status, bad, ids)
        return lengths

    def can_append(self, ids, counts) -> bool:
        """Whether ``append(ids, counts, atomic=True)`` would succeed now (input validated)."""
        ids = index_array(ids, "ids")
        counts = index_array(counts, "counts")
        if self._pool is not None:
            return self._paged_can_append(ids, counts)
        status, bad, need, available = self._k_can_append(ids, counts, *self._args)
        if status:
            self._raise(status, bad, ids, counts=counts)
        return bool(need <= available)

    # ---------------------------------------------------------------------- single sequences
    def sequence(self):
        """A new empty sequence as a :class:`kvnumba.Sequence` handle."""
        from kvnumba.sequence import Sequence

        return Sequence(self, int(self.new_sequences(1)[0]))

    def is_live(self, seq_id: int) -> bool:
        """Whether ``seq_id`` names a live sequence of this manager."""
        seq_id = operator.index(seq_id)
        if seq_id < 0:
            return False
        tag, generation, slot = split_id(seq_id, self._max_seqs)
        if tag != self._id_tag or slot >= self._max_seqs:
            return False
        return bool(self._s.seq_live[slot]) and generation == self._s.seq_gen[slot]

    # -------------------------------------------------------------------------- introspection
    def check(self) -> None:
        """Recompute every invariant from scratch (O(pool)); raise on the first violation.

        Raises
        ------
        InvariantViolation
            Naming the first inconsistency found.
        """
        if self._pool is not None:
            with self._pool.lock():
                code, a, b = self._k_check_paged(*self._pargs)
        else:
            code, a, b = self._k_check(*self._args)
        if code:
            raise E.InvariantViolation(MESSAGES[code].format(a=a, b=b))

    def stats(self) -> Stats:
        """Block counts and counters of committed work (see :class:`kvnumba.Stats`)."""
        meta = self._s.meta
        # Reserved blocks count as used, as vLLM counts its null block: never free.
        used, cached = int(meta[M_USED]) + self._reserved, int(meta[M_CACHED])
        return Stats(
            used=used,
            cached=cached,
            free=self._num_blocks - used - cached,
            allocations=int(meta[M_ALLOCATIONS]),
            evictions=int(meta[M_EVICTIONS]),
            cow_copies=int(meta[M_COW_COPIES]),
            prefix_queries=int(meta[M_PREFIX_QUERIES]),
            prefix_hits=int(meta[M_PREFIX_HITS]),
            mapped_pages=int(meta[M_MAPPED]),
            failed_calls=self._failed_calls,
        )

    def ref_count(self, block: int) -> int:
        """Reference count of ``block``."""
        block = operator.index(block)
        if not 0 <= block < self._num_blocks:
            raise E.InvalidPosition(f"block {block} is outside the pool of {self._num_blocks}")
        return int(self._s.ref[block])

    # ---------------------------------------------------------------------------- internals
    def _run(
        self, kernel, args, *, atomic=True, grow=None, build=None, first=None, ids=None, **context
    ):
        """Run one state-changing entry kernel: the one path of ``append``, ``admit``,
        ``release``, ``truncate``, ``evict`` and ``reset_prefix_cache``.

        Grows the record buffers and retries while the kernel asks for them (``grow(result)``;
        growing replaces the scratch arena, so the arenas are read anew for each try); with a
        page pool, holds the pool's lock, gives back orphaned pages first and reclaims pages on
        exhaustion of an ``atomic`` call (the pool's coordinator). A failure raises its typed
        exception (``ids`` and ``context`` name the inputs for the message) and changed
        nothing; a committed call counts a partial failure, builds its result from the
        kernel's result fields with ``build`` and delivers every callback (``CallbackError``
        carries the result). ``first`` is the result of a first try the caller made already
        (without a pool).
        """

        def until_buffers_fit(result=None):
            while True:
                if result is None:
                    result = kernel(*args, *(self._args if self._pool is None else self._pargs))
                status = result[STATUS]
                if status and self._scr[S_LOG_ON]:
                    # A logged call that failed leaves its undo to the facade (k_rollback).
                    self._k_rollback(*(self._args if self._pool is None else self._pargs))
                if status != E.ST_NEED_BUFFERS or grow is None:
                    return result
                grow(result)
                result = None

        if self._pool is None:
            result, givers, pending = until_buffers_fit(first), (), None
        else:
            pending = self._orphans_first()
            result, givers = self._pool._coordinator.run_with_reclaim(
                self, until_buffers_fit, atomic
            )
        if result[STATUS]:
            self._raise(
                result[STATUS],
                result[BAD],
                ids,
                needed=result[NEEDED],
                available=result[AVAILABLE],
                **context,
            )
        if not atomic and self._scr[S_FAILED]:  # set by a partial append or admit only
            self._failed_calls += 1
        out = None if build is None else build(result[RESULT])
        if self._event_chunks is not None:
            self._collect_events()
        if self._pool is not None:
            self._deliver_paged(givers, out, pending)
        elif self._on_evict is not None:
            deliver_all((self._deliver_evictions,), out)
        return out

    def _deliver_evictions(self) -> None:
        """Call ``on_evict`` with copies of this call's eviction records, if there are any."""
        scr = self._scr
        if self._on_evict is not None:
            n = int(scr[S_EV_N])
            if n:
                x = self._x
                self._on_evict(
                    x["ev_ids"][:n].copy(), x["ev_hash"][:n].copy(), x["ev_tok"][:n].copy()
                )

    def _raise(
        self,
        status,
        bad,
        ids,
        *,
        counts=None,
        lengths=None,
        tokens=None,
        requested=0,
        needed=0,
        available=0,
        new_lens=None,
        blocks=None,
        key_counts=None,
        caps=None,
    ):
        """Raise the typed exception of a kernel status (the kernel changed nothing)."""
        if status == E.ST_BAD_KEY_COUNT:
            if bad < 0:
                raise ValueError(
                    "key_counts needs one entry per prompt and must sum to the rows of keys"
                )
            raise ValueError(
                f"key_counts[{bad}] = {int(key_counts[bad])} is outside [0, lengths[{bad}] // "
                f"block_size = {int(lengths[bad]) // self._block_size}]"
            )
        if status == E.ST_BAD_CAP:
            if bad < 0:
                raise ValueError("max_hit_blocks needs one entry per prompt")
            raise ValueError(f"max_hit_blocks[{bad}] = {int(caps[bad])} is negative")
        if status == E.ST_POOL_EXHAUSTED:
            self._failed_calls += 1
            raise E.PoolExhausted(needed, available)
        if status == E.ST_RELEASED_SEQ:
            raise E.SequenceReleased(ids[bad])
        if status == E.ST_UNKNOWN_SEQ:
            raise E.InvalidSequence(ids[bad])
        if status == E.ST_DUPLICATE_ID:
            raise ValueError(f"sequence id {int(ids[bad])} appears more than once in one call")
        if status == E.ST_NEGATIVE_COUNT:
            raise ValueError(f"counts[{bad}] = {int(counts[bad])} is negative")
        if status == E.ST_BAD_LENGTH:
            raise ValueError(
                f"lengths[{bad}] = {int(lengths[bad])}: every prompt needs at least one token"
            )
        if status == E.ST_BAD_NEW_LEN:
            if new_lens[bad] < 0:
                raise ValueError(f"new_lens[{bad}] = {int(new_lens[bad])} is negative")
            length = int(self.seq_lens(ids[bad : bad + 1])[0])
            raise ValueError(
                f"new_lens[{bad}] = {int(new_lens[bad])} exceeds the {length} tokens of "
                f"sequence {int(ids[bad])}; truncate never grows a sequence"
            )
        if status == E.ST_BAD_BLOCK:
            raise ValueError(
                f"block_ids[{bad}] = {int(blocks[bad])} is outside the pool of "
                f"{self._num_blocks} blocks"
            )
        if status == E.ST_BLOCK_IN_USE:
            b = int(blocks[bad])
            raise ValueError(
                f"block {b} (block_ids[{bad}]) is referenced by a sequence (refcount "
                f"{int(self._s.ref[b])}); only cached blocks can be evicted"
            )
        if status == E.ST_BAD_TOKEN:
            raise ValueError(f"tokens[{bad}] is negative; token ids must be >= 0")
        if status == E.ST_TOKEN_MISMATCH:
            if counts is not None and counts.shape != ids.shape:
                raise ValueError(f"counts has {counts.shape[0]} entries for {ids.shape[0]} ids")
            if lengths is not None:
                raise ValueError(
                    f"tokens has {tokens.shape[0]} entries but lengths sum to "
                    f"{sum(int(x) for x in lengths)}"
                )
            raise ValueError(
                f"tokens does not hold one id per appended token ({int(counts.sum())})"
            )
        if status == E.ST_TOO_LONG:
            if lengths is not None:
                raise E.SequenceTooLong(
                    -1,
                    lengths[bad],
                    self._max_seq_len,
                    f"prompt {bad} has {int(lengths[bad])} tokens, more than "
                    f"max_seq_len={self._max_seq_len}",
                )
            length = int(self.seq_lens(ids[bad : bad + 1])[0]) + int(counts[bad])  # no wrap
            raise E.SequenceTooLong(ids[bad], length, self._max_seq_len)
        if status == E.ST_TOO_MANY_SEQS:
            free = self._max_seqs - int(np.count_nonzero(self._s.seq_live))
            raise E.TooManySequences(
                requested or (0 if lengths is None else lengths.shape[0]), free, self._max_seqs
            )
        raise RuntimeError(f"unexpected kernel status {status}")  # pragma: no cover


def _first(fields) -> int:
    """The count of ``evict`` / ``reset_prefix_cache`` from the kernel's result fields."""
    return int(fields[0])


def _flag(value) -> bool:
    """A keyword switch: ``True``/``False`` (numpy booleans too), nothing else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"atomic must be True or False, got {value!r}")
