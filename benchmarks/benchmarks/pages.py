"""The page path of two-level allocation: an ``append`` that maps pages, a ``release`` that
unmaps them, a decode step and ``trim``, on managers of a private ``PagePool``.

Every manager here has ``blocks_per_page = 16`` and a pool with one physical page per virtual
page, so only the manager's own blocks limit it. Classes with a ``paged`` parameter run the same
call on a manager without a pool (``paged=False``) for comparison.

As in the rest of the suite (``common.py``) every timed call is a single call between ``setup``
and ``teardown`` (``number = 1``): ``setup`` prepares the state the call needs (for instance,
mapped pages all full, so the call must map new ones) and ``teardown`` undoes what the call did,
so every sample starts from the same state.
"""

import numpy as np

from . import common
from .common import BLOCK_SIZE, MAX_SEQ_LEN, Fresh

BLOCKS_PER_PAGE = 16
PAGE_TOKENS = BLOCKS_PER_PAGE * BLOCK_SIZE  # tokens that fill one page
FULL_PAGES = 4  # pages held full by a resident sequence in the map/unmap benchmarks
MAP_BLOCKS = 1_024
PAGES = (1, 16)
DECODE_BATCH = 256
DECODE_POOLS = (1_024, 65_536)
TRIM_BLOCKS = 8_192
TRIM_PAGES = (1, 16, 256)


def pool_class():
    """``kvnumba.PagePool``, or the reference model's pool with ``KVNUMBA_BENCH_IMPL=reference``."""
    if common.manager_class().__module__ == "kvnumba.reference":
        from kvnumba.reference import ReferencePagePool

        return ReferencePagePool
    from kvnumba import PagePool

    return PagePool


def paged_manager(key, num_blocks: int, paged: bool = True, init=None):
    """The manager of one benchmark and parameter combination, built once per process.

    With ``paged`` it gets a private pool of ``num_blocks / BLOCKS_PER_PAGE`` pages. It is
    exercised (every kernel loaded, scratch in use) and trimmed, so it starts with no page
    mapped; ``init(mgr)`` then builds the base state and returns a payload.

    Returns
    -------
    mgr : BlockManager
    payload : object
    """
    entry = common._MANAGERS.get(key)
    if entry is None:
        kwargs = {}
        if paged:
            pool = pool_class()(num_blocks // BLOCKS_PER_PAGE)
            kwargs = {"page_pool": pool, "blocks_per_page": BLOCKS_PER_PAGE}
        mgr = common.manager_class()(
            num_blocks, BLOCK_SIZE, max_seqs=common.MAX_SEQS, max_seq_len=MAX_SEQ_LEN, **kwargs
        )
        common.exercise(mgr)
        mgr.trim()  # the two cached blocks exercise() leaves: their page goes back
        if paged:
            assert mgr.stats().mapped_pages == 0
        entry = common._MANAGERS[key] = (mgr, init(mgr) if init is not None else None)
    return entry


def _resident(mgr):
    """One sequence holding ``FULL_PAGES`` full pages (no tokens: nothing cached on release)."""
    return common.sequences(mgr, 1, FULL_PAGES * PAGE_TOKENS)


class AppendMapPage(Fresh):
    """``append`` of one page of tokens (16 blocks) to each of ``pages`` empty sequences, when
    every mapped page is full: the call maps ``pages`` new pages.

    ``setup`` creates the empty sequences; ``teardown`` releases them, which frees their blocks
    and unmaps their pages again.
    """

    params = (PAGES, (True, False))
    param_names = ("pages", "paged")

    def prepare(self, pages, paged):
        self.mgr, _ = paged_manager(("map", pages, paged), MAP_BLOCKS, paged, init=_resident)
        if paged:
            assert self.mgr.stats().mapped_pages == FULL_PAGES  # all full, none partly free
        self.ids = self.to_release = self.mgr.new_sequences(pages)
        self.counts = np.full(pages, PAGE_TOKENS, dtype=np.int64)

    def time_append_map_page(self, pages, paged):
        self.mgr.append(self.ids, self.counts)


class ReleaseUnmapPage(Fresh):
    """``release`` of ``pages`` sequences holding one full page each (16 blocks, no tokens): the
    call frees the blocks and unmaps ``pages`` pages.

    ``setup`` builds the sequences again for every sample; ``teardown`` has nothing to undo.
    """

    params = (PAGES, (True, False))
    param_names = ("pages", "paged")

    def prepare(self, pages, paged):
        self.mgr, _ = paged_manager(("unmap", pages, paged), MAP_BLOCKS, paged, init=_resident)
        self.ids = common.sequences(self.mgr, pages, PAGE_TOKENS)
        if paged:
            assert self.mgr.stats().mapped_pages == FULL_PAGES + pages

    def time_release_unmap_page(self, pages, paged):
        self.mgr.release(self.ids)


class AppendDecodePaged(Fresh):
    """``append(ids, 1)`` for 256 sequences holding one token each (a decode step into partial
    tails), on a paged manager; compare with ``append.AppendDecode`` (batch 256) and with
    ``paged=False`` here.

    ``setup`` creates the sequences; ``teardown`` releases them (their pages are unmapped).
    """

    params = ((DECODE_BATCH,), DECODE_POOLS, (True, False))
    param_names = ("batch", "num_blocks", "paged")

    def prepare(self, batch, num_blocks, paged):
        common.fits(batch, num_blocks)
        self.mgr, _ = paged_manager(("decode", batch, num_blocks, paged), num_blocks, paged)
        self.ids = self.to_release = common.sequences(self.mgr, batch, 1)
        self.counts = np.ones(batch, dtype=np.int64)

    def time_append_decode_paged(self, batch, num_blocks, paged):
        self.mgr.append(self.ids, self.counts)


class TrimCacheOnly(Fresh):
    """``trim()`` of ``pages`` cache-only pages (16 cached blocks each): every cached block is
    evicted (hash entry removed, payload scrubbed) and every page unmapped.

    ``setup`` fills the pages again for every sample: one admitted prompt of 16 fresh full
    blocks per page, released; ``teardown`` has nothing to undo.
    """

    params = (TRIM_PAGES,)
    param_names = ("pages",)

    def prepare(self, pages):
        common.fits(pages * BLOCKS_PER_PAGE, TRIM_BLOCKS)
        self.mgr, _ = paged_manager(("trim", pages), TRIM_BLOCKS)
        lengths = np.full(pages, PAGE_TOKENS, dtype=np.int64)
        self.mgr.release(self.mgr.admit(common.fresh_tokens(pages * PAGE_TOKENS), lengths).ids)
        stats = self.mgr.stats()
        assert stats.mapped_pages == pages and stats.cached == pages * BLOCKS_PER_PAGE

    def time_trim(self, pages):
        self.mgr.trim()
