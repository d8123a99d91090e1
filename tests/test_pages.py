"""PagePool in one process: all-or-nothing mapping, accounting, callbacks, the kernel helpers'
undo property, owner records, reclaim of dead owners and a stateful model test."""

from __future__ import annotations

import os
import pickle
import time
import uuid

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from numba import njit

import kvnumba
from kvnumba import PagePool, PoolExhausted
from kvnumba._kernels import physical_pages as K
from kvnumba.pages.pool import process_start_time


def same(before, after) -> None:
    """Assert two PoolState snapshots are byte-identical."""
    for name in before._fields:
        x, y = getattr(before, name), getattr(after, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), f"pool field {name} changed"


def nonexistent_pid() -> int:
    """A pid with no process (above every running one and below pid_max)."""
    pid = max(int(p) for p in os.listdir("/proc") if p.isdigit()) + 1000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.fixture
def pool():
    return PagePool(8)


# --- construction ---------------------------------------------------------------------------------


def test_lazy_export_and_geometry():
    assert kvnumba.PagePool is PagePool
    pool = PagePool(5)
    assert pool.num_pages == 5 and pool.num_free == 5 and pool.num_mapped == 0
    assert not pool.is_shared and pool.name is None
    pool.check()
    for bad in (0, -1):
        with pytest.raises(kvnumba.InvalidGeometry):
            PagePool(bad)
    with pytest.raises(ValueError):
        PagePool(True)
    with pytest.raises(kvnumba.InvalidGeometry):
        PagePool(2.0)


def test_client_tokens_are_distinct(pool):
    tokens = [pool.register_client() for _ in range(4)]
    assert tokens == [1, 2, 3, 4]


# --- map / unmap ----------------------------------------------------------------------------------


def test_map_takes_pages_in_order_and_records_owner(pool):
    a, b = pool.register_client(), pool.register_client()
    assert pool.map_pages(a, [10, 11]).tolist() == [0, 1]
    assert pool.map_pages(b, np.array([5], dtype=np.int32)).tolist() == [2]
    assert pool.num_free == 5 and pool.num_mapped == 3
    me = (os.getpid(), process_start_time(os.getpid()))
    assert pool.owner_of(0) == (a, *me, 10)
    assert pool.owner_of(1) == (a, *me, 11)
    assert pool.owner_of(2) == (b, *me, 5)
    assert pool.owner_of(3) is None
    assert pool.pages_of(a).tolist() == [0, 1]
    assert pool.pages_of(b).tolist() == [2]
    with pytest.raises(IndexError):
        pool.owner_of(8)
    pool.check()


def test_map_all_or_nothing(pool):
    a, b = pool.register_client(), pool.register_client()
    pool.map_pages(a, np.arange(5))
    before = pool.snapshot()
    with pytest.raises(PoolExhausted) as info:
        pool.map_pages(b, [1, 2, 3, 4])
    assert (info.value.needed, info.value.available) == (4, 3)
    assert isinstance(info.value, kvnumba.KVNumbaError)
    same(before, pool.snapshot())
    assert pool.pages_of(b).size == 0
    assert pool.map_pages(b, [1, 2, 3]).size == 3
    assert pool.num_free == 0
    with pytest.raises(PoolExhausted) as info:
        pool.map_pages(a, [9])
    assert (info.value.needed, info.value.available) == (1, 0)
    pool.check()


def test_bad_input_changes_nothing(pool):
    a = pool.register_client()
    b = pool.register_client()
    held = pool.map_pages(a, [0, 1, 2])
    before = pool.snapshot()
    cases = [
        (lambda: pool.map_pages(99, [1]), ValueError),
        (lambda: pool.map_pages(0, [1]), ValueError),
        (lambda: pool.map_pages(a, [1, -1]), ValueError),
        (lambda: pool.map_pages(a, [1.0]), TypeError),
        (lambda: pool.map_pages(a, [[1]]), ValueError),
        (lambda: pool.map_pages("a", [1]), TypeError),
        (lambda: pool.unmap_pages(a, [held[0], 8]), ValueError),
        (lambda: pool.unmap_pages(a, [held[0], -1]), ValueError),
        (lambda: pool.unmap_pages(a, [held[0], held[1], held[0]]), ValueError),
        (lambda: pool.unmap_pages(b, [held[0]]), ValueError),
        (lambda: pool.unmap_pages(a, [held[0], 5]), ValueError),  # 5 is free
        (lambda: pool.unmap_pages(42, [held[0]]), ValueError),
    ]
    for call, exc in cases:
        with pytest.raises(exc):
            call()
        same(before, pool.snapshot())
    pool.check()


