"""PagePool shared by several processes: no page owned twice, nothing lost, dead owners reclaimed.

Children are started with the 'spawn' context and attach to the pool by name, as independent
processes would. Each test uses its own segment name and always unlinks it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
import uuid

import numpy as np
import pytest

from kvnumba import PagePool, PoolExhausted
from kvnumba._kernels import physical_pages as K

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc and POSIX shared memory"
)

CTX = mp.get_context("spawn")
NUM_PAGES = 48
NUM_PROCS = 4
OPS = 600


def _name() -> str:
    return f"kvn-mp-{uuid.uuid4().hex[:12]}"


def _stress_worker(name: str, seed: int, ops: int, results, barrier) -> None:
    """Random map/unmap calls; verifies its own pages in the owner table as it goes."""
    pool = PagePool.attach(name)
    client = pool.register_client()
    pool.map_pages(client, [])  # load the kernels before the race starts
    barrier.wait(30)  # all children run their calls at the same time
    began = time.monotonic()
    pid = os.getpid()
    rng = random.Random(seed)
    held: dict[int, int] = {}  # physical -> virtual
    next_virtual = 0
    errors: list[str] = []
    counts = {"maps": 0, "unmaps": 0, "exhausted": 0}
    for step in range(ops):
        if held and rng.random() < 0.45:
            pick = rng.sample(sorted(held), rng.randint(1, len(held)))
            virtual = pool.unmap_pages(client, pick)
            expected = [held.pop(p) for p in pick]
            if virtual.tolist() != expected:
                errors.append(f"unmap returned {virtual.tolist()}, expected {expected}")
            counts["unmaps"] += 1
        else:
            k = rng.randint(1, 5)
            virtual = np.arange(next_virtual, next_virtual + k)
            next_virtual += k
            try:
                phys = pool.map_pages(client, virtual)
            except PoolExhausted:
                counts["exhausted"] += 1
                continue
            if np.unique(phys).size != k:
                errors.append(f"one map returned a page twice: {phys.tolist()}")
            for p, v in zip(phys.tolist(), virtual.tolist(), strict=True):
                if p in held:
                    errors.append(f"page {p} handed out again while held")
                held[p] = v
            counts["maps"] += 1
        if step % 8 == 0:
            # Another process taking one of my pages would overwrite its owner record.
            owner = pool.snapshot().owner
            for p, v in held.items():
                row = owner[p].tolist()
                if row[K.O_CLIENT] != client or row[K.O_PID] != pid or row[K.O_VIRTUAL] != v:
                    errors.append(f"page {p} held by me has record {row}")
        if errors:
            break
    if pool.pages_of(client).tolist() != sorted(held):
        errors.append("pages_of disagrees with what I hold")
    counts["span"] = (began, time.monotonic())
    results.put((seed, client, pid, sorted(held), counts, errors))
    pool.close()  # exits holding its pages: the parent reclaims them


def _hold_worker(name: str, count: int, results, hold_lock: bool) -> None:
    """Map ``count`` pages (or take the lock), report, then wait to be killed."""
    pool = PagePool.attach(name)
    client = pool.register_client()
    if hold_lock:
        with pool.lock():
            results.put(("locked", os.getpid()))
            time.sleep(60)
    phys = pool.map_pages(client, np.arange(count))
    results.put((client, os.getpid(), phys.tolist()))
    time.sleep(60)


def _get(results, procs, timeout=30.0):
    """One result, failing early if every child died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
    raise AssertionError("a child process did not report (see its stderr)")


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def test_processes_never_share_a_page():
    name = _name()
    pool = PagePool.shared(name, NUM_PAGES)
    results = CTX.Queue()
    barrier = CTX.Barrier(NUM_PROCS)
    procs = [
        CTX.Process(target=_stress_worker, args=(name, seed, OPS, results, barrier))
        for seed in range(NUM_PROCS)
    ]
    try:
        for p in procs:
            p.start()
        # While the children run, check the whole pool under the lock again and again: every
        # page free exactly once or owned by exactly one client, free + mapped == total.
        reports, checks = [], 0
        while len(reports) < NUM_PROCS:
            pool.check()
            checks += 1
            try:
                reports.append(results.get(timeout=0.01))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(30)
        assert len(reports) == NUM_PROCS, "a child process did not report"
        assert checks > 1
        for seed, _, _, _, counts, errors in reports:
            assert not errors, f"worker {seed}: {errors}"
            assert counts["maps"] > 50 and counts["unmaps"] > 50, counts
        # The children really ran at the same time, and competed for pages.
        spans = sorted(counts["span"] for *_, counts, _ in reports)
        assert all(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert sum(counts["exhausted"] for *_, counts, _ in reports) > 0

        # The union of what the children hold is disjoint and is exactly the mapped pages.
        pool.check()
        final = [set(held) for _, _, _, held, _, _ in reports]
        union = set().union(*final)
        assert sum(len(h) for h in final) == len(union), "a page is held by two processes"
        head, _, owner = pool.snapshot()
        mapped = set(np.flatnonzero(owner[:, K.O_CLIENT] != K.NO_CLIENT).tolist())
        assert mapped == union
        for _, client, pid, held, _, _ in reports:
            assert pool.pages_of(client).tolist() == held
            assert (owner[held, K.O_PID] == pid).all()
        assert pool.num_free + len(union) == NUM_PAGES
        stats = pool.stats()
        assert stats["maps"] - stats["unmaps"] == len(union)

        # The children have exited: their pages are reclaimable, and nothing else is.
        assert pool.reclaim_dead() == len(union)
        assert pool.num_free == NUM_PAGES
        pool.check()
    finally:
        _stop(procs)
        pool.close()
        pool.unlink()


def test_killed_process_pages_are_reclaimed():
    name = _name()
    pool = PagePool.shared(name, 8)
    results = CTX.Queue()
    child = CTX.Process(target=_hold_worker, args=(name, 5, results, False))
    try:
        child.start()
        client, pid, pages = _get(results, [child])
        assert pid == child.pid and len(pages) == 5
        for p in pages:
            assert pool.owner_of(p)[:2] == (client, pid)
        me = pool.register_client()
        mine = pool.map_pages(me, [0, 1, 2])
        assert pool.num_free == 0
        assert pool.reclaim_dead() == 0  # the owner is alive
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        # The pool is empty: this map reclaims the dead child's pages first.
        got = pool.map_pages(me, [3, 4])
        assert set(got.tolist()) <= set(pages)
        assert pool.stats()["reclaimed"] == 5
        assert pool.num_free == 3 and pool.pages_of(client).size == 0
        assert pool.pages_of(me).tolist() == sorted([*mine.tolist(), *got.tolist()])
        pool.check()
    finally:
        _stop([child])
        pool.close()
        pool.unlink()


def test_lock_of_a_killed_process_is_released():
    name = _name()
    pool = PagePool.shared(name, 4)
    results = CTX.Queue()
    child = CTX.Process(target=_hold_worker, args=(name, 1, results, True))
    try:
        child.start()
        assert _get(results, [child]) == ("locked", child.pid)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        me = pool.register_client()  # would block forever if the lock survived its holder
        assert pool.map_pages(me, [0]).tolist() == [0]
        pool.check()
    finally:
        _stop([child])
        pool.close()
        pool.unlink()
