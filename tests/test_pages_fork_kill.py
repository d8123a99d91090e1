"""Forked children and SIGKILLed processes on one shared PagePool.

- A manager (and a pool object) used in a forked child stamps the child's own pid and start
  time on the pages it maps, so that when the parent ends ``reclaim_dead()`` leaves them alone.
- Processes looping on ``append``/``admit``/``release`` are SIGKILLed mid-call, forked children
  among them; every page ends accounted for: ``check()`` passes after ``reclaim_dead()`` and
  free + owned == total.

Workers are started with the 'spawn' context and attach to the pool by name; they fork their own
children (``os.fork``) before they first use the result queue, so that no child inherits a queue
feeder thread. The test process builds a paged manager first, so the numba cache is warm and the
workers only load the kernels.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import traceback
import uuid

import numpy as np
import pytest
from test_pages_managers_mp import _get  # one result, failing early if every worker died

from kvnumba import BlockManager, InvariantViolation, PagePool, PoolExhausted
from kvnumba._kernels import physical_pages as K
from kvnumba.pages.pool import process_start_time

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc, fork and POSIX shared memory"
)

CTX = mp.get_context("spawn")
BLOCK_SIZE = 4
BLOCKS_PER_PAGE = 2
NUM_BLOCKS = 16  # 8 virtual pages per manager
NUM_PAGES = 16  # shared by five or more managers: the pool runs short now and then
KILLS = 25  # children the killer worker SIGKILLs mid-loop
PROMPTS = [list(range(100, 109)), list(range(100, 113)), [5] * 6]


def _name() -> str:
    return f"kvn-fork-{uuid.uuid4().hex[:12]}"


def _manager(pool: PagePool) -> BlockManager:
    return BlockManager(
        NUM_BLOCKS, BLOCK_SIZE, max_seqs=16, page_pool=pool, blocks_per_page=BLOCKS_PER_PAGE
    )


def _wait_dead(pid: int, start: int | None, timeout: float = 10.0) -> None:
    """Wait until process ``pid`` (started at ``start``) is gone or a zombie (not our child)."""
    deadline = time.monotonic() + timeout
    while process_start_time(pid) == start and start is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not die")
        time.sleep(0.01)


def _kill_pid(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------- a forked child's pages


def _fork_worker(name: str, results) -> None:
    """Map a page of its own, build a manager, fork: the child maps pages with the inherited
    manager and pool object and reports them; this process reports and exits."""
    pool = PagePool.attach(name)
    own = pool.register_client()
    pool.map_pages(own, [0])  # this process's page: it dies with it
    mgr = _manager(pool)
    before = mgr.new_sequences(1)
    mgr.append(before, [BLOCKS_PER_PAGE * BLOCK_SIZE])  # one page mapped before the fork
    loose = pool.register_client()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            ids = mgr.new_sequences(1)
            mgr.append(ids, [3 * BLOCKS_PER_PAGE * BLOCK_SIZE])  # three pages, and the claim
            mgr.check()
            extra = pool.map_pages(loose, [50])  # the pool object, used in the child
            results.put(
                (
                    "child",
                    os.getpid(),
                    mgr._pages.client,
                    mgr.mapped_pages().tolist(),
                    loose,
                    extra.tolist(),
                )
            )
            time.sleep(60)
        finally:
            os._exit(0)
    results.put(("parent", os.getpid(), own))
    # This process ends here, its forked child lives on.


def test_forked_child_stamps_its_own_pid_and_outlives_its_parent():
    _manager(PagePool(1))  # warm the kernel cache for the worker
    name = _name()
    pool = PagePool.shared(name, 8)
    results = CTX.Queue()
    parent = CTX.Process(target=_fork_worker, args=(name, results))
    child_pid = None
    try:
        parent.start()
        reports = dict((r[0], r[1:]) for r in (_get(results, [parent]), _get(results, [parent])))
        # Not join(): the child holds the parent's end of the sentinel pipe join() waits on.
        deadline = time.monotonic() + 30
        while parent.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert parent.exitcode == 0
        child_pid, client, pages, loose, extra = reports["child"]
        parent_pid, own = reports["parent"]
        assert parent_pid == parent.pid and child_pid != parent_pid
        child_start = process_start_time(child_pid)
        assert child_start is not None, "the forked child must outlive its parent"
        assert len(pages) == 4 and len(extra) == 1

        # Every page the child holds records the child, not its (now dead) parent: the three
        # it mapped, and the one its manager mapped before the fork (claimed by its first call).
        for p in pages:
            assert pool.owner_of(p)[:3] == (client, child_pid, child_start)
        assert pool.owner_of(extra[0])[:3] == (loose, child_pid, child_start)

        # The parent's end frees its own page only; the child's stay the child's.
        assert pool.reclaim_dead() == 1
        assert pool.pages_of(own).size == 0
        assert pool.pages_of(client).tolist() == sorted(pages)
        assert pool.pages_of(loose).tolist() == extra
        pool.check()
        assert pool.num_free == 8 - 5

        _kill_pid(child_pid)
        _wait_dead(child_pid, child_start)
        assert pool.reclaim_dead() == 5
        pool.check()
        assert pool.num_free == 8
    finally:
        _kill_pid(child_pid)
        if parent.is_alive():
            parent.kill()
        parent.join(10)
        pool.close()
        pool.unlink()


# ----------------------------------------------------- SIGKILL mid-call, forked children included


def _verify(pool: PagePool, mgr: BlockManager) -> list[str]:
    """Under the pool lock: the pages I map are recorded as mine (client and pid) and no other
    page is recorded as my client's."""
    with pool.lock():
        mapped = mgr.mapped_pages()
        owner = pool.snapshot().owner
    rows = owner[mapped]
    mine = np.flatnonzero(owner[:, K.O_CLIENT] == mgr._pages.client)
    errors = []
    if (
        not (rows[:, K.O_CLIENT] == mgr._pages.client).all()
        or not (rows[:, K.O_PID] == os.getpid()).all()
    ):
        errors.append(f"pid {os.getpid()}: my pages {mapped.tolist()} have records {rows.tolist()}")
    if sorted(mine.tolist()) != sorted(mapped.tolist()):
        errors.append(f"pid {os.getpid()}: the pool records {mine.tolist()}, I map {mapped}")
    return errors