def test_unmap_returns_pages_and_accounting(pool):
    a = pool.register_client()
    phys = pool.map_pages(a, [4, 5, 6, 7])
    assert pool.num_free + pool.num_mapped == pool.num_pages
    virtual = pool.unmap_pages(a, phys[[2, 0]])
    assert virtual.tolist() == [6, 4]
    assert pool.num_free == 6
    assert pool.pages_of(a).tolist() == sorted(phys[[1, 3]].tolist())
    assert pool.owner_of(int(phys[2])) is None
    # The page given back last is taken first (LIFO), then the other one.
    assert pool.map_pages(a, [8, 9]).tolist() == [phys[0], phys[2]]
    assert pool.unmap_pages(a, []).size == 0
    stats = pool.stats()
    assert stats["maps"] == 6 and stats["unmaps"] == 2 and stats["mapped"] == 4
    pool.check()


def test_many_pages_round_trip():
    pool = PagePool(1000)
    clients = [pool.register_client() for _ in range(3)]
    held = [pool.map_pages(c, np.arange(300) + 1000 * i) for i, c in enumerate(clients)]
    all_pages = np.concatenate(held)
    assert np.unique(all_pages).size == 900
    for c, pages in zip(clients, held, strict=True):
        pool.unmap_pages(c, pages[::-1])
    assert pool.num_free == 1000
    pool.check()


# --- callbacks ------------------------------------------------------------------------------------


def test_callbacks_once_per_call_after_commit():
    events = []
    pool = PagePool(
        6,
        on_map=lambda p, v: events.append(("map", p, v)),
        on_unmap=lambda p, v: events.append(("unmap", p, v)),
    )
    a = pool.register_client()
    phys = pool.map_pages(a, [10, 11, 12])
    assert len(events) == 1
    kind, p, v = events[0]
    assert kind == "map" and p.dtype == np.int64 and v.dtype == np.int64
    assert p.tolist() == phys.tolist() and v.tolist() == [10, 11, 12]
    p[:] = -5  # callers get copies: the pool and the returned array are unaffected
    assert phys.tolist() == [0, 1, 2]
    pool.check()

    events.clear()
    pool.unmap_pages(a, [2, 0])
    assert len(events) == 1
    kind, p, v = events[0]
    assert kind == "unmap" and p.tolist() == [2, 0] and v.tolist() == [12, 10]

    events.clear()
    for call in (
        lambda: pool.map_pages(a, np.arange(10)),  # exhausted
        lambda: pool.unmap_pages(a, [1, 1]),  # duplicate
        lambda: pool.map_pages(a, [-3]),
    ):
        with pytest.raises((PoolExhausted, ValueError)):
            call()
    pool.map_pages(a, [])
    pool.unmap_pages(a, [])
    assert events == []  # no hook for failed or empty calls


def test_deliver_order_unmap_then_map():
    events = []
    pool = PagePool(
        2,
        on_map=lambda p, v: events.append("map"),
        on_unmap=lambda p, v: events.append("unmap"),
    )
    one = np.array([1], dtype=np.int64)
    pool.deliver(mapped=(one, one), unmapped=(one, one))
    pool.deliver(mapped=(one[:0], one[:0]))
    assert events == ["unmap", "map"]


# --- kernel helpers -------------------------------------------------------------------------------


@njit(cache=True)
def _take_then_give(arena, me, virtual, k_give):
    """Take ``len(virtual)`` pages, give the last ``k_give`` back in reverse order."""
    head, free, owner = K.pool_views(arena)
    taken = np.empty(virtual.shape[0], dtype=np.int64)
    for i in range(virtual.shape[0]):
        taken[i] = K.pool_take(head, free, owner, me, virtual[i])
    for i in range(virtual.shape[0] - 1, virtual.shape[0] - 1 - k_give, -1):
        if taken[i] >= 0:
            K.pool_give(head, free, owner, taken[i])
    return taken


def test_take_give_reverse_order_is_byte_identical():
    pool = PagePool(16)
    a, b = pool.register_client(), pool.register_client()
    # A stack that is not in its initial order: interleaved maps and unmaps.
    pa = pool.map_pages(a, np.arange(6))
    pb = pool.map_pages(b, np.arange(4))
    pool.unmap_pages(a, pa[[4, 1, 3]])
    pool.unmap_pages(b, pb[[2]])
    before = pool.snapshot()
    me = pool.identity(a)
    taken = _take_then_give(pool.arena, me, np.arange(100, 108), 8)
    assert (taken >= 0).all() and np.unique(taken).size == 8
    same(before, pool.snapshot())
    # More than available: the takes past the end return -1 and change nothing.
    taken = _take_then_give(pool.arena, me, np.arange(100, 112), 12)
    assert (taken[:10] >= 0).all() and (taken[10:] == -1).all()
    same(before, pool.snapshot())
    # Partial undo: the remaining pages are owned, the rest restored.
    taken = _take_then_give(pool.arena, me, np.arange(100, 105), 2)
    assert pool.num_free == 10 - 3
    for i, p in enumerate(taken[:3]):
        assert pool.owner_of(int(p))[0] == a and pool.owner_of(int(p))[3] == 100 + i
    pool.check()


