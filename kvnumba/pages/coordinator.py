"""The managers of one page pool object, and how pages move between them.

A :class:`kvnumba.PagePool` owns one :class:`PoolCoordinator`. It knows the pool's managers of
this process (weakly, in registration order), queues the pages of managers that were closed or
garbage-collected, and runs an allocating call of one manager under the pool's lock with
reclaim on exhaustion: first the pages of dead processes, then cache-only pages of the other
managers, oldest stamp first, after which the call is retried once and the give-ups are
committed, or rolled back if the retry fails too. ``docs/design.md`` states the policy.

A manager takes part as a :class:`PoolMember` (its ``PageSide``); no manager reads another's
arrays.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from typing import Protocol

import numpy as np

from kvnumba import errors as E
from kvnumba._layout import NIL
from kvnumba.kernels import status_of


class PoolMember(Protocol):
    """What the coordinator asks of a manager on its pool (``pages.member.PageSide``)."""

    blocks_per_page: int

    @property
    def alive(self) -> bool:
        """Whether the manager still holds its pages (neither closed nor collected)."""

    def unmapped_pages(self) -> int:
        """Its virtual pages without a physical page."""

    def cache_only_count(self) -> int:
        """Its pages that hold cached blocks and no referenced one."""

    def cache_only_stamps(self, limit: int) -> list[tuple[int, int]]:
        """``(stamp, page)`` of its first ``limit`` cache-only pages, oldest first."""

    def shortfall(self) -> int:
        """Blocks its last failed call lacked."""

    def claim_pages_after_fork(self) -> None:
        """In a forked child: its pages take the child's identity."""

    def give_up(self, pages: int) -> None:
        """Give up its ``pages`` oldest cache-only pages, logged."""

    def commit_give_up(self) -> None:
        """Keep the logged give-up."""

    def rollback_give_up(self) -> None:
        """Undo the logged give-up, byte for byte."""

    def give_up_deliveries(self) -> list:
        """The callbacks of a committed give-up (run by the starving manager with its own)."""


class PoolCoordinator:
    """Registry of a pool's managers, orphaned pages and reclaim between managers.

    Parameters
    ----------
    pool : kvnumba.PagePool
        The pool object (held weakly: the pool owns the coordinator).
    """

    def __init__(self, pool):
        self._pool = weakref.proxy(pool)
        self._members: list[weakref.ref] = []
        # (client, page table) of managers that were closed or collected, pages not yet back.
        self._orphans: list[tuple[int, np.ndarray]] = []

    # ------------------------------------------------------------------------ membership
    def register(self, owner, member: PoolMember, client: int, page_phys: np.ndarray):
        """Add ``member``, the page side of manager ``owner`` (pool client ``client``);
        returns the finalizer that retires it.

        A manager that is gone can no longer use its pages: the finalizer queues them (it may
        run inside any allocation, even an import) and the pool's next call from a manager
        gives them back.
        """
        self._members = [ref for ref in self._members if ref() is not None]
        self._members.append(weakref.ref(member))
        return weakref.finalize(owner, self._orphans.append, (client, page_phys))

    def unregister(self, member: PoolMember) -> None:
        """Forget ``member`` (closed)."""
        self._members = [ref for ref in self._members if ref() not in (None, member)]

    def siblings(self, member: PoolMember) -> list[PoolMember]:
        """The other live members of the pool object, in registration order."""
        alive = []
        for ref in self._members:
            other = ref()
            if other is not None and other is not member and other.alive:
                alive.append(other)
        return alive

    # ---------------------------------------------------------------------------- orphans
    @property
    def has_orphans(self) -> bool:
        """Whether pages of closed or collected managers wait to be given back."""
        return bool(self._orphans)

    def drop_orphans(self) -> None:
        """Forget the queued pages (the pool is closed: there is nothing to give them back to)."""
        self._orphans.clear()

    def give_back_orphans(self) -> BaseException | None:
        """Unmap the pages of managers that were closed or garbage-collected (``on_unmap`` too).

        Returns the first exception ``on_unmap`` raised, not raising it: every orphan is still
        given back, and the caller decides when the error surfaces.
        """
        error = None
        while self._orphans:
            client, physical = self._orphans.pop(0)
            held = physical[physical != NIL].astype(np.int64)
            if held.size:
                try:
                    self._pool.unmap_pages(client, held)
                except E.CallbackError as exc:
                    # The pages are back; only the callback failed. Keep its own exception.
                    if error is None:
                        error = exc.__cause__
        return error

    # ---------------------------------------------------------------------------- reclaim
    def run_with_reclaim(self, manager: PoolMember, run, atomic: bool):
        """Run ``manager``'s allocating call ``run()`` under the pool lock, reclaiming on
        exhaustion of an atomic call.

        Returns
        -------
        result : tuple
            The kernel's result (of the retry, if there was one that succeeded).
        givers : list
            The siblings whose give-ups the call committed (their callbacks are due).
        """
        pool = self._pool
        with pool.lock():
            pool._repair_if_torn()  # before any page is taken: repair rewrites the free stack
            manager.claim_pages_after_fork()
            result = run()
            if status_of(result) != E.ST_POOL_EXHAUSTED or not atomic:
                return result, []
            # Only a shared pool can hold pages of processes that died.
            if pool.is_shared and pool.num_free < manager.unmapped_pages():
                if pool.reclaim_dead() > 0:
                    result = run()
                    if status_of(result) != E.ST_POOL_EXHAUSTED:
                        return result, []
            givers: list = []
            try:
                self.ask_siblings(manager, manager.shortfall(), givers)
                if not givers:
                    return result, []
                retry = run()
            except BaseException:
                # Whatever interrupted the reclaim, the siblings get their pages back.
                for sibling in reversed(givers):
                    sibling.rollback_give_up()
                raise
            if status_of(retry) == E.ST_POOL_EXHAUSTED:
                for sibling in reversed(givers):
                    sibling.rollback_give_up()
                return result, []
            for sibling in givers:
                sibling.commit_give_up()
            return retry, givers

    def ask_siblings(self, manager: PoolMember, shortfall: int, givers: list) -> None:
        """Have siblings give up the cache-only pages ``manager`` lacks, oldest first (logged).

        ``shortfall`` is the number of blocks the call lacked where it failed. The siblings
        that gave pages are appended to ``givers`` (in registration order) as they do; none
        give any if they cannot cover the shortfall or ``manager`` has too few unmapped
        virtual pages to use the pages.
        """
        wanted = -(-shortfall // manager.blocks_per_page)
        if wanted <= 0 or self._pool.num_free + wanted > manager.unmapped_pages():
            return
        siblings = self.siblings(manager)
        if sum(m.cache_only_count() for m in siblings) < wanted:
            return
        # Merge the siblings' cache-only lists (each already in stamp order) by stamp.
        lists = [
            [(stamp, i) for stamp, _ in m.cache_only_stamps(wanted)] for i, m in enumerate(siblings)
        ]
        shares = [0] * len(siblings)
        for _, i in itertools.islice(heapq.merge(*lists), wanted):
            shares[i] += 1
        for share, sibling in zip(shares, siblings, strict=True):
            if share:
                sibling.give_up(share)
                givers.append(sibling)

    def pages_gained(self, manager: PoolMember) -> int:
        """Pages a starving call of ``manager`` could get: free ones and the siblings'
        cache-only ones, up to its unmapped virtual pages (what ``can_append`` counts)."""
        free, unmapped = self._pool.num_free, manager.unmapped_pages()
        extra = sum(m.cache_only_count() for m in self.siblings(manager))
        return min(free + extra, unmapped) - min(free, unmapped)
