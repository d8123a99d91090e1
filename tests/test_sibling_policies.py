"""Sibling policies of managers on one page pool, pinned with three or more managers.

Two policies of ``docs/design.md`` ("Two-level allocation: the page policy") are easy to get
subtly wrong without any other test noticing:

- ``can_append`` adds the pages sibling reclaim could bring, but only as many as this manager
  has unmapped virtual pages to map them to (beyond the pool's free pages);
- sibling reclaim takes the cache-only pages with the smallest stamps of the pool clock, across
  all siblings, and inside each sibling from the head of its cache-only list.

Each test builds the same situation on the kernels and on the reference model and checks both
against concrete page ids derived by hand, so a planted bug in either shows up here.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvnumba
from kvnumba._kernels.physical_pages import O_CLIENT, O_VIRTUAL
from kvnumba._layout import M_CO_HEAD, NIL
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool


class Log:
    """Every callback of one pool and its managers, in call order."""

    def __init__(self):
        self.calls = []

    def pages(self, what):
        def hook(physical, virtual):
            self.calls.append((what, physical.tolist(), virtual.tolist()))

        return hook

    def evict(self, name):
        def hook(ids, hashes, tokens):
            self.calls.append(("evict", name, ids.tolist()))

        return hook

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def cache_only(mgr) -> list[tuple[int, int]]:
    """``(virtual page, stamp)`` of a manager's cache-only list, head (given up first) first."""
    if isinstance(mgr, ReferenceBlockManager):
        return mgr.cache_only_pages()
    state = mgr.state
    out, v = [], int(state.meta[M_CO_HEAD])
    while v != NIL:
        out.append((v, int(state.page_stamp[v])))
        v = int(state.co_next[v])
    return out


def owners(pool, managers) -> dict[int, tuple[int, int]]:
    """Physical page -> (index of the owning manager in ``managers``, virtual page)."""
    if isinstance(pool, ReferencePagePool):
        out = {}
        for p in range(pool.num_pages):
            owner = pool.owner_of(p)
            if owner is not None:
                out[p] = ([id(m) for m in managers].index(id(owner[0])), owner[1])
        return out
    clients = [m._pages.client for m in managers]
    owner = pool.state.owner
    return {
        p: (clients.index(int(owner[p, O_CLIENT])), int(owner[p, O_VIRTUAL]))
        for p in range(pool.num_pages)
        if owner[p, O_CLIENT] != -1
    }


def setup_three(kind, log, small_pages=4, pool_pages=4):
    """Siblings ``a`` and ``b`` hold two cache-only pages each, stamped alternately.

    Pool of ``pool_pages`` physical pages, managers of 4 virtual pages of 2 blocks (block size
    1), registered ``a``, ``b``, ``c``. ``a`` and ``b`` each admit and release a two-token prompt
    twice, alternating, so that their cache-only pages carry the stamps ``a v0: 1, b v0: 2,
    a v1: 3, b v1: 4`` and physical pages ``0, 1, 2, 3``. ``c`` has ``small_pages`` virtual pages
    and nothing mapped.
    """
    if kind == "kernels":
        pool = kvnumba.PagePool(pool_pages, on_map=log.pages("map"), on_unmap=log.pages("unmap"))
        make = kvnumba.BlockManager
    else:
        pool = ReferencePagePool(pool_pages, on_map=log.pages("map"), on_unmap=log.pages("unmap"))
        make = ReferenceBlockManager

    def paged(name, pages):
        return make(
            2 * pages,
            1,
            page_pool=pool,
            blocks_per_page=2,
            max_seqs=8,
            max_seq_len=64,
            on_evict=log.evict(name),
        )

    a, b, c = paged("a", 4), paged("b", 4), paged("c", small_pages)
    for prompt in ([1, 2], [3, 4]):
        for mgr in (a, b):
            # Different tokens per manager: no two pages hold equal content.
            tokens = [t + 10 * (mgr is b) for t in prompt]
            mgr.release(mgr.admit(tokens, [2]).ids)
    log.take()
    return pool, a, b, c


BOTH = pytest.mark.parametrize("kind", ["kernels", "reference"])


@BOTH
def test_the_setup_has_alternating_stamps(kind):
    pool, a, b, c = setup_three(kind, Log())
    assert cache_only(a) == [(0, 1), (1, 3)] and cache_only(b) == [(0, 2), (1, 4)]
    assert owners(pool, [a, b, c]) == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}
    assert pool.num_free == 0


# -------------------------------------------------------------------- can_append cap


@BOTH
@pytest.mark.parametrize(
    ("small_pages", "pool_pages", "limit"),
    [
        # No free pool page, 4 cache-only sibling pages, 2 virtual pages here: 2 pages of 2.
        (2, 4, 4),
        # One free pool page and 4 sibling pages, but 2 virtual pages: 1 + 1 pages.
        (2, 5, 4),
        # 3 virtual pages: 3 of the 4 sibling pages.
        (3, 4, 6),
        # 4 virtual pages: every sibling page counts.
        (4, 4, 8),
    ],
)
def test_can_append_counts_sibling_pages_only_up_to_unmapped_virtual_pages(
    kind, small_pages, pool_pages, limit
):
    """``can_append`` is True exactly up to ``limit`` tokens, and ``append`` agrees with it."""
    for count in range(limit + 3):
        log = Log()
        pool, a, b, c = setup_three(kind, log, small_pages, pool_pages)
        (sid,) = c.new_sequences(1)
        answer = c.can_append([sid], [count])
        assert answer == (count <= limit), count
        before = [cache_only(a), cache_only(b), owners(pool, [a, b, c])]
        try:
            c.append([sid], [count])
        except kvnumba.PoolExhausted as exc:
            assert not answer, f"can_append said True for {count}, append raised {exc!r}"
            # A failed call leaves the siblings' cache and the pool as they were.
            assert [cache_only(a), cache_only(b), owners(pool, [a, b, c])] == before
        else:
            assert answer, f"can_append said False for {count}, append succeeded"
        c.check()


