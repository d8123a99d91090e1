"""Sequence life cycle: ``new_sequences``, ``fork`` (n = 1, 8) and ``release``."""

import numpy as np

from . import common
from .common import BATCHES, POOLS, Fresh


class NewSequences(Fresh):
    """``new_sequences(batch)``: empty sequences, no block taken."""

    def prepare(self, batch, num_blocks):
        self.mgr, _ = common.manager(("new", batch, num_blocks), num_blocks)

    def time_new_sequences(self, batch, num_blocks):
        self.to_release = self.mgr.new_sequences(batch)


class Fork(Fresh):
    """``fork(ids, n)`` of ``batch`` parents holding 4 blocks each (refcount += n per block)."""

    params = (BATCHES, POOLS, (1, 8))
    param_names = ("batch", "num_blocks", "n")

    def prepare(self, batch, num_blocks, n):
        common.fits(4 * batch, num_blocks)
        self.mgr, _ = common.manager(
            ("fork", batch, num_blocks, n), num_blocks, max_seqs=batch * (n + 1) + 8
        )
        self.parents = common.sequences(self.mgr, batch, 4 * common.BLOCK_SIZE)
        self.to_release = self.parents

    def time_fork(self, batch, num_blocks, n):
        children = self.mgr.fork(self.parents, n)
        self.to_release = np.concatenate([self.parents, children.ravel()])


class Release(Fresh):
    """``release(ids)`` of ``batch`` sequences holding 4 blocks each (back to the free stack)."""

    def prepare(self, batch, num_blocks):
        common.fits(4 * batch, num_blocks)
        self.mgr, _ = common.manager(("release", batch, num_blocks), num_blocks)
        self.ids = common.sequences(self.mgr, batch, 4 * common.BLOCK_SIZE)

    def time_release(self, batch, num_blocks):
        self.mgr.release(self.ids)