def _churn(pool: PagePool, mgr: BlockManager, rng: random.Random, stop, verify: bool) -> dict:
    """Random atomic append/admit/release calls until ``stop()``; ``errors`` if ``verify``."""
    live: list[int] = []
    counts = {"calls": 0, "exhausted": 0, "errors": []}
    while not stop():
        for _ in range(8):
            r = rng.random()
            try:
                if live and (len(live) >= 6 or r < 0.3):
                    pick = rng.sample(live, rng.randint(1, len(live)))
                    mgr.release(pick)
                    live = [s for s in live if s not in pick]
                elif r < 0.55 and live:
                    pick = rng.sample(live, rng.randint(1, len(live)))
                    lens = mgr.seq_lens(pick)
                    pick = [s for s, n in zip(pick, lens.tolist(), strict=True) if n < 40]
                    if pick:
                        mgr.append(pick, [rng.randint(1, 5) for _ in pick])
                elif r < 0.8:
                    ids = mgr.new_sequences(1)
                    try:
                        mgr.append(ids, [rng.randint(1, 12)], None)
                    except PoolExhausted:
                        mgr.release(ids)
                        raise
                    live.extend(ids.tolist())
                else:
                    prompt = PROMPTS[rng.randrange(len(PROMPTS))]
                    live.extend(mgr.admit(prompt, [len(prompt)]).ids.tolist())
            except PoolExhausted:
                counts["exhausted"] += 1
            counts["calls"] += 1
        if verify:
            mgr.check()
            counts["errors"] += _verify(pool, mgr)
            if counts["errors"]:
                break
    counts["held"] = mgr.mapped_pages().tolist()
    return counts


def _loop_worker(name: str, seed: int, results, stop, fork: bool) -> None:
    """Churn on the pool until ``stop``; with ``fork``, first fork a child that churns with the
    manager built before the fork (this process builds another). Each reports when it starts
    and when it stops, then waits to be killed."""
    role = "looper"
    try:
        pool = PagePool.attach(name)
        mgr = _manager(pool)
        if fork:
            pid = os.fork()
            role = "fork-child" if pid == 0 else "fork-parent"
            if pid:
                mgr = _manager(pool)  # the parent's own; the child keeps the first
        rng = random.Random(f"{seed}-{role}")
        results.put(("ready", role, os.getpid()))
        counts = _churn(pool, mgr, rng, stop.is_set, verify=True)
        results.put(("done", role, os.getpid(), counts))
    except Exception:
        results.put(("done", role, os.getpid(), {"errors": [traceback.format_exc()]}))
    time.sleep(60)
    os._exit(0)


def _killer_worker(name: str, seed: int, results) -> None:
    """Fork ``KILLS`` children that churn with a manager built before the fork and SIGKILL each
    after a random moment; after each kill, an allocating call must leave the pool sound."""
    errors: list[str] = []
    kills = torn = 0
    try:
        pool = PagePool.attach(name)
        base = _manager(pool)  # what the children inherit; never used here
        client = pool.register_client()
        rng = random.Random(seed)
        for i in range(KILLS):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the victim
                os.close(read)
                os.write(write, b"x")
                _churn(pool, base, random.Random(f"{seed}-{i}"), lambda: False, verify=False)
                os._exit(0)
            os.close(write)
            os.read(read, 1)
            os.close(read)
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            kills += 1
            try:
                pool.check()
            except InvariantViolation as exc:  # the victim died inside a pool kernel
                torn += 1
                if "reclaim_dead()" not in str(exc):
                    errors.append(f"check() does not name the repair: {exc}")
            # An allocating call repairs what the victim left (if it died holding the lock).
            try:
                pool.unmap_pages(client, pool.map_pages(client, [i]))
            except PoolExhausted:
                pass
            pool.check()
    except Exception:
        errors.append(traceback.format_exc())
    results.put(("killed", "killer", os.getpid(), {"kills": kills, "torn": torn, "errors": errors}))
    time.sleep(60)
    os._exit(0)


