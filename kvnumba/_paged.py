"""The page-pool side of ``BlockManager``: locking, sibling reclaim, ``trim`` and page callbacks.

A manager on a :class:`kvnumba.PagePool` runs its allocating calls through the ``*_paged``
kernels, which take the pool's arena as a third argument, and holds the pool's lock for the
whole call (so the free pages seen at call start stay free until it ends). An atomic call that
finds the pool empty first frees the pages of dead processes, then asks the other managers
registered on the same pool object for cache-only pages, and is retried once; the siblings'
give-ups are rolled back if the retry fails too. ``docs/design.md`` states the policy.
"""

from __future__ import annotations

import heapq
import itertools
import weakref

import numpy as np

from kvnumba import errors as E
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
        from kvnumba.pages import PagePool

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
        from kvnumba.pages import _FORK_AWARE, _load_kernels

        _load_kernels()  # the pool's repair and reclaim may run inside this manager's calls
        client = pool.register_client()
        me = pool.identity(client)
        meta = self._s.meta
        meta[M_CLIENT], meta[M_PID], meta[M_START] = me
        # The kernels stamp the owner of every page they map from meta: a forked child must
        # stamp its own pid, or the pages it maps die with its parent (reclaim_dead).
        _FORK_AWARE.add(self)
        self._client = client
        self._pargs = (self._arena, self._scratch, pool.arena)
        pool._managers[:] = [ref for ref in pool._managers if ref() is not None]
        pool._managers.append(weakref.ref(self))
        # A manager that is gone can no longer use its pages: they go back to the pool. The
        # finalizer only queues them (it may run inside any allocation, even an import); the
        # pool's next call from a manager gives them back.
        self._finalizer = weakref.finalize(self, pool._orphans.append, (client, self._s.page_phys))

    def _after_fork(self, pid: int, start: int) -> None:
        """In a forked child: record the child's pid and start time on the pages it maps.

        Pages mapped before the fork keep the parent's stamp; the parent's copy of the manager
        holds them as well, so a manager and its pages belong to one of the two processes.
        """
        meta = self._s.meta
        meta[M_PID] = pid
        meta[M_START] = start

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
            free_pages = self._pool.num_free
            vtop = int(self._s.meta[M_VTOP])
            extra = sum(int(m._s.meta[M_CO_COUNT]) for m in self._siblings())
            gained = min(free_pages + extra, vtop) - min(free_pages, vtop)
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
        pool._managers[:] = [ref for ref in pool._managers if ref() not in (None, self)]

        def closed(*args):
            raise ValueError("the block manager is closed")

        for name in vars(self).copy():
            if name.startswith("_k_"):
                setattr(self, name, closed)
        if pool.closed:
            pool._orphans.clear()  # nothing left to give the pages back to
        else:
            # Last, so that a raising on_unmap finds the manager closed already.
            deliver_all((), None, give_back_orphans(pool))

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

    # ------------------------------------------------------------------------ sibling reclaim
    def _siblings(self) -> list:
        """Other live managers registered on this manager's pool object, in registration order."""
        alive = []
        for ref in self._pool._managers:
            manager = ref()
            if manager is not None and manager is not self and manager._finalizer.alive:
                alive.append(manager)
        return alive

    def _run_with_reclaim(self, run, atomic):
        """Run an allocating call under the pool lock; on exhaustion reclaim pages and retry.

        Returns the kernel's result and the siblings whose give-ups the call committed.
        """
        pool = self._pool
        with pool.lock():
            pool._repair_if_torn()  # before any page is taken: repair rewrites the free stack
            result = run()
            if result[0] != E.ST_POOL_EXHAUSTED or not atomic:
                return result, ()
            # Only a shared pool can hold pages of processes that died.
            if pool.is_shared and pool.num_free < int(self._s.meta[M_VTOP]):
                if pool.reclaim_dead() > 0:
                    result = run()
                    if result[0] != E.ST_POOL_EXHAUSTED:
                        return result, ()
            givers: list = []
            try:
                self._ask_siblings(int(self._scr[S_SHORT]), givers)
                if not givers:
                    return result, ()
                retry = run()
            except BaseException:
                # Whatever interrupted the reclaim, the siblings get their pages back.
                for sibling in reversed(givers):
                    sibling._k_rollback_give_up(*sibling._pargs)
                raise
            if retry[0] == E.ST_POOL_EXHAUSTED:
                for sibling in reversed(givers):
                    sibling._k_rollback_give_up(*sibling._pargs)
                return result, ()
            for sibling in givers:
                sibling._k_commit_give_up(*sibling._pargs)
            return retry, givers

    def _ask_siblings(self, shortfall: int, givers: list) -> None:
        """Have siblings give up the cache-only pages this call lacks, oldest first (logged).

        ``shortfall`` is the number of blocks the call lacked where it failed. The siblings
        that gave pages are appended to ``givers`` (in registration order) as they do; none
        give any if they cannot cover the shortfall or this manager has too few unmapped virtual
        pages to use the pages.
        """
        wanted = -(-shortfall // self._k)
        if wanted <= 0 or self._pool.num_free + wanted > int(self._s.meta[M_VTOP]):
            return
        siblings = self._siblings()
        if sum(int(m._s.meta[M_CO_COUNT]) for m in siblings) < wanted:
            return
        # Merge the siblings' cache-only lists (each already in stamp order) by stamp.
        lists = [
            [(int(m._s.page_stamp[v]), i) for v in m._cache_only_pages(wanted)]
            for i, m in enumerate(siblings)
        ]
        shares = [0] * len(siblings)
        for _, i in itertools.islice(heapq.merge(*lists), wanted):
            shares[i] += 1
        for share, sibling in zip(shares, siblings, strict=True):
            if share:
                sibling._ensure_records(share * sibling._k, logged_pages=share)
                sibling._k_give_up(share, True, *sibling._pargs)
                givers.append(sibling)

    def _cache_only_pages(self, limit: int) -> list[int]:
        """The first ``limit`` pages of the cache-only list (a walk of at most ``limit``)."""
        co_next = self._s.co_next
        out = []
        v = int(self._s.meta[M_CO_HEAD])
        while v != NIL and len(out) < limit:
            out.append(v)
            v = int(co_next[v])
        return out

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
        """Give back the pages of collected managers before a call (see ``give_back_orphans``).

        Returns the first exception an ``on_unmap`` raised, for the call to raise as the cause
        of its ``CallbackError`` once it has committed (the call itself still runs).
        """
        pool = self._pool
        return give_back_orphans(pool) if pool._orphans else None

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


def give_back_orphans(pool) -> Exception | None:
    """Unmap the pages of managers that were closed or garbage-collected (``on_unmap`` too).

    Returns the first exception ``on_unmap`` raised, not raising it: every orphan is still
    given back, and the caller decides when the error surfaces.
    """
    error = None
    while pool._orphans:
        client, physical = pool._orphans.pop(0)
        held = physical[physical != NIL].astype(np.int64)
        if held.size:
            try:
                pool.unmap_pages(client, held)
            except E.CallbackError as exc:
                # The pages are back; only the callback failed. Keep its own exception.
                if error is None:
                    error = exc.__cause__
    return error
