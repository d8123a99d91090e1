"""A page pool left half-written by a process killed inside a pool kernel.

A SIGKILL can land between any two stores of a pool kernel. The states it can leave are written
here directly into a shared pool's arena, as the kernels' store order makes them:

- ``half_taken``: a take popped the free stack and wrote no owner record yet;
- ``client_only``: a take wrote the client token but not the pid;
- ``half_given``: a give pushed the page and had not reset its owner record (a dead owner);
- ``unmap_mark``: an unmap's validation pass flipped the page's client token (``~client``).

``check()`` must name ``reclaim_dead()`` as the repair, ``reclaim_dead()`` must repair every one
of them, and an allocating call (``map_pages``, a manager's ``append`` or ``admit``) that meets
one must repair it itself: when the pool's last lock holder died holding the lock, or when the
pool looks exhausted.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import numpy as np
import pytest

from kvnumba import BlockManager, InvariantViolation, PagePool
from kvnumba._kernels import physical_pages as K

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc and POSIX shared memory"
)

NUM_PAGES = 4
CASES = ["half_taken", "client_only", "half_given", "unmap_mark"]


@pytest.fixture
def pool():
    shared = PagePool.shared(f"kvn-repair-{uuid.uuid4().hex[:12]}", NUM_PAGES)
    yield shared
    shared.close()
    shared.unlink()


def dead_pid() -> int:
    """The pid of a child that was forked and reaped (no process has it now)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def die_holding_the_lock(pool: PagePool) -> int:
    """Fork a child that takes the pool's lock and is SIGKILLed while it holds it; its pid."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            with pool.lock():
                os.write(write, b"x")
                time.sleep(60)
        finally:
            os._exit(1)
    os.close(write)
    assert os.read(read, 1) == b"x"
    os.close(read)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return pid


def tear(pool: PagePool, case: str, client: int) -> int:
    """Write the half-done state ``case`` into ``pool``'s arena; returns the page concerned.

    ``client`` is a token of this pool; ``half_given`` and ``unmap_mark`` map a page for it first.
    """
    head, free, owner = K.views_of(pool.arena)
    if case in ("half_taken", "client_only"):
        top = int(head[K.H_FREE_TOP]) - 1
        page = int(free[top])
        head[K.H_FREE_TOP] = top  # popped ...
        if case == "client_only":
            owner[page, K.O_CLIENT] = client  # ... and killed before the pid was written
        return page
    (page,) = pool.map_pages(client, [7]).tolist()
    if case == "half_given":
        # The owner died; its give pushed the page and was killed before the record reset.
        owner[page, K.O_PID] = dead_pid()
        top = int(head[K.H_FREE_TOP])
        free[top] = page
        head[K.H_FREE_TOP] = top + 1
    else:
        owner[page, K.O_CLIENT] = ~client  # the unmap's mark, never undone
    return page


def accounted(pool: PagePool) -> None:
    """``check()`` passes and every page is free or owned, once."""
    pool.check()
    owned = (pool.snapshot().owner[:, K.O_CLIENT] != K.NO_CLIENT).sum()
    assert pool.num_free + owned == pool.num_pages


@pytest.mark.parametrize("case", CASES)
def test_check_names_reclaim_dead_which_repairs_it(pool, case):
    client = pool.register_client()
    page = tear(pool, case, client)
    with pytest.raises(InvariantViolation, match=r"reclaim_dead\(\) repairs"):
        pool.check()
    freed = pool.reclaim_dead()
    accounted(pool)
    if case == "unmap_mark":
        # The page's owner (this process) is alive: it gets its page back, unmarked.
        assert freed == 0
        assert pool.owner_of(page)[:2] == (client, os.getpid())
        assert pool.pages_of(client).tolist() == [page]
    else:
        assert freed == 1
        assert pool.owner_of(page) is None
        assert pool.num_free == NUM_PAGES
        assert pool.stats()["reclaimed"] == 1
    assert pool.reclaim_dead() == 0  # nothing left to repair
    accounted(pool)


def test_repair_of_a_sound_pool_changes_nothing(pool):
    client = pool.register_client()
    pool.map_pages(client, [3, 4])
    pool.unmap_pages(client, pool.pages_of(client)[:1])
    before = pool.snapshot()
    assert pool.reclaim_dead() == 0
    after = pool.snapshot()
    for name in before._fields:
        assert getattr(before, name).tobytes() == getattr(after, name).tobytes(), name


def paged_manager(pool: PagePool) -> BlockManager:
    """A manager with as many virtual pages (of 2 blocks of 2 tokens) as the pool has pages."""
    return BlockManager(2 * NUM_PAGES, 2, max_seqs=4, page_pool=pool, blocks_per_page=2)


def allocate(pool: PagePool, how: str, mgr: BlockManager, client: int, pages: int) -> None:
    """An allocating call of ``how`` that needs ``pages`` pages of the pool."""
    if how == "map_pages":
        assert pool.map_pages(client, np.arange(pages)).shape == (pages,)
    elif how == "append":
        result = mgr.append(mgr.new_sequences(1), [4 * pages])
        assert result.slot_mapping.shape == (4 * pages,)
    else:
        result = mgr.admit(np.arange(4 * pages), [4 * pages])
        assert result.ok.all()
    if how != "map_pages":
        mgr.check()
        assert mgr.mapped_pages().size == pages


@pytest.mark.parametrize("how", ["map_pages", "append", "admit"])
@pytest.mark.parametrize("case", ["half_taken", "client_only", "unmap_mark"])
def test_a_call_after_a_holder_died_repairs_first(pool, case, how):
    """The last lock holder was killed inside a kernel: the next allocating call repairs the
    pool before it takes a page, even when the pool has enough free pages for it."""
    mgr = paged_manager(pool)
    client = pool.register_client()
    page = tear(pool, case, client)
    holder = die_holding_the_lock(pool)  # as if it had written the torn state and been killed
    with pytest.raises(InvariantViolation, match=rf"process {holder} died holding"):
        pool.check()
    allocate(pool, how, mgr, mgr._pages.client if how != "map_pages" else client, 1)
    accounted(pool)
    if case == "unmap_mark":
        assert pool.owner_of(page)[:2] == (client, os.getpid())
    else:
        assert pool.num_free == NUM_PAGES - 1  # the torn page is free again


@pytest.mark.parametrize("how", ["map_pages", "append", "admit"])
@pytest.mark.parametrize("case", ["half_taken", "client_only"])
def test_an_exhausted_call_repairs_and_succeeds(pool, case, how):
    """The call needs every page of the pool, one of which a torn take lost: it repairs the
    pool (no dead lock holder is known) and succeeds."""
    mgr = paged_manager(pool)
    client = pool.register_client()
    tear(pool, case, client)
    allocate(pool, how, mgr, mgr._pages.client if how != "map_pages" else client, NUM_PAGES)
    accounted(pool)
    assert pool.num_free == 0


def test_no_repair_while_the_holder_lives(pool):
    """A lock holder that is alive leaves nothing to repair: its pages stay its own."""
    client = pool.register_client()
    pages = pool.map_pages(client, [0, 1]).tolist()
    with pool.lock():
        assert pool.reclaim_dead() == 0
    assert pool.pages_of(client).tolist() == sorted(pages)
    accounted(pool)
