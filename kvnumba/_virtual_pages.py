"""The virtual-page side of ``BlockManager``: a manager on a page pool.

A manager on a :class:`kvnumba.PagePool` runs its calls through the ``*_paged`` kernels, which
take the pool's arena as a third argument, under the pool's lock for the whole call (so the
free pages seen at call start stay free until it ends); its state-changing calls go through
``BlockManager._run`` and the pool's :class:`~kvnumba._coordinator.PoolCoordinator`, which
reclaims pages for a starving call. This mixin holds what is particular to one manager: joining
the pool, ``can_append`` with what reclaim could add, ``trim``, ``close``, the narrow interface
the coordinator uses (cache-only pages, give up, commit, roll back) and the page callbacks.
``docs/design.md`` states the policy.
"""

from __future__ import annotations

import numpy as np

from kvnumba import errors as E
from kvnumba._kernels.physical_pages import O_CLIENT, O_PID, O_START, views_of
from kvnumba._kernels.undo import give_up_log_rows
from kvnumba._state import (
    M_CACHED,
    M_CLIENT,
    M_CO_COUNT,
    M_CO_HEAD,
    M_PID,
    M_START,
    M_VTOP,
    NIL,
    S_MAP_N,
    S_SHORT,
    S_UNMAP_N,
)


