"""Read-only calls: ``block_tables`` and ``check``."""

from . import common
from .common import ReadOnly


def _sequences(batch):
    return lambda mgr: common.sequences(mgr, batch, 4 * common.BLOCK_SIZE)


class BlockTables(ReadOnly):
    """``block_tables(ids)`` of ``batch`` sequences holding 4 blocks each."""

    def prepare(self, batch, num_blocks):
        common.fits(4 * batch, num_blocks)
        self.mgr, self.ids = common.manager(
            ("tables", batch, num_blocks), num_blocks, init=_sequences(batch)
        )

    def time_block_tables(self, batch, num_blocks):
        self.mgr.block_tables(self.ids)


class Check(ReadOnly):
    """``check()``: the full invariant scan, ``batch`` live sequences of 4 blocks each."""

    def prepare(self, batch, num_blocks):
        common.fits(4 * batch, num_blocks)
        self.mgr, _ = common.manager(
            ("check", batch, num_blocks), num_blocks, init=_sequences(batch)
        )

    def time_check(self, batch, num_blocks):
        self.mgr.check()