@njit(_nrt=False)
def _pool_call(arena, op, me, x):
    """One helper call on a pool arena: take for virtual page ``x``, give page ``x``, or tick.
    (Helpers have no Python wrapper, see ``kvnumba._kernels.jit``: tests reach them here.)"""
    head, free, owner = K.pool_views(arena)
    if op == 0:
        return K.pool_take(head, free, owner, me, x)
    if op == 1:
        K.pool_give(head, free, owner, x)
        return -1
    return K.pool_tick(head)


def test_take_give_one_by_one_and_tick():
    pool = PagePool(3)
    a = pool.register_client()
    before = pool.snapshot()
    me = pool.identity(a)
    p = _pool_call(pool.arena, 0, me, 7)
    q = _pool_call(pool.arena, 0, me, 8)
    assert (p, q) == (0, 1) and pool.num_free == 1
    _pool_call(pool.arena, 1, me, q)
    _pool_call(pool.arena, 1, me, p)
    same(before, pool.snapshot())
    ticks = [_pool_call(pool.arena, 2, me, 0) for _ in range(2)]
    assert ticks == [1, 2] and pool.clock == 2


# --- owner records and reclaim --------------------------------------------------------------------


def test_reclaim_dead_owners():
    events = []
    pool = PagePool(10, on_unmap=lambda p, v: events.append(p))
    live, ghost, reused = (pool.register_client() for _ in range(3))
    keep = pool.map_pages(live, [0, 1])
    dead_pages = pool.map_pages(ghost, [0, 1, 2])
    reused_pages = pool.map_pages(reused, [5])
    _, _, owner = K.views_of(pool.arena)
    owner[dead_pages, K.O_PID] = nonexistent_pid()
    # A live pid (ours) with another start time: the pid was reused after the owner died.
    owner[reused_pages, K.O_START] += 1
    pool.check()
    assert pool.num_free == 4
    assert pool.reclaim_dead() == 4
    assert events == []  # those pages were not this process's mappings
    assert pool.num_free == 8
    assert pool.pages_of(ghost).size == 0 and pool.pages_of(reused).size == 0
    assert pool.pages_of(live).tolist() == keep.tolist()
    assert pool.reclaim_dead() == 0
    assert pool.stats()["reclaimed"] == 4
    pool.check()


def test_reclaim_treats_zombie_as_dead():
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(0)
    try:
        for _ in range(200):  # wait until the child has exited (a zombie until reaped)
            if process_start_time(pid) is None:
                break
            time.sleep(0.01)
        assert process_start_time(pid) is None
    finally:
        os.waitpid(pid, 0)


def test_map_reclaims_dead_owners_when_empty():
    pool = PagePool(4)
    ghost, me = pool.register_client(), pool.register_client()
    pages = pool.map_pages(ghost, [0, 1, 2, 3])
    _, _, owner = K.views_of(pool.arena)
    owner[pages, K.O_PID] = nonexistent_pid()
    got = pool.map_pages(me, [9, 9, 9])
    assert got.tolist() == [3, 2, 1]  # reclaimed pages are pushed in ascending order
    assert pool.num_free == 1 and pool.pages_of(ghost).size == 0
    pool.check()


def test_process_start_time():
    start = process_start_time(os.getpid())
    assert isinstance(start, int) and start > 0
    assert process_start_time(os.getpid()) == start
    assert process_start_time(nonexistent_pid()) is None


def test_check_detects_corruption():
    pool = PagePool(4)
    a = pool.register_client()
    pool.map_pages(a, [0, 1])
    head, free, owner = K.views_of(pool.arena)
    saved = owner.copy()
    owner[0, K.O_CLIENT] = -1  # a page neither free nor owned: lost
    with pytest.raises(kvnumba.InvariantViolation, match="page 0"):
        pool.check()
    owner[:] = saved
    free[0] = free[1]  # a page on the stack twice
    with pytest.raises(kvnumba.InvariantViolation, match="twice"):
        pool.check()


