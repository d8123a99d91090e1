"""``Arenas``: the part of a manager that owns its memory.

A manager's whole allocator state is one uint8 arena of named fields (``_state.STATE_FIELDS``);
what a call records for the facade (evictions, the undo log, page records, block events, the
call room) is a second one, the scratch arena (``_state.SCRATCH_FIELDS``). The kernels take the
arenas, never the fields: they carve their own named views. This part allocates both, grows the
scratch arena when a call needs more records, and hands the facade the argument tuples the
kernels take and copies of what a committed call recorded.
"""

from __future__ import annotations

import numpy as np

from kvnumba._kernels.undo import give_up_log_rows, undo_log_rows
from kvnumba._state import (
    S_EV_N,
    S_EV_PAYLOAD,
    S_EVT_N,
    S_MAP_N,
    S_UNMAP_N,
    Geometry,
    State,
    new_scratch,
    new_state,
)

#: Eviction records and undo-log rows of a new manager's scratch arena.
FIRST_ROWS = 64


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
        log_rows = max(
            self.x["ulog"].shape[0],
            undo_log_rows(int(blocks), int(prompts), g.blocks_per_page, g.num_pages),
        )
        self.renew_scratch(rows, log_rows, payload=bool(blocks))

    def ensure_give_up_records(self, evictions: int, logged_pages: int = 0) -> None:
        """Grow the scratch so that a give-up evicting ``evictions`` blocks fits (logged for
        ``logged_pages`` pages)."""
        x = self.x
        rows = x["ev_ids"].shape[0]
        log_needed = give_up_log_rows(logged_pages, self.geometry.blocks_per_page)
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
        """Copies of the state arrays."""
        return State(*(array.copy() for array in self.s))

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
