"""``append`` on its three paths (decode, prefill, copy-on-write) and ``can_append``."""

import numpy as np

from . import common
from .common import Fresh, ReadOnly

PREFILL_TOKENS = 512  # 32 blocks per sequence


class AppendDecode(Fresh):
    """``append(ids, 1)``: one token for each of ``batch`` sequences, into a partial tail."""

    def prepare(self, batch, num_blocks):
        common.fits(batch, num_blocks)
        self.mgr, _ = common.manager(("decode", batch, num_blocks), num_blocks)
        self.ids = self.to_release = common.sequences(self.mgr, batch, 1)
        self.counts = np.ones(batch, dtype=np.int64)

    def time_append_decode(self, batch, num_blocks):
        self.mgr.append(self.ids, self.counts)


class AppendPrefill(Fresh):
    """``append(ids, 512)``: a 32-block prefill for each of ``batch`` empty sequences."""

    def prepare(self, batch, num_blocks):
        common.fits(batch * PREFILL_TOKENS // common.BLOCK_SIZE, num_blocks)
        self.mgr, _ = common.manager(("prefill", batch, num_blocks), num_blocks)
        self.ids = self.to_release = self.mgr.new_sequences(batch)
        self.counts = np.full(batch, PREFILL_TOKENS, dtype=np.int64)

    def time_append_prefill(self, batch, num_blocks):
        self.mgr.append(self.ids, self.counts)


class CopyOnWrite(Fresh):
    """``append(ids, 1)`` to ``batch`` parents whose partial tail a fork shares: one copy each."""

    def prepare(self, batch, num_blocks):
        common.fits(2 * batch, num_blocks)
        self.mgr, _ = common.manager(("cow", batch, num_blocks), num_blocks, max_seqs=2 * batch + 8)
        self.ids = common.sequences(self.mgr, batch, 8)
        children = self.mgr.fork(self.ids, 1)
        self.to_release = np.concatenate([self.ids, children.ravel()])
        self.counts = np.ones(batch, dtype=np.int64)

    def time_append_cow(self, batch, num_blocks):
        self.mgr.append(self.ids, self.counts)


class CanAppend(ReadOnly):
    """``can_append(ids, 1)`` for ``batch`` sequences (validation plus capacity count)."""

    def prepare(self, batch, num_blocks):
        common.fits(batch, num_blocks)
        self.mgr, self.ids = common.manager(
            ("can_append", batch, num_blocks),
            num_blocks,
            init=lambda mgr: common.sequences(mgr, batch, 1),
        )
        self.counts = np.ones(batch, dtype=np.int64)

    def time_can_append(self, batch, num_blocks):
        self.mgr.can_append(self.ids, self.counts)
