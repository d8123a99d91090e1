"""``check()`` of a manager on a page pool can fail: each page corruption is named.

The tests corrupt the manager's writable arrays (``mgr._arenas.s``) directly, which no public call can
do, and expect the first violated page invariant.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvnumba import BlockManager, InvariantViolation, PagePool
from kvnumba._layout import (
    M_BUCKET_MIN,
    M_CO_COUNT,
    M_CO_TAIL,
    M_FREE_MAPPED,
    M_FREE_TOP,
    M_MAPPED,
    M_VTOP,
)


def paged_manager():
    """Pages 0 and 1 cache-only (0 older), page 2 with two free blocks, pages 3 and 4 unmapped."""
    pool = PagePool(6)
    mgr = BlockManager(20, 1, page_pool=pool, blocks_per_page=4, max_seqs=8)
    for first in (0, 10):
        (s,) = mgr.new_sequences(1)
        mgr.append([s], [4], np.arange(first, first + 4))
        mgr.release([s])
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [2])
    mgr.check()
    assert mgr.mapped_pages().tolist() == [0, 1, 2] and int(mgr._arenas.s.meta[M_VTOP]) == 2
    return mgr


def dup_vstack(s):
    s.vstack[1] = s.vstack[0]


def dirty_unmapped(s):
    s.block_flags[13] = 1  # block 13 lives in unmapped page 3


def foreign_phys(s):
    s.page_phys[2] = 5  # a free physical page


def foreign_free_block(s):
    s.page_head[2] = 0  # block 0 belongs to page 0


def free_count(s):
    s.page_free[2] = 1


def used_count(s):
    s.page_used[2] = 1 + s.page_used[2]


def bucket_link(s):
    s.bucket_prev[2] = 0


def empty_bucket(s):
    s.buckets[2] = -1


def stamps(s):
    s.page_stamp[1] = s.page_stamp[0]


CORRUPTIONS = [
    (dup_vstack, "unmapped-page stack position 1"),
    (dirty_unmapped, "virtual page 3: unmapped"),
    (foreign_phys, "virtual page 2: physical page 5"),
    (foreign_free_block, "virtual page 2: its free list"),
    (free_count, "virtual page 2: free count"),
    (used_count, "virtual page 2: referenced-block count"),
    (bucket_link, "bucket 2: page 2"),
    (empty_bucket, "page buckets hold 0 pages but 1"),
    (stamps, "cache-only list: page 1"),
    (lambda s: s.meta.__setitem__(M_CO_COUNT, 3), "cache-only list holds 2 pages"),
    (lambda s: s.meta.__setitem__(M_VTOP, 9), f"counter {M_VTOP} is 9"),
    (lambda s: s.meta.__setitem__(M_MAPPED, 2), f"counter {M_MAPPED} is 2"),
    (lambda s: s.meta.__setitem__(M_FREE_MAPPED, 5), f"counter {M_FREE_MAPPED} is 5"),
    (lambda s: s.meta.__setitem__(M_CO_TAIL, 0), f"counter {M_CO_TAIL} is 0"),
    (lambda s: s.meta.__setitem__(M_BUCKET_MIN, 3), f"counter {M_BUCKET_MIN} is 3"),
    (lambda s: s.meta.__setitem__(M_FREE_TOP, 1), f"counter {M_FREE_TOP} is 1"),
]


@pytest.mark.parametrize(("corrupt", "message"), CORRUPTIONS)
def test_check_names_the_corrupted_page_invariant(corrupt, message):
    mgr = paged_manager()
    corrupt(mgr._arenas.s)
    with pytest.raises(InvariantViolation, match=message):
        mgr.check()
