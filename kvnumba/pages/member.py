"""``PageSide``: the part of a manager on a page pool.

A manager on a :class:`kvnumba.PagePool` runs its calls through the ``*_paged`` kernels, which
take the pool's arena as a third argument, under the pool's lock for the whole call (so the
free pages seen at call start stay free until it ends). This part joins the pool, runs a call
under the lock through the pool's :class:`~kvnumba.pages.coordinator.PoolCoordinator` (which reclaims
pages for a starving call), counts what reclaim could add for ``can_append``, gives cache-only
pages back (``trim``, ``close``) and delivers the page callbacks. Toward the coordinator it is a
:class:`~kvnumba.pages.coordinator.PoolMember`: the coordinator reads and moves a manager's pages
through these few methods only. ``docs/design.md`` states the policy.
"""

from __future__ import annotations

import numpy as np

from kvnumba import errors as E
from kvnumba._kernels.physical_pages import O_CLIENT, O_PID, O_START, views_of
from kvnumba._layout import (
    M_CACHED,
    M_CLIENT,
    M_CO_COUNT,
    M_CO_HEAD,
    M_PID,
    M_START,
    M_VTOP,
    NIL,
    REC_PHYSICAL,
    REC_VIRTUAL,
    S_SHORT,
)
from kvnumba._pipeline import deliver_all, deliver_evictions, failure
from kvnumba.inputs import positive_int
from kvnumba.kernels import head_of


def check_pages(num_blocks: int, page_pool, blocks_per_page) -> int:
    """Validate the page geometry of a new manager; returns ``blocks_per_page`` (0 without a
    pool).

    Raises
    ------
    InvalidGeometry
        For a pool without ``blocks_per_page`` (or the reverse) or one that does not divide
        ``num_blocks``.
    TypeError
        For a ``page_pool`` that is no :class:`kvnumba.PagePool`.
    """
    from kvnumba.pages.pool import PagePool

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