@BOTH
def test_can_append_with_a_partly_mapped_manager(kind):
    """The cap is the unmapped virtual pages left, not the manager's page count."""
    log = Log()
    pool, a, b, c = setup_three(kind, log, small_pages=3, pool_pages=5)
    (hog,) = c.new_sequences(1)
    c.append([hog], [2])  # the free pool page: c v0 is full, 2 virtual pages left
    (sid,) = c.new_sequences(1)
    assert c.can_append([sid], [4]) and not c.can_append([sid], [5])
    with pytest.raises(kvnumba.PoolExhausted):
        c.append([sid], [5])
    c.append([sid], [4])  # two pages: a v0 (stamp 1) and b v0 (stamp 2)
    assert cache_only(a) == [(1, 3)] and cache_only(b) == [(1, 4)]
    assert not c.can_append([sid], [1])  # no virtual page left, though siblings have two


# ---------------------------------------------------------------- reclaim order


@BOTH
def test_one_page_comes_from_the_oldest_stamp_of_all_siblings(kind):
    log = Log()
    pool, a, b, c = setup_three(kind, log)
    (sid,) = c.new_sequences(1)
    c.append([sid], [1])  # wanted 1 page: a v0 (stamp 1) before b v0 (2), a v1 (3), b v1 (4)
    assert log.take() == [
        ("evict", "a", [0, 1]),
        ("unmap", [0], [0]),
        ("map", [0], [0]),
    ]
    assert cache_only(a) == [(1, 3)] and cache_only(b) == [(0, 2), (1, 4)]
    assert owners(pool, [a, b, c]) == {0: (2, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}


@BOTH
def test_pages_are_chosen_by_stamp_across_siblings_one_at_a_time(kind):
    log = Log()
    pool, a, b, c = setup_three(kind, log)
    (sid,) = c.new_sequences(1)
    # wanted 3 pages: stamps 1 (a v0), 2 (b v0), 3 (a v1); a gives up first (registration
    # order), then b; b v1 (stamp 4) stays.
    c.append([sid], [5])
    assert log.take() == [
        ("evict", "a", [0, 1, 2, 3]),
        ("unmap", [0, 2], [0, 1]),
        ("evict", "b", [0, 1]),
        ("unmap", [1], [0]),
        ("map", [1, 2, 0], [0, 1, 2]),
    ]
    assert cache_only(a) == [] and cache_only(b) == [(1, 4)]
    assert owners(pool, [a, b, c]) == {0: (2, 2), 1: (2, 0), 2: (2, 1), 3: (1, 1)}
    for mgr in (a, b, c):
        mgr.check()


@BOTH
def test_later_calls_keep_taking_the_oldest_left(kind):
    """Successive one-page reclaims walk the stamps in increasing order: 1, 2, 3, 4."""
    log = Log()
    pool, a, b, c = setup_three(kind, log)
    order = []
    for _ in range(4):
        (sid,) = c.new_sequences(1)
        c.append([sid], [2])
        unmapped = [call for call in log.take() if call[0] == "unmap"]
        assert len(unmapped) == 1
        order.append(unmapped[0][1][0])
    assert order == [0, 1, 2, 3]  # physical pages in stamp order (a v0, b v0, a v1, b v1)
    assert cache_only(a) == cache_only(b) == []


@BOTH
def test_a_fourth_sibling_with_a_newer_page_is_not_asked(kind):
    """Four managers: the newest cache-only page (``d``'s) stays when older ones cover the call."""
    log = Log()
    pool, a, b, c = setup_three(kind, log, pool_pages=5)
    make = kvnumba.BlockManager if kind == "kernels" else ReferenceBlockManager
    d = make(
        4, 1, page_pool=pool, blocks_per_page=2, max_seqs=4, max_seq_len=8, on_evict=log.evict("d")
    )
    d.release(d.admit([7, 7], [2]).ids)  # stamp 5 on the last free pool page
    log.take()
    (sid,) = c.new_sequences(1)
    c.append([sid], [4])  # wanted 2: a v0 (1) and b v0 (2), not d v0 (5)
    assert [call[:2] for call in log.take() if call[0] == "evict"] == [
        ("evict", "a"),
        ("evict", "b"),
    ]
    assert cache_only(d) == [(0, 5)]
    assert owners(pool, [a, b, c, d])[4] == (3, 0)


def test_kernels_and_reference_agree_on_the_owner_table_after_reclaims():
    """Both sides, driven alike through a sequence of reclaims, keep the same page owners."""
    logs = [Log(), Log()]
    sides = [
        setup_three(kind, log) for kind, log in zip(("kernels", "reference"), logs, strict=True)
    ]
    for counts in ([1], [3], [2], [1]):
        seen = []
        for (pool, a, b, c), log in zip(sides, logs, strict=True):
            (sid,) = c.new_sequences(1)
            ok = c.can_append([sid], counts)
            if ok:
                c.append([sid], counts)
            seen.append((ok, owners(pool, [a, b, c]), cache_only(a), cache_only(b), log.take()))
        assert seen[0] == seen[1]
    assert np.array_equal(sides[0][3].mapped_pages(), sides[1][3].mapped_pages())
