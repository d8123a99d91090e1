"""The prefix cache: ``admit`` with a full hit and a full miss, and eviction of cached blocks."""

import numpy as np

from . import common
from .common import Fresh

PROMPT = 2 * common.BLOCK_SIZE + 1  # two full blocks to look up, one token to compute


def _prompts(batch):
    """Flat tokens and lengths of ``batch`` distinct prompts never seen before."""
    return common.fresh_tokens(batch * PROMPT), np.full(batch, PROMPT, dtype=np.int64)


class AdmitHit(Fresh):
    """``admit`` of ``batch`` prompts whose two full blocks are all cached (refcount 0)."""

    def prepare(self, batch, num_blocks):
        common.fits(3 * batch, num_blocks)

        def init(mgr):
            prompts = _prompts(batch)
            mgr.release(mgr.admit(*prompts).ids)  # the full blocks stay cached
            return prompts

        self.mgr, self.prompts = common.manager(("hit", batch, num_blocks), num_blocks, init=init)

    def time_admit_hit(self, batch, num_blocks):
        self.to_release = self.mgr.admit(*self.prompts).ids


class AdmitMiss(Fresh):
    """``admit`` of ``batch`` new prompts: every lookup misses, blocks come from the free stack."""

    def prepare(self, batch, num_blocks):
        common.fits(3 * batch, num_blocks)
        self.mgr, _ = common.manager(("miss", batch, num_blocks), num_blocks)
        if self.mgr.stats().free < 3 * batch:
            # Released misses stay cached; start over before a miss would have to evict.
            self.mgr, _ = common.manager(("miss", batch, num_blocks), num_blocks, fresh=True)
        self.prompts = _prompts(batch)

    def time_admit_miss(self, batch, num_blocks):
        self.to_release = self.mgr.admit(*self.prompts).ids


class Evict(Fresh):
    """``append(ids, 16)`` to ``batch`` empty sequences when every block is cached: one
    LRU eviction (hash-table removal, payload scrub) per sequence."""

    def prepare(self, batch, num_blocks):
        common.fits(batch, num_blocks)
        self.mgr, _ = common.manager(
            ("evict", batch, num_blocks),
            num_blocks,
            init=lambda mgr: common.fill_cache(mgr, mgr.stats().free),
        )
        self.ids = self.to_release = self.mgr.new_sequences(batch)
        self.counts = np.full(batch, common.BLOCK_SIZE, dtype=np.int64)

    def time_append_evict(self, batch, num_blocks):
        self.mgr.append(self.ids, self.counts)

    def teardown(self, batch, num_blocks):
        if "mgr" not in vars(self):
            return  # setup skipped this combination
        super().teardown(batch, num_blocks)
        # The released blocks went to the free stack; make them cached again.
        common.fill_cache(self.mgr, self.mgr.stats().free)
