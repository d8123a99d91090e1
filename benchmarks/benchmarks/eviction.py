"""Eviction under each policy: the cost of taking ``batch`` blocks when every block is cached.

The state before each timed call: every block of the pool cached, released by prompts of 64
full blocks (so the leaf policies see chains, and every policy has its structure full). The
timed call appends one block's worth of tokens to ``batch`` empty sequences: one eviction per
sequence, chosen by the policy (``docs/eviction.md``). Divide by ``batch`` for the cost of one
eviction.
"""

import numpy as np

from kvnumba.eviction import EVICTION_POLICIES

from . import common
from .common import Fresh


class EvictPerPolicy(Fresh):
    """``append(ids, 16)`` to ``batch`` empty sequences of a full cache, per policy."""

    params = (list(EVICTION_POLICIES), [1, 256, 4096], [1_024, 65_536])
    param_names = ("eviction", "batch", "num_blocks")

    def prepare(self, eviction, batch, num_blocks):
        common.fits(batch, num_blocks)
        self.mgr, _ = common.manager(
            ("evict-policy", eviction, batch, num_blocks),
            num_blocks,
            init=lambda mgr: common.fill_cache(mgr, mgr.stats().free),
            eviction=eviction,
        )
        self.ids = self.to_release = self.mgr.new_sequences(batch)
        self.counts = np.full(batch, common.BLOCK_SIZE, dtype=np.int64)

    def time_append_evict(self, eviction, batch, num_blocks):
        self.mgr.append(self.ids, self.counts)

    def teardown(self, eviction, batch, num_blocks):
        if "mgr" not in vars(self):
            return  # setup skipped this combination
        super().teardown(eviction, batch, num_blocks)
        # The released blocks went to the free stack; make them cached again.
        common.fill_cache(self.mgr, self.mgr.stats().free)