class PageSide:
    """A manager's membership of a page pool.

    Parameters
    ----------
    owner : BlockManager
        The manager (held only by its finalizer: the pages go back when it is collected).
    pool : PagePool
        The pool to join.
    arenas : Arenas
    kernels : KernelSet
    events : EngineKeys
        Keeps the block events of committed give-ups.
    facts : Facts
        What error messages read of the manager.
    on_evict : callable or None
        The manager's eviction callback (a give-up evicts).

    Attributes
    ----------
    pool : PagePool
    blocks_per_page : int
    client : int
        The manager's client token in the pool's owner records.
    """

    def __init__(self, owner, pool, arenas, kernels, events, facts, on_evict):
        from kvnumba.pages._process import FORK_AWARE
        from kvnumba.pages.pool import _load_kernels

        self.pool = pool
        self.arenas = arenas
        self.kernels = kernels
        self.events = events
        self.facts = facts
        self.on_evict = on_evict
        self.blocks_per_page = self.arenas.geometry.blocks_per_page
        self.num_pages = self.arenas.geometry.num_pages
        _load_kernels()  # the pool's repair and reclaim may run inside this manager's calls
        self.client = pool.register_client()
        meta = self.arenas.s.meta
        meta[M_CLIENT], meta[M_PID], meta[M_START] = pool.identity(self.client)
        # The kernels stamp the owner of every page they map from meta: a forked child must
        # stamp its own pid, or the pages it maps die with its parent (reclaim_dead).
        FORK_AWARE.add(self)
        self.claim_after_fork = False  # set in a forked child (after_fork)
        self.arenas.attach_pool(pool.arena)
        self.finalizer = pool._coordinator.register(
            owner, self, self.client, self.arenas.s.page_phys
        )

    # --------------------------------------------------------------------- the manager's calls
    @property
    def alive(self) -> bool:
        """Whether the manager still holds its pages (neither closed nor collected)."""
        return self.finalizer.alive

    def run_with_reclaim(self, run, atomic: bool):
        """Run ``run()`` under the pool's lock with the coordinator's reclaim; returns the
        kernel's result and the siblings that gave pages."""
        return self.pool._coordinator.run_with_reclaim(self, run, atomic)

    def orphans_first(self):
        """Give back the pages of collected managers before a call; returns the first error an
        ``on_unmap`` raised (the call raises it as the cause of its ``CallbackError`` once it
        has committed)."""
        coordinator = self.pool._coordinator
        return coordinator.give_back_orphans() if coordinator.has_orphans else None

    def can_append(self, ids, counts) -> bool:
        """``BlockManager.can_append`` on a page pool: what reclaim could add counts too."""
        with self.pool.lock():
            status, bad, need, available = head_of(
                self.kernels.k_can_append(ids, counts, *self.arenas.call_args)
            )
            if status:
                raise failure(self.facts, status, bad, ids=ids, counts=counts)
            if need <= available:
                return True
            # What sibling reclaim could add: whole pages, up to the unmapped virtual pages.
            gained = self.pool._coordinator.pages_gained(self)
            return bool(need <= available + gained * self.blocks_per_page)

    def check(self):
        """``k_check`` under the pool's lock (its pages against the pool's owner records)."""
        with self.pool.lock():
            return self.kernels.k_check(*self.arenas.call_args)

    def trim(self) -> int:
        """``BlockManager.trim``: give every cache-only page back; returns the pages unmapped."""
        pending = self.orphans_first()
        with self.pool.lock():
            self.arenas.ensure_give_up_records(int(self.arenas.s.meta[M_CACHED]))
            done = int(self.kernels.k_give_up(self.num_pages, False, *self.arenas.call_args))
        self.events.collect()
        deliver_all((self.deliver_evictions, self.deliver_unmaps), done, pending)
        return done

    def close(self) -> None:
        """``BlockManager.close``: give every page back and retire the manager."""
        if not self.finalizer.alive:
            return
        self.finalizer()
        pool = self.pool
        pool._coordinator.unregister(self)
        self.kernels.close()
        if pool.closed:
            pool._coordinator.drop_orphans()  # nothing left to give the pages back to
        else:
            # Last, so that a raising on_unmap finds the manager closed already.
            deliver_all((), None, pool._coordinator.give_back_orphans())

    def mapped_pages(self) -> np.ndarray:
        """Physical page ids this manager holds, in virtual page order."""
        if not self.finalizer.alive:
            return np.empty(0, dtype=np.int64)
        phys = self.arenas.s.page_phys
        return phys[phys != NIL].astype(np.int64)

    def deliver(self, givers, result, pending=None) -> None:
        """Callbacks of a committed call: the siblings' give-ups first, then this manager's.

        Every callback runs even if an earlier one raises; then ``CallbackError`` carrying
        ``result`` is raised with the first error (``pending`` if set) as its cause.
        """
        deliveries = []
        for sibling in givers:
            deliveries += sibling.give_up_deliveries()
        deliveries += [self.deliver_evictions, self.deliver_unmaps, self.deliver_maps]
        deliver_all(deliveries, result, pending)

    def deliver_evictions(self) -> None:
        """Hand this manager's last evictions to its ``on_evict``."""
        deliver_evictions(self.arenas, self.on_evict)

    def deliver_unmaps(self) -> None:
        """Hand this call's unmapped pages to the pool's ``on_unmap``."""
        if self.pool.on_unmap is not None:
            unmapped = self.arenas.unmapped_records()
            self.pool.deliver(unmapped=(unmapped[:, REC_PHYSICAL], unmapped[:, REC_VIRTUAL]))

    def deliver_maps(self) -> None:
        """Hand this call's mapped pages to the pool's ``on_map``."""
        if self.pool.on_map is not None:
            maps = self.arenas.mapped_records()
            self.pool.deliver(mapped=(maps[:, REC_PHYSICAL], maps[:, REC_VIRTUAL]))

    # ------------------------------------------------------------------ forked processes
    def _after_fork(self, pid: int, start: int) -> None:
        """In a forked child (``kvnumba.pages._process.FORK_AWARE``): record the child's pid and
        start time on the pages it maps from now on, and claim the pages held since."""
        meta = self.arenas.s.meta
        meta[M_PID] = pid
        meta[M_START] = start
        self.claim_after_fork = True

    # ------------------------------------------------- PoolMember: what the coordinator asks
    def claim_pages_after_fork(self) -> None:
        """Under the pool's lock, in a forked child's first state-changing call: the pages this
        manager holds get the child's pid and start time (once; a walk of its mapped pages).

        A manager and its pages belong to one of the two processes: the one that goes on
        using it.
        """
        if not self.claim_after_fork:
            return
        self.claim_after_fork = False
        _, _, owner = views_of(self.pool.arena)
        meta = self.arenas.s.meta
        for page in self.mapped_pages().tolist():
            if owner[page, O_CLIENT] == self.client:
                owner[page, O_PID] = meta[M_PID]
                owner[page, O_START] = meta[M_START]

    def unmapped_pages(self) -> int:
        """Virtual pages without a physical page (what more pages could back)."""
        return int(self.arenas.s.meta[M_VTOP])

    def shortfall(self) -> int:
        """Blocks the last failed call lacked where it failed."""
        return int(self.arenas.scr[S_SHORT])

    def cache_only_count(self) -> int:
        """Pages holding cached blocks and no referenced one."""
        return int(self.arenas.s.meta[M_CO_COUNT])

    def cache_only_stamps(self, limit: int) -> list[tuple[int, int]]:
        """``(stamp, page)`` of the first ``limit`` cache-only pages, oldest stamp first (a
        walk of at most ``limit``)."""
        s = self.arenas.s
        out: list[tuple[int, int]] = []
        v = int(s.meta[M_CO_HEAD])
        while v != NIL and len(out) < limit:
            out.append((int(s.page_stamp[v]), v))
            v = int(s.co_next[v])
        return out

    def give_up(self, pages: int) -> None:
        """Give up the ``pages`` oldest cache-only pages, logged until committed or rolled
        back."""
        self.arenas.ensure_give_up_records(pages * self.blocks_per_page, logged_pages=pages)
        self.kernels.k_give_up(pages, True, *self.arenas.call_args)

    def commit_give_up(self) -> None:
        """Keep a logged give-up (a starving sibling used the pages)."""
        self.kernels.k_commit_give_up(*self.arenas.call_args)
        self.events.collect()

    def rollback_give_up(self) -> None:
        """Undo a logged give-up: the pages are this manager's again, byte for byte."""
        self.kernels.k_rollback(*self.arenas.call_args)

    def give_up_deliveries(self) -> list:
        """The callbacks of a committed give-up, for the starving manager to run with its own."""
        return [self.deliver_evictions, self.deliver_unmaps]
