"""``Arenas``: the part of a manager that owns its memory.

A manager's whole allocator state is one uint8 arena of named fields (``_layout.STATE_FIELDS``);
what a call records for the facade (evictions, the undo log, page records, block events, the
call room) is a second one, the scratch arena (``_layout.SCRATCH_FIELDS``). The kernels take the
arenas, never the fields: they carve their own named views. This part allocates both, grows the
scratch arena when a call needs more records, and hands the facade the argument tuples the
kernels take and copies of what a committed call recorded.
"""

from __future__ import annotations

import operator

import numpy as np

from kvnumba import errors as E
from kvnumba._kernels.undo import give_up_log_rows, policy_log_rows, undo_log_rows
from kvnumba._layout import (
    M_ALLOCATIONS,
    M_CACHED,
    M_COW_COPIES,
    M_EVICTIONS,
    M_MAPPED,
    M_PREFIX_HITS,
    M_PREFIX_QUERIES,
    M_USED,
    S_EV_N,
    S_EV_PAYLOAD,
    S_EVT_N,
    S_MAP_N,
    S_UNMAP_N,
    SCRATCH_FIELDS,
    STATE_FIELDS,
    Geometry,
    State,
    arena_bytes,
    new_scratch,
    new_state,
    scratch_dims,
    state_dims,
)
from kvnumba.inputs import check_state_bytes, positive_int, switch
from kvnumba.pages.member import check_pages
from kvnumba.results import Stats
from kvnumba.windows import group_geometry, window_geometry

#: Eviction records and undo-log rows of a new manager's scratch arena.
FIRST_ROWS = 64
DEFAULT_MAX_SEQ_LEN = 32768


