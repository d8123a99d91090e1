"""BlockManagers in several processes on one shared PagePool: no page owned twice, failed calls
change nothing, everything given back, and the pages of a killed process reclaimed.

Children are started with the 'spawn' context and attach to the pool by name, as independent
processes would (see ``test_pages_multiprocess.py``). The parent runs the workers' calls once on
a private pool first, so the numba cache is warm and the children only load the kernels. Each
test uses its own segment name and always unlinks it.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
import traceback
import uuid

import numpy as np
import pytest

from kvnumba import BlockManager, PagePool, PoolExhausted
from kvnumba._kernels import physical_pages as K
from kvnumba._layout import NIL

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc and POSIX shared memory"
)

CTX = mp.get_context("spawn")
NUM_PROCS = 3
NUM_PAGES = 12  # 3 managers x 16 virtual pages compete for 12 physical ones
OPS = 1500
NUM_BLOCKS = 64
BLOCK_SIZE = 4
BLOCKS_PER_PAGE = 4
MAX_SEQS = 32
MAX_LIVE = 10
MAX_LEN = 48  # tokens per sequence the workers grow to at most (max_seq_len is 256)

# Prompts sharing prefixes, so that admit hits the prefix cache.
_BASE = list(range(100, 124))
PROMPTS = [
    _BASE[:9],
    _BASE[:13],
    _BASE[:8] + [7, 7, 7, 7, 7],
    _BASE[:17],
    _BASE[:4] + [9] * 10,
    [5] * 6,
]


def _name() -> str:
    return f"kvn-mgr-mp-{uuid.uuid4().hex[:12]}"


def _manager(pool: PagePool) -> BlockManager:
    return BlockManager(
        NUM_BLOCKS,
        BLOCK_SIZE,
        max_seqs=MAX_SEQS,
        prefix_caching=True,
        page_pool=pool,
        blocks_per_page=BLOCKS_PER_PAGE,
    )


def _same_state(before, after) -> list[str]:
    """Names of the manager state fields that differ between two snapshots."""
    return [
        name
        for name in before._fields
        if getattr(before, name).tobytes() != getattr(after, name).tobytes()
    ]


def _verify_pages(pool: PagePool, mgr: BlockManager) -> list[str]:
    """Under the pool lock: my mapped pages are recorded as mine (client, pid, virtual page),
    no page of the owner table is mine without being mapped by me, none is listed twice."""
    errors = []
    pid = os.getpid()
    with pool.lock():
        phys = mgr.state.page_phys
        virtual = np.flatnonzero(phys != NIL)
        mapped = mgr.mapped_pages()
        owner = pool.state.owner
        rows = owner[mapped].copy()
        mine = np.flatnonzero(owner[:, K.O_CLIENT] == mgr._pages.client)
        del owner
    if np.unique(mapped).size != mapped.size:
        errors.append(f"a physical page is mapped twice: {mapped.tolist()}")
    if mgr.stats().mapped_pages != mapped.size:
        errors.append(f"stats().mapped_pages {mgr.stats().mapped_pages} != {mapped.size}")
    if not (rows[:, K.O_CLIENT] == mgr._pages.client).all() or not (rows[:, K.O_PID] == pid).all():
        errors.append(f"pages {mapped.tolist()} of mine have owner records {rows.tolist()}")
    if rows[:, K.O_VIRTUAL].tolist() != virtual.tolist():
        errors.append(
            f"owner records name virtual pages {rows[:, K.O_VIRTUAL].tolist()}, "
            f"I map {virtual.tolist()}"
        )
    if sorted(mine.tolist()) != sorted(mapped.tolist()):
        errors.append(f"the pool records pages {mine.tolist()} as mine, I map {mapped.tolist()}")
    return errors


def _run_ops(pool: PagePool, mgr: BlockManager, seed: int, ops: int) -> tuple[dict, list[str]]:
    """Random calls on ``mgr``; returns counters and the errors found (stops at the first).

    Every allocating call is atomic; a ``PoolExhausted`` must leave the manager's state (and,
    when the call ran under the pool lock, the pool's too) byte for byte unchanged. Every other
    call holds the pool lock around ``can_append`` + ``append``, whose answers must agree.
    """
    rng = random.Random(seed)
    live: list[int] = []
    counts = {
        "appends": 0,
        "admits": 0,
        "releases": 0,
        "forks": 0,
        "trims": 0,
        "exhausted": 0,
        "hits": 0,
        "max_mapped": 0,
    }
    errors: list[str] = []

    def tokens(n: int) -> np.ndarray:
        return np.array([rng.randrange(8) for _ in range(n)], dtype=np.int64)

    def attempt(call, args, under_lock: bool, expect=None):
        """Run an allocating call; True if it committed, False after a clean PoolExhausted."""
        lock = pool.lock() if under_lock else contextlib.nullcontext()
        with lock:
            before = mgr.snapshot()
            pool_before = pool.snapshot() if under_lock else None
            try:
                result = call(*args)
            except PoolExhausted:
                counts["exhausted"] += 1
                changed = _same_state(before, mgr.snapshot())
                if changed:
                    errors.append(f"PoolExhausted changed manager state fields {changed}")
                if under_lock:
                    after = pool.snapshot()
                    for name in after._fields:
                        if getattr(after, name).tobytes() != getattr(pool_before, name).tobytes():
                            errors.append(f"PoolExhausted changed pool field {name}")
                if expect is True:
                    errors.append("can_append said True, append raised PoolExhausted")
                return None
        if expect is False:
            errors.append("can_append said False, append succeeded")
        return result

    for step in range(ops):
        r = rng.random()
        if live and (len(live) >= MAX_LIVE or r < 0.2):
            # Release a random subset.
            pick = rng.sample(live, rng.randint(1, len(live)))
            mgr.release(pick)
            live = [s for s in live if s not in pick]
            counts["releases"] += 1
        elif r < 0.4:
            # New sequences plus a prefill-like append.
            n = rng.randint(1, 3)
            ids = mgr.new_sequences(n)
            c = np.array([rng.randint(1, 14) for _ in range(n)], dtype=np.int64)
            toks = tokens(int(c.sum()))
            if attempt(mgr.append, (ids, c, toks), rng.random() < 0.5) is None:
                mgr.release(ids)  # empty sequences: holds no block
            else:
                live.extend(ids.tolist())
                counts["appends"] += 1
        elif r < 0.65 and live:
            # Decode-like append to some live sequences, can_append asked first under the lock.
            pick = rng.sample(live, rng.randint(1, len(live)))
            lens = mgr.seq_lens(pick)
            pick = [s for s, n in zip(pick, lens.tolist(), strict=True) if n < MAX_LEN]
            if pick:
                c = np.array([rng.randint(1, 6) for _ in pick], dtype=np.int64)
                toks = tokens(int(c.sum())) if rng.random() < 0.8 else None
                with pool.lock():
                    expect = mgr.can_append(pick, c)
                    if attempt(mgr.append, (pick, c, toks), True, expect) is not None:
                        counts["appends"] += 1
        elif r < 0.85:
            # Admit prompts drawn from a small set (prefix hits).
            chosen = [PROMPTS[rng.randrange(len(PROMPTS))] for _ in range(rng.randint(1, 2))]
            flat = np.array([t for p in chosen for t in p], dtype=np.int64)
            lengths = np.array([len(p) for p in chosen], dtype=np.int64)
            result = attempt(mgr.admit, (flat, lengths), rng.random() < 0.5)
            if result is not None:
                live.extend(result.ids.tolist())
                counts["admits"] += 1
                counts["hits"] += int((result.num_cached_tokens > 0).sum())
        elif r < 0.93 and live and len(live) < MAX_LIVE:
            (child,) = mgr.fork([rng.choice(live)], 1)[0]
            live.append(int(child))
            counts["forks"] += 1
        else:
            mgr.trim()
            counts["trims"] += 1
        mgr.check()
        counts["max_mapped"] = max(counts["max_mapped"], mgr.stats().mapped_pages)
        if step % 3 == 0:
            pool.check()
            errors.extend(_verify_pages(pool, mgr))
        if errors:
            errors.insert(0, f"step {step}")
            break

    # Give everything back.
    if live:
        mgr.release(live)
    mgr.trim()
    mgr.check()
    if mgr.mapped_pages().size or mgr.stats().mapped_pages:
        errors.append(f"still mapped after release + trim: {mgr.mapped_pages().tolist()}")
    if pool.pages_of(mgr._pages.client).size:
        errors.append(f"the pool still records pages {pool.pages_of(mgr._pages.client).tolist()}")
    stats = mgr.stats()
    if stats.used or stats.cached:
        errors.append(f"blocks left after release + trim: {stats}")
    return counts, errors


def _warm() -> None:
    """Run the workers' calls on a private pool (compiles or loads every kernel they use)."""
    pool = PagePool(NUM_PAGES)
    counts, errors = _run_ops(pool, _manager(pool), seed=12345, ops=60)
    assert not errors, errors


