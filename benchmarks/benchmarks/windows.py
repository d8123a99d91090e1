"""Sliding-window attention on the decode path: an ``append`` that also releases the blocks that
left each sequence's window (``docs/windows.md``).

``batch`` sequences of ``tokens`` tokens on a manager with a 256-token window (the suite's
sequences hold at most 1,024 tokens); the timed call appends one token to each, which first
releases the blocks below the window: one block per sequence at 272 tokens (the steady state of
a decode), 47 at 1,008 (the first step after a prefill, which holds every block of its
prompt).
"""

import numpy as np

from . import common
from .common import Fresh

WINDOW = 256


class AppendWindowDecode(Fresh):
    """``append(ids, 1)`` on a sliding-window manager, with the window's release."""

    params = ([1, 256], [272, 1_008])
    param_names = ("batch", "tokens")

    def prepare(self, batch, tokens):
        num_blocks = 65_536
        common.fits(batch * tokens // common.BLOCK_SIZE, num_blocks)
        self.mgr, _ = common.manager(
            ("window-decode", batch, tokens), num_blocks, sliding_window=WINDOW
        )
        self.ids = self.to_release = common.sequences(self.mgr, batch, tokens)
        self.counts = np.ones(batch, dtype=np.int64)

    def time_append_window_decode(self, batch, tokens):
        self.mgr.append(self.ids, self.counts)