class PagedCalls:
    """Mixin of :class:`kvnumba.BlockManager` for managers on a page pool."""

    _pool = None

    # ------------------------------------------------------------------------- construction
    @staticmethod
    def _check_pages(num_blocks: int, page_pool, blocks_per_page) -> int:
        """Validate the page geometry; returns ``blocks_per_page`` (0 without a pool)."""
        from kvnumba._inputs import positive_int
        from kvnumba.physical_pages import PagePool

        if page_pool is None and blocks_per_page is None:
            return 0
        if page_pool is None or blocks_per_page is None:
            raise E.InvalidGeometry("page_pool and blocks_per_page go together")
        if not isinstance(page_pool, PagePool):
            raise TypeError(f"page_pool must be a kvnumba.PagePool, got {type(page_pool).__name__}")
        k = positive_int(blocks_per_page, "blocks_per_page", E.InvalidGeometry)
        if num_blocks % k:
            raise E.InvalidGeometry(f"blocks_per_page={k} does not divide num_blocks={num_blocks}")
        return k

    def _attach_pool(self, pool) -> None:
        """Register with ``pool`` as a client and as a sibling of its other managers."""
        self._pool = pool
        if pool is None:
            return
        from kvnumba._process import FORK_AWARE
        from kvnumba.physical_pages import _load_kernels

        _load_kernels()  # the pool's repair and reclaim may run inside this manager's calls
        client = pool.register_client()
        me = pool.identity(client)
        meta = self._s.meta
        meta[M_CLIENT], meta[M_PID], meta[M_START] = me
        # The kernels stamp the owner of every page they map from meta: a forked child must
        # stamp its own pid, or the pages it maps die with its parent (reclaim_dead).
        FORK_AWARE.add(self)
        self._client = client
        self._claim_after_fork = False  # set in a forked child (_after_fork)
        self._pargs = (self._arena, self._scratch, pool.arena)
        self._finalizer = pool._coordinator.register(self, client, self._s.page_phys)

    def _after_fork(self, pid: int, start: int) -> None:
        """In a forked child: record the child's pid and start time on the pages it maps.

        The pages mapped before the fork still carry the parent's identity; the child's first
        state-changing call stamps them with its own (:meth:`_claim_pages_after_fork`), so that
        they outlive the parent. A manager and its pages belong to one of the two processes:
        the one that goes on using it.
        """
        meta = self._s.meta
        meta[M_PID] = pid
        meta[M_START] = start
        self._claim_after_fork = True

    def _claim_pages_after_fork(self) -> None:
        """Under the pool's lock, in a forked child's first state-changing call: the pages this
        manager holds get the child's pid and start time (once; a walk of its mapped pages)."""
        if not self._claim_after_fork:
            return
        self._claim_after_fork = False
        _, _, owner = views_of(self._pool.arena)
        meta = self._s.meta
        for page in self.mapped_pages().tolist():
            if owner[page, O_CLIENT] == self._client:
                owner[page, O_PID] = meta[M_PID]
                owner[page, O_START] = meta[M_START]

    @property
    def page_pool(self):
        """The :class:`kvnumba.PagePool` this manager maps its pages from, or ``None``."""
        return self._pool

    @property
    def blocks_per_page(self) -> int | None:
        """Blocks per virtual page (``None`` without a page pool)."""
        return self._k or None

    # ----------------------------------------------------------------------------- the calls
    def _paged_can_append(self, ids, counts) -> bool:
        with self._pool.lock():
            status, bad, need, available = self._k_can_append(ids, counts, *self._pargs)
            if status:
                self._raise(status, bad, ids, counts=counts)
            if need <= available:
                return True
            # What sibling reclaim could add: whole pages, up to the unmapped virtual pages.
            gained = self._pool._coordinator.pages_gained(self)
            return bool(need <= available + gained * self._k)

    def trim(self) -> int:
        """Give every cache-only page back to the page pool.

        A cache-only page holds cached blocks but no referenced one; its cached blocks are
        evicted (``on_evict``) and the page unmapped (the pool's ``on_unmap``). A no-op without
        a page pool.

        Returns
        -------
        int
            Pages unmapped.

        Raises
        ------
        CallbackError
            If a callback raised (after the pages were given back); ``.result`` is the count.
        """
        if self._pool is None:
            return 0
        pending = self._orphans_first()
        with self._pool.lock():
            self._ensure_records(int(self._s.meta[M_CACHED]))
            done = int(self._k_give_up(self._num_pages, False, *self._pargs))
        self._collect_events()
        deliver_all((self._deliver_evictions, self._deliver_unmaps), done, pending)
        return done

    def close(self) -> None:
        """Give every page back to the pool and retire the manager (a page pool's managers).

        Its sequences and cached blocks are dropped without callbacks except the pool's
        ``on_unmap``; any later call that reaches a kernel raises ``ValueError``. Idempotent;
        a manager without a pool has nothing to give back and stays usable. A manager on a pool
        that is garbage-collected without ``close()`` gives its pages back at the pool's next
        call from another manager. Close the managers before their pool.

        Raises
        ------
        CallbackError
            If ``on_unmap`` raised; the manager is closed and its pages given back all the same
            (``.result`` is ``None``).
        """
        if self._pool is None or not self._finalizer.alive:
            return
        self._finalizer()
        pool = self._pool
        pool._coordinator.unregister(self)

        def closed(*args):
            raise ValueError("the block manager is closed")

        for name in vars(self).copy():
            if name.startswith("_k_"):
                setattr(self, name, closed)
        if pool.closed:
            pool._coordinator.drop_orphans()  # nothing left to give the pages back to
        else:
            # Last, so that a raising on_unmap finds the manager closed already.
            deliver_all((), None, pool._coordinator.give_back_orphans())

    def mapped_pages(self) -> np.ndarray:
        """Physical page ids this manager holds, in virtual page order (empty without a pool).

        Returns
        -------
        numpy.ndarray of int64
        """
        if self._pool is None or not self._finalizer.alive:
            return np.empty(0, dtype=np.int64)
        phys = self._s.page_phys
        return phys[phys != NIL].astype(np.int64)

    # ------------------------------------------- what the pool's coordinator asks of a manager
    def _unmapped_pages(self) -> int:
        """Virtual pages without a physical page (what more pages could back)."""
        return int(self._s.meta[M_VTOP])

    def _shortfall(self) -> int:
        """Blocks the last failed call lacked where it failed."""
        return int(self._scr[S_SHORT])

    def _cache_only_count(self) -> int:
        """Pages holding cached blocks and no referenced one."""
        return int(self._s.meta[M_CO_COUNT])

    def _cache_only_stamps(self, limit: int) -> list[tuple[int, int]]:
        """``(stamp, page)`` of the first ``limit`` cache-only pages, oldest stamp first (a walk
        of at most ``limit``)."""
        co_next, stamps = self._s.co_next, self._s.page_stamp
        out = []
        v = int(self._s.meta[M_CO_HEAD])
        while v != NIL and len(out) < limit:
            out.append((int(stamps[v]), v))
            v = int(co_next[v])
        return out

    def _give_up(self, pages: int) -> None:
        """Give up the ``pages`` oldest cache-only pages, logged until committed or rolled back."""
        self._ensure_records(pages * self._k, logged_pages=pages)
        self._k_give_up(pages, True, *self._pargs)

    def _commit_give_up(self) -> None:
        """Keep a logged give-up (a starving sibling used the pages)."""
        self._k_commit_give_up(*self._pargs)
        self._collect_events()

    def _rollback_give_up(self) -> None:
        """Undo a logged give-up: the pages are this manager's again, byte for byte."""
        self._k_rollback(*self._pargs)

    def _ensure_records(self, evictions: int, logged_pages: int = 0) -> None:
        """Grow the scratch so that a give-up evicting ``evictions`` blocks fits."""
        x = self._x
        rows = x["ev_ids"].shape[0]
        log_needed = give_up_log_rows(logged_pages, self._k)
        payload = logged_pages > 0 or self._on_evict is not None
        if (
            evictions > rows
            or (payload and evictions > x["ev_tok"].shape[0])
            or log_needed > x["ulog"].shape[0]
        ):
            self._new_scratch(
                max(rows, evictions), max(x["ulog"].shape[0], log_needed), payload=payload
            )

    # ------------------------------------------------------------------------------ callbacks
    def _orphans_first(self):
        """Give back the pages of collected managers before a call (the coordinator's
        ``give_back_orphans``).

        Returns the first exception an ``on_unmap`` raised, for the call to raise as the cause
        of its ``CallbackError`` once it has committed (the call itself still runs).
        """
        coordinator = self._pool._coordinator
        return coordinator.give_back_orphans() if coordinator.has_orphans else None

    def _deliver_paged(self, givers, result, pending=None) -> None:
        """Callbacks of a committed call: the siblings' give-ups first, then this manager's.

        Every callback runs even if an earlier one raises; then ``CallbackError`` carrying
        ``result`` is raised with the first error (``pending`` if set) as its cause.
        """
        deliveries = []
        for sibling in givers:
            deliveries += [sibling._deliver_evictions, sibling._deliver_unmaps]
        deliveries += [self._deliver_evictions, self._deliver_unmaps, self._deliver_maps]
        deliver_all(deliveries, result, pending)

    def _deliver_unmaps(self) -> None:
        """Hand this call's unmapped pages to the pool's ``on_unmap``."""
        pool = self._pool
        if pool.on_unmap is not None:
            unmapped = self._x["unmap_rec"][: int(self._scr[S_UNMAP_N])]
            pool.deliver(unmapped=(unmapped[:, 0], unmapped[:, 1]))

    def _deliver_maps(self) -> None:
        """Hand this call's mapped pages to the pool's ``on_map``."""
        pool = self._pool
        if pool.on_map is not None:
            maps = self._x["map_rec"][: int(self._scr[S_MAP_N])]
            pool.deliver(mapped=(maps[:, 0], maps[:, 1]))


def deliver_all(deliveries, result=None, pending=None) -> None:
    """Run every callback delivery of a committed call, even if one raises.

    Parameters
    ----------
    deliveries : sequence of callables
        Each delivers one callback of the call.
    result : object
        The call's result, carried by the ``CallbackError``.
    pending : Exception, optional
        A callback error raised earlier in the same call (it comes first).

    Raises
    ------
    CallbackError
        With the first callback exception as ``__cause__``, after every delivery ran.
    """
    error = pending
    for deliver in deliveries:
        try:
            deliver()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
            if error is None:
                error = exc
    if error is not None:
        raise E.CallbackError(result) from error