class Arenas:
    """The state and scratch arenas of one manager.

    Parameters
    ----------
    geometry : Geometry
        The manager's validated geometry.
    id_tag : int
        The manager's id tag (written into ``meta``).
    evict_payload : bool
        Whether evicted payloads are copied for the caller (``on_evict`` is set).

    Attributes
    ----------
    geometry : Geometry
    arena : numpy.ndarray of uint8
        The state arena.
    s : State
        Writable views of the state fields (the facade reads counters; only kernels write).
    views : State
        Read-only views of the same fields (``BlockManager.state``).
    scratch : numpy.ndarray of uint8
        The scratch arena; replaced when it grows.
    x : dict
        Views of the scratch fields by name.
    scr : numpy.ndarray of int64
        The scratch control slots (``S_*``).
    args : tuple
        ``(arena, scratch)``: what a kernel without a page variant takes.
    call_args : tuple
        What a kernel with a page variant takes: ``args``, plus the pool's arena on a page pool.
    one_args : tuple of int
        Address and size of each arena, for the one-request kernels (``carve.arena_at``).
    """

    def __init__(self, geometry: Geometry, id_tag: int, evict_payload: bool):
        self.geometry = geometry
        self.evict_payload = evict_payload
        self.arena, self.s = new_state(geometry, id_tag)
        views = []
        for array in self.s:
            view = array.view()
            view.flags.writeable = False
            views.append(view)
        self.views = State(*views)
        self.pool_arena: np.ndarray | None = None
        self.scratch: np.ndarray
        self.x: dict = {}
        self.scr: np.ndarray
        self.args: tuple = ()
        self.call_args: tuple = ()
        self.one_args: tuple = ()
        self.renew_scratch(FIRST_ROWS, FIRST_ROWS)

    def attach_pool(self, pool_arena: np.ndarray) -> None:
        """Pass the page pool's arena to the kernels with a page variant from now on."""
        self.pool_arena = pool_arena
        self._bind()

    def renew_scratch(self, rows: int, log_rows: int, payload: bool = False) -> None:
        """(Re)allocate the scratch arena, keeping its control slots and duplicate marks.

        Parameters
        ----------
        rows : int
            Eviction records a call can hold.
        log_rows : int
            Undo-log rows a call can hold.
        payload : bool
            Keep room for evicted payloads even without ``on_evict`` (a logged call).
        """
        old = self.x
        self.scratch, self.x = new_scratch(
            self.geometry, rows, log_rows, payload or self.evict_payload
        )
        if old:
            self.x["scr"][:] = old["scr"]
            self.x["seq_mark"][:] = old["seq_mark"]
        else:
            self.x["scr"][S_EV_PAYLOAD] = 1 if self.evict_payload else 0
        self.scr = self.x["scr"]
        self._bind()

    def _bind(self) -> None:
        self.args = (self.arena, self.scratch)
        self.call_args = self.args if self.pool_arena is None else (*self.args, self.pool_arena)
        # Four integers cost the call boundary less than two arrays.
        self.one_args = (
            self.arena.ctypes.data,
            self.arena.nbytes,
            self.scratch.ctypes.data,
            self.scratch.nbytes,
        )

    def grow_records(self, evictions: int, blocks: int = 0, prompts: int = 0) -> None:
        """Grow the eviction records (and the undo log) so that a call of this size fits.

        Parameters
        ----------
        evictions : int
            Evictions the call reported it needs room for.
        blocks, prompts : int
            Set for an atomic admit that may need its undo log, which also keeps the payload
            of every eviction.
        """
        g = self.geometry
        rows = max(2 * self.x["ev_ids"].shape[0], int(evictions))
        cached = int(self.s.meta[M_CACHED])
        log_rows = max(
            self.x["ulog"].shape[0],
            undo_log_rows(int(blocks), int(prompts), g.blocks_per_page, g.num_pages)
            + policy_log_rows(g.eviction, g.num_blocks, int(blocks), cached),
        )
        self.renew_scratch(rows, log_rows, payload=bool(blocks))

    def ensure_give_up_records(self, evictions: int, logged_pages: int = 0) -> None:
        """Grow the scratch so that a give-up evicting ``evictions`` blocks fits (logged for
        ``logged_pages`` pages)."""
        x = self.x
        rows = x["ev_ids"].shape[0]
        g = self.geometry
        log_needed = give_up_log_rows(logged_pages, g.blocks_per_page)
        if logged_pages:
            cached = int(self.s.meta[M_CACHED])
            log_needed += policy_log_rows(g.eviction, g.num_blocks, cached, cached)
        payload = logged_pages > 0 or self.evict_payload
        if (
            evictions > rows
            or (payload and evictions > x["ev_tok"].shape[0])
            or log_needed > x["ulog"].shape[0]
        ):
            self.renew_scratch(
                max(rows, evictions), max(x["ulog"].shape[0], log_needed), payload=payload
            )

    def snapshot(self) -> State:
        """Copies of the state arrays (:class:`kvnumba.state.State`); compare two snapshots
        field by field."""
        return State(*(array.copy() for array in self.s))

    def stats(self, failed_calls: int) -> Stats:
        """Block counts and counters of committed work (``BlockManager.stats``)."""
        meta = self.s.meta
        # Reserved blocks count as used, as vLLM counts its null block: never free.
        used = int(meta[M_USED]) + self.geometry.reserved_blocks
        cached = int(meta[M_CACHED])
        return Stats(
            used=used,
            cached=cached,
            free=self.geometry.num_blocks - used - cached,
            allocations=int(meta[M_ALLOCATIONS]),
            evictions=int(meta[M_EVICTIONS]),
            cow_copies=int(meta[M_COW_COPIES]),
            prefix_queries=int(meta[M_PREFIX_QUERIES]),
            prefix_hits=int(meta[M_PREFIX_HITS]),
            mapped_pages=int(meta[M_MAPPED]),
            failed_calls=failed_calls,
        )

    def evictions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Copies of the last call's eviction records ``(ids, hashes, payloads)``, or None."""
        n = int(self.scr[S_EV_N])
        if not n:
            return None
        x = self.x
        return x["ev_ids"][:n].copy(), x["ev_hash"][:n].copy(), x["ev_tok"][:n].copy()

    def take_event_rows(self) -> np.ndarray | None:
        """Copy and clear the block events the last call recorded (None if it recorded none)."""
        n = int(self.scr[S_EVT_N])
        if not n:
            return None
        rows = self.x["evt"][:n].copy()
        self.scr[S_EVT_N] = 0
        return rows

    def mapped_records(self) -> np.ndarray:
        """``(physical, virtual)`` rows of the pages the last call mapped (a view)."""
        return self.x["map_rec"][: int(self.scr[S_MAP_N])]

    def unmapped_records(self) -> np.ndarray:
        """``(physical, virtual)`` rows of the pages the last call unmapped (a view)."""
        return self.x["unmap_rec"][: int(self.scr[S_UNMAP_N])]