def test_sigkills_mid_call_leave_every_page_accounted_for():
    _manager(PagePool(1))  # warm the kernel cache for the workers
    name = _name()
    pool = PagePool.shared(name, NUM_PAGES)
    results, stop = CTX.Queue(), CTX.Event()
    loopers = [
        CTX.Process(target=_loop_worker, args=(name, 1, results, stop, False)),
        CTX.Process(target=_loop_worker, args=(name, 2, results, stop, True)),
    ]
    killer = CTX.Process(target=_killer_worker, args=(name, 3, results))
    procs = [*loopers, killer]
    pids: dict[str, int] = {}
    began = time.monotonic()
    try:
        for p in procs:
            p.start()
        # The killer's victims die mid-call while the others run; it reports when it is done.
        report = None
        while len(pids) < 3 or report is None:  # looper, fork-parent, fork-child; the killer
            kind, role, pid, *rest = _get(results, procs)
            if kind == "ready":
                pids[role] = pid
            elif kind == "killed":
                report = rest[0]
            else:
                raise AssertionError(f"{role} stopped early: {rest[0]['errors']}")
        starts = {role: process_start_time(pid) for role, pid in pids.items()}
        assert not report["errors"], report["errors"]
        assert report["kills"] == KILLS

        # Now kill two loopers mid-call, one of them the forked child's parent.
        for role in ("looper", "fork-parent"):
            time.sleep(0.2)
            os.kill(pids[role], signal.SIGKILL)
            _wait_dead(pids[role], starts[role])
            pool.reclaim_dead()
            pool.check()
        time.sleep(0.5)  # the forked child goes on after its parent's death and reclaim
        stop.set()
        kind, role, pid, counts = _get(results, procs)
        assert (kind, role, pid) == ("done", "fork-child", pids["fork-child"])
        assert not counts["errors"], counts["errors"]
        assert counts["calls"] > 50

        # Only dead processes' pages were reclaimed: the child's are still its own.
        pool.reclaim_dead()
        pool.check()
        held = counts["held"]
        for p in held:
            assert pool.owner_of(p)[1:3] == (pids["fork-child"], starts["fork-child"])

        # Kill the rest: every page comes back.
        _kill_pid(pids["fork-child"])
        _wait_dead(pids["fork-child"], starts["fork-child"])
        for p in procs:
            p.kill()
            p.join(10)
        pool.reclaim_dead()
        pool.check()
        assert pool.num_free == NUM_PAGES
        owned = (pool.snapshot().owner[:, K.O_CLIENT] != K.NO_CLIENT).sum()
        assert owned == 0
        print(
            f"\n{report['kills']} victims killed ({report['torn']} left the pool torn), "
            f"2 loopers killed, fork child {counts['calls']} calls; "
            f"{time.monotonic() - began:.1f} s"
        )
    finally:
        stop.set()
        _kill_pid(pids.get("fork-child"))
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        pool.close()
        pool.unlink()


def test_sigkill_inside_pool_kernels_is_repaired_by_the_next_call():
    """Forked victims run appends and releases whose kernels map and unmap a thousand pages
    each, so most SIGKILLs land inside a kernel, holding the pool's lock. After each: the next
    allocating call repairs whatever the victim left half-written, and reclaim_dead() gives
    back the rest of its pages."""
    pages = 1024
    name = _name()
    pool = PagePool.shared(name, pages)
    base = BlockManager(pages, 1, max_seqs=2, page_pool=pool, blocks_per_page=1)
    client = pool.register_client()
    rng = random.Random(7)
    kills = lock_deaths = torn = 0
    try:
        for _ in range(40):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the victim
                try:
                    os.close(read)
                    os.write(write, b"x")
                    while True:
                        ids = base.new_sequences(1)
                        base.append(ids, [pages])
                        base.release(ids)
                finally:
                    os._exit(1)
            os.close(write)
            os.read(read, 1)
            os.close(read)
            time.sleep(rng.uniform(0.0, 0.02))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            kills += 1
            try:
                pool.check()
            except InvariantViolation as exc:
                torn += 1
                assert "reclaim_dead() repairs" in str(exc)
            # check() took the lock: it found the victim's pid there if it died holding it.
            lock_deaths += int(pool.snapshot().head[K.H_TORN] == pid)
            pool.unmap_pages(client, pool.map_pages(client, [0]))  # repairs first
            pool.check()
            pool.reclaim_dead()
            pool.check()
            assert pool.num_free == pages
        print(f"\n{kills} kills: {lock_deaths} holding the pool's lock, {torn} left it torn")
        assert lock_deaths > 0
    finally:
        base.close()
        pool.close()
        pool.unlink()
