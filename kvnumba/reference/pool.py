"""The model's physical page pool: a LIFO stack of free pages, page owners and a logical clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvnumba.errors import InvalidGeometry, InvariantViolation
from kvnumba.reference._common import _as_int

if TYPE_CHECKING:
    from kvnumba.reference.manager import ReferenceBlockManager


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