def validated_geometry(
    num_blocks,
    block_size,
    max_seqs,
    max_seq_len,
    reserved_blocks,
    hash_bits,
    page_pool,
    blocks_per_page,
    *,
    prefix_caching,
    block_keys,
    block_events,
    eviction=0,
    sliding_window=None,
    attention_chunk_size=None,
    kv_cache_groups=None,
    window_release="append",
    cache_duplicates=False,
    priority_leaves=False,
    priority_forest=False,
    priority_features=0,
) -> Geometry:
    """The validated :class:`Geometry` of a new manager.

    Raises
    ------
    InvalidGeometry
        For sizes out of range, a page geometry that does not fit, reserved blocks that
        cannot be, or an attention window that cannot be (``kvnumba.windows``).
    TypeError
        For a switch that is not a bool, or a ``page_pool`` that is no ``PagePool``.
    """
    bad = E.InvalidGeometry
    num_blocks = positive_int(num_blocks, "num_blocks", bad)
    block_size = positive_int(block_size, "block_size", bad)
    max_seqs = positive_int(max_seqs, "max_seqs", bad)
    if max_seq_len is None:
        max_seq_len = min(num_blocks * block_size, DEFAULT_MAX_SEQ_LEN)
    max_seq_len = positive_int(max_seq_len, "max_seq_len", bad)
    if max(num_blocks, max_seqs, max_seq_len) >= 2**31 - 1:
        raise bad("num_blocks, max_seqs and max_seq_len must be below 2**31 - 1")
    blocks_per_page = check_pages(num_blocks, page_pool, blocks_per_page)
    if isinstance(reserved_blocks, (bool, np.bool_)):
        raise TypeError("reserved_blocks must be an integer, not a bool")
    reserved_blocks = operator.index(reserved_blocks)
    if not 0 <= reserved_blocks < num_blocks:
        raise bad(f"reserved_blocks must be in [0, {num_blocks}), got {reserved_blocks}")
    if reserved_blocks and page_pool is not None:
        # A reserved block is neither free nor in use, so its virtual page could never be
        # unmapped: it would hold a physical page of the shared pool forever.
        raise bad("reserved_blocks must be 0 with a page pool")
    block_keys, block_events = (
        switch(block_keys, "block_keys"),
        switch(block_events, "block_events"),
    )
    cache_duplicates = switch(cache_duplicates, "cache_duplicates")
    if not 0 <= hash_bits <= 64:
        raise bad("_hash_bits must be in [0, 64]")
    groups: tuple[tuple[int, int], ...] = (
        window_geometry(sliding_window, attention_chunk_size, block_size),
    )
    if kv_cache_groups is not None:
        if groups != ((0, 0),):
            raise bad("give the attention kind in kv_cache_groups, not also on the manager")
        groups = group_geometry(kv_cache_groups, block_size)
    if window_release not in ("append", "explicit"):
        raise ValueError(f"window_release must be 'append' or 'explicit', got {window_release!r}")
    return Geometry(
        num_blocks=num_blocks,
        block_size=block_size,
        max_seqs=max_seqs,
        max_seq_len=max_seq_len,
        blocks_per_seq=-(-max_seq_len // block_size),
        blocks_per_page=blocks_per_page,
        reserved_blocks=reserved_blocks,
        prefix_caching=bool(prefix_caching),
        block_keys=block_keys,
        block_events=block_events,
        hash_bits=hash_bits,
        eviction=eviction,
        groups=groups,
        explicit_release=window_release == "explicit",
        cache_duplicates=cache_duplicates,
        priority_leaves=bool(priority_leaves),
        priority_forest=bool(priority_forest),
        priority_features=int(priority_features),
    )


def check_arena_bytes(g: Geometry, evict_payload: bool, max_state_bytes) -> None:
    """``InvalidGeometry`` if the state and first scratch arenas exceed the memory bound."""
    if max_state_bytes is not None:
        max_state_bytes = positive_int(max_state_bytes, "max_state_bytes", E.InvalidGeometry)
    state = arena_bytes(STATE_FIELDS, state_dims(g))
    scratch = arena_bytes(SCRATCH_FIELDS, scratch_dims(g, FIRST_ROWS, FIRST_ROWS, evict_payload))
    check_state_bytes(
        state + scratch,
        f"a manager of {g.num_blocks} blocks of {g.block_size} tokens and {g.max_seqs} "
        f"sequences of {g.blocks_per_seq} blocks",
        max_state_bytes,
    )