def _stress_worker(name: str, seed: int, results, barrier) -> None:
    errors: list[str] = []
    counts: dict = {}
    span = (0.0, 0.0)
    try:
        _warm()  # load the kernels before the race starts
        pool = PagePool.attach(name)
        mgr = _manager(pool)
        barrier.wait(60)  # all children run their calls at the same time
        began = time.monotonic()
        counts, errors = _run_ops(pool, mgr, seed, OPS)
        span = (began, time.monotonic())
        del mgr  # holds a view of the pool's arena
        gc.collect()
        pool.close()
    except Exception:
        errors.append(traceback.format_exc())
    results.put((seed, os.getpid(), counts, span, errors))
    sys.exit(1 if errors else 0)


def _hold_worker(name: str, tokens: int, results) -> None:
    """Build a manager on the shared pool, append ``tokens`` tokens, report, wait to be killed."""
    pool = PagePool.attach(name)
    mgr = _manager(pool)
    ids = mgr.new_sequences(1)
    mgr.append(ids, [tokens])
    mgr.check()
    results.put((mgr._pages.client, os.getpid(), mgr.mapped_pages().tolist()))
    time.sleep(60)


def _get(results, procs, timeout=60.0):
    """One result, failing early if every child died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
    raise AssertionError("a child process did not report (see its stderr)")


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def test_managers_in_processes_share_a_pool():
    _warm()  # fills the numba cache the children load from
    name = _name()
    pool = PagePool.shared(name, NUM_PAGES)
    results = CTX.Queue()
    barrier = CTX.Barrier(NUM_PROCS)
    procs = [
        CTX.Process(target=_stress_worker, args=(name, seed, results, barrier))
        for seed in range(NUM_PROCS)
    ]
    try:
        for p in procs:
            p.start()
        # While the children run, check the whole pool under the lock again and again: every
        # page free exactly once or owned by exactly one client, free + mapped == total.
        # The owner records also name only the workers' clients and pids.
        reports, checks = [], 0
        pids = {p.pid for p in procs}
        deadline = time.monotonic() + 120
        while len(reports) < NUM_PROCS and time.monotonic() < deadline:
            pool.check()
            owner = pool.snapshot().owner
            held = owner[owner[:, K.O_CLIENT] != K.NO_CLIENT]
            assert set(held[:, K.O_CLIENT].tolist()) <= set(range(1, NUM_PROCS + 1))
            assert set(held[:, K.O_PID].tolist()) <= pids
            checks += 1
            try:
                reports.append(results.get(timeout=0.01))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(30)
        assert len(reports) == NUM_PROCS, "a child process did not report"
        for seed, _, _, _, errors in reports:
            assert not errors, f"worker {seed}: " + "\n".join(errors)
        assert [p.exitcode for p in procs] == [0] * NUM_PROCS
        assert checks > 1

        for _, _, counts, _, _ in reports:
            assert counts["appends"] > 20 and counts["admits"] > 20, counts
            assert counts["releases"] > 20 and counts["trims"] > 0, counts
        # The children ran at the same time, competed for pages and hit the prefix cache.
        spans = sorted(span for *_, span, _ in reports)
        assert all(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
        assert sum(counts["exhausted"] for _, _, counts, _, _ in reports) > 0
        assert sum(counts["hits"] for _, _, counts, _, _ in reports) > 0
        assert max(counts["max_mapped"] for _, _, counts, _, _ in reports) > 1

        # Everything was given back: free + mapped == total with nothing mapped.
        pool.check()
        assert pool.num_free == pool.num_pages == NUM_PAGES
        owner = pool.snapshot().owner
        assert (owner[:, K.O_CLIENT] == K.NO_CLIENT).all()
        stats = pool.stats()
        assert stats["maps"] == stats["unmaps"] > 0
        assert stats["clients"] == NUM_PROCS
        assert pool.reclaim_dead() == 0
    finally:
        _stop(procs)
        pool.close()
        pool.unlink()


def test_logged_admit_on_a_small_pool_raises_pool_exhausted():
    """The stress test's first failure, minimised (one process): an atomic admit of several
    prompts that needs its undo log, on a manager with more virtual pages than the call's blocks,
    must raise PoolExhausted (it grew its scratch without end until MemoryError)."""
    pool = PagePool(1)  # 4 blocks available to the manager
    mgr = _manager(pool)  # 16 virtual pages
    before = mgr.snapshot()
    with pytest.raises(PoolExhausted):
        mgr.admit(np.arange(24), [12, 12])  # 6 blocks > 4 available: logged
    assert not _same_state(before, mgr.snapshot())
    mgr.check()
    pool.check()
    assert pool.num_free == 1


@pytest.mark.parametrize("explicit", [True, False], ids=["reclaim_dead", "on_exhaustion"])
def test_pages_of_a_killed_manager_are_reclaimed(explicit):
    _warm()
    name = _name()
    pool = PagePool.shared(name, 4)
    results = CTX.Queue()
    # 16 blocks of 4 tokens: the child maps all 4 pages of the pool.
    child = CTX.Process(target=_hold_worker, args=(name, 64, results))
    mgr = None
    try:
        child.start()
        client, pid, pages = _get(results, [child])
        assert pid == child.pid and sorted(pages) == [0, 1, 2, 3]
        for p in pages:
            assert pool.owner_of(p)[:2] == (client, pid)
        assert pool.num_free == 0

        # A manager of this process finds the pool empty; the owner is alive, nothing to reclaim.
        mgr = _manager(pool)
        ids = mgr.new_sequences(1)
        before, pool_before = mgr.snapshot(), pool.snapshot()
        with pytest.raises(PoolExhausted):
            mgr.append(ids, [20])
        assert not _same_state(before, mgr.snapshot())
        assert not _same_state(pool_before, pool.snapshot())
        assert pool.reclaim_dead() == 0

        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        # The dead child's pages are still mapped until someone reclaims them.
        assert pool.num_free == 0
        assert pool.pages_of(client).tolist() == sorted(pages)
        pool.check()

        if explicit:
            assert pool.reclaim_dead() == len(pages)
            assert pool.num_free == pool.num_pages
            assert pool.pages_of(client).size == 0
            pool.check()
        # The atomic append finds the pool empty (or not), reclaims the dead child's pages first.
        result = mgr.append(ids, [20], np.arange(20))  # 5 blocks: 2 pages
        assert result.slot_mapping.shape == (20,)
        mgr.check()
        pool.check()
        assert pool.stats()["reclaimed"] == len(pages)
        assert pool.pages_of(client).size == 0
        assert mgr.mapped_pages().size == 2 and set(mgr.mapped_pages().tolist()) <= set(pages)
        assert pool.num_free == pool.num_pages - 2
        for p in mgr.mapped_pages().tolist():
            assert pool.owner_of(p)[:2] == (mgr._pages.client, os.getpid())

        mgr.release(ids)
        mgr.trim()
        mgr.check()
        assert mgr.mapped_pages().size == 0
        assert pool.num_free == pool.num_pages
        pool.check()
    finally:
        _stop([child])
        del mgr
        gc.collect()
        pool.close()
        pool.unlink()