def test_private_pool_does_not_pickle_and_closes():
    pool = PagePool(2)
    with pytest.raises(TypeError):
        pickle.dumps(pool)
    pool.unlink()  # no-op for a private pool
    pool.close()
    pool.close()
    assert pool.closed and "closed" in repr(pool)
    with pytest.raises(ValueError, match="closed"):
        _ = pool.num_free
    with pytest.raises(ValueError, match="closed"):
        pool.map_pages(1, [0])


# --- shared memory in one process -----------------------------------------------------------------


def test_shared_attach_in_one_process():
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    events = []
    creator = PagePool.shared(name, 6)
    try:
        other = PagePool.attach(name, on_map=lambda p, v: events.append((p, v)))
        assert other.is_shared and other.name == name and other.num_pages == 6
        a, b = creator.register_client(), other.register_client()
        assert a != b
        pa = creator.map_pages(a, [0, 1])
        pb = other.map_pages(b, [2, 3])
        assert np.intersect1d(pa, pb).size == 0
        assert creator.num_free == other.num_free == 2
        assert len(events) == 1 and events[0][1].tolist() == [2, 3]
        with creator.lock(), creator.lock():  # re-entrant
            assert other.pages_of(a).tolist() == pa.tolist()
        before = creator.snapshot()
        with pytest.raises(PoolExhausted):
            other.map_pages(b, [1, 2, 3])
        same(before, creator.snapshot())
        clone = pickle.loads(pickle.dumps(other))
        assert clone.pages_of(b).tolist() == pb.tolist()
        clone.close()
        other.close()
        creator.check()
        with pytest.raises(FileExistsError):
            PagePool.shared(name, 3)
    finally:
        creator.close()
        creator.unlink()
    with pytest.raises(FileNotFoundError):
        PagePool.attach(name)


# --- stateful model test --------------------------------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """Random map/unmap by several clients against a model of who holds what."""

    NUM_PAGES = 12

    def __init__(self):
        super().__init__()
        self.pool = PagePool(self.NUM_PAGES)
        self.clients = [self.pool.register_client() for _ in range(3)]
        self.held = {c: {} for c in self.clients}  # client -> {physical: virtual}
        self.next_virtual = 0

    @rule(who=st.integers(0, 2), k=st.integers(0, 6))
    def map(self, who, k):
        client = self.clients[who]
        virtual = np.arange(self.next_virtual, self.next_virtual + k)
        self.next_virtual += k
        free = self.NUM_PAGES - sum(len(h) for h in self.held.values())
        if k > free:
            before = self.pool.snapshot()
            with pytest.raises(PoolExhausted) as info:
                self.pool.map_pages(client, virtual)
            assert (info.value.needed, info.value.available) == (k, free)
            same(before, self.pool.snapshot())
            return
        phys = self.pool.map_pages(client, virtual)
        for p, v in zip(phys.tolist(), virtual.tolist(), strict=True):
            for holder in self.held.values():
                assert p not in holder, f"page {p} handed out twice"
            self.held[client][p] = v

    @precondition(lambda self: any(self.held.values()))
    @rule(who=st.integers(0, 2), data=st.data())
    def unmap(self, who, data):
        client = self.clients[who]
        mine = sorted(self.held[client])
        if not mine:
            return
        pick = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=len(mine)))
        virtual = self.pool.unmap_pages(client, pick)
        assert virtual.tolist() == [self.held[client].pop(p) for p in pick]

    @rule(who=st.integers(0, 2), other=st.integers(0, 2), data=st.data())
    def unmap_foreign(self, who, other, data):
        client = self.clients[who]
        foreign = sorted(self.held[self.clients[other]]) if other != who else []
        free = sorted(set(range(self.NUM_PAGES)) - {p for h in self.held.values() for p in h})
        candidates = foreign + free
        if not candidates:
            return
        bad = data.draw(st.sampled_from(candidates))
        before = self.pool.snapshot()
        with pytest.raises(ValueError):
            self.pool.unmap_pages(client, [*sorted(self.held[client]), bad])
        same(before, self.pool.snapshot())

    @invariant()
    def consistent(self):
        self.pool.check()
        owned = [p for h in self.held.values() for p in h]
        assert len(owned) == len(set(owned)), "a page is owned twice"
        assert len(owned) + self.pool.num_free == self.NUM_PAGES
        for client in self.clients:
            assert self.pool.pages_of(client).tolist() == sorted(self.held[client])
            for p, v in self.held[client].items():
                assert self.pool.owner_of(p)[0] == client and self.pool.owner_of(p)[3] == v


TestPoolStateful = PoolMachine.TestCase
