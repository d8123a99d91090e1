"""The engine path: one request per call (``append_one``, ``admit_one``) and the keyed
``lookup``, as vLLM's scheduler calls its manager (budget: <= 1 us of kvnumba time for a
one-sequence append or admit). ``AppendDecode`` with ``batch=1`` is the batched call to compare
with."""

import hashlib

import numpy as np

from . import common
from .common import Fresh, ReadOnly

PROMPT_BLOCKS = 8  # a prompt of 8 full blocks plus 5 tokens: 8 keys, 8 hits when cached
PROMPT_TOKENS = PROMPT_BLOCKS * common.BLOCK_SIZE + 5
_counter = 0


def fresh_keys(count: int) -> np.ndarray:
    """``count`` engine keys (sha256 digests) never used before in this process."""
    global _counter
    rows = []
    for _ in range(count):
        _counter += 1
        rows.append(np.frombuffer(hashlib.sha256(b"%d" % _counter).digest(), dtype=np.uint64))
    return np.stack(rows)


def _keyed(key, num_blocks):
    return common.manager(key, num_blocks, block_keys=True, reserved_blocks=1)[0]


class AppendOne(Fresh):
    """``append_one(seq, 1)``: one token into a sequence's partial tail block."""

    params = (common.POOLS,)
    param_names = ("num_blocks",)

    def prepare(self, num_blocks):
        self.mgr = _keyed(("append_one", num_blocks), num_blocks)
        ids = self.to_release = common.sequences(self.mgr, 1, 1)
        self.seq = int(ids[0])

    def time_append_one(self, num_blocks):
        self.mgr.append_one(self.seq, 1)


class AdmitOneHits(Fresh):
    """``admit_one`` of a keyed prompt whose 8 full blocks are all cached (claimed)."""

    params = (common.POOLS,)
    param_names = ("num_blocks",)

    def prepare(self, num_blocks):
        self.mgr = _keyed(("admit_one_hits", num_blocks), num_blocks)
        self.keys = fresh_keys(PROMPT_BLOCKS)
        self.mgr.release(self.mgr.admit(None, [PROMPT_TOKENS], keys=self.keys).ids)
        self.to_release = []

    def time_admit_one_hits(self, num_blocks):
        self.to_release = [self.mgr.admit_one(None, length=PROMPT_TOKENS, keys=self.keys)[0]]


class AdmitOneMiss(Fresh):
    """``admit_one`` of a keyed prompt that misses: 9 blocks allocated, 8 keys registered."""

    params = (common.POOLS,)
    param_names = ("num_blocks",)

    def prepare(self, num_blocks):
        self.mgr = _keyed(("admit_one_miss", num_blocks), num_blocks)
        self.keys = fresh_keys(PROMPT_BLOCKS)
        self.to_release = []

    def time_admit_one_miss(self, num_blocks):
        self.to_release = [self.mgr.admit_one(None, length=PROMPT_TOKENS, keys=self.keys)[0]]

    def teardown(self, num_blocks):
        blocks = self.mgr.block_tables(self.to_release)
        super().teardown(num_blocks)
        self.mgr.evict(blocks[blocks >= 0])  # the prompt's registered blocks: a miss next time


class LookupKeys(ReadOnly):
    """``lookup`` of one keyed prompt whose 8 full blocks are cached (nothing claimed)."""

    params = (common.POOLS,)
    param_names = ("num_blocks",)

    def prepare(self, num_blocks):
        self.mgr = _keyed(("lookup", num_blocks), num_blocks)
        self.keys = fresh_keys(PROMPT_BLOCKS)
        self.mgr.release(self.mgr.admit(None, [PROMPT_TOKENS], keys=self.keys).ids)
        self.lengths = np.array([PROMPT_TOKENS], dtype=np.int64)

    def time_lookup_keys(self, num_blocks):
        self.mgr.lookup(None, self.lengths, keys=self.keys)
