"""Start-up time with a warm numba cache, and state memory per block."""

import subprocess
import sys

from kvnumba.eviction import EVICTION_POLICIES

from . import common
from .common import POOLS

FIRST_CALL = """
import kvnumba
mgr = kvnumba.BlockManager(1024, 16, max_seqs=16, max_seq_len=1024)
ids = mgr.new_sequences(1)
mgr.append(ids, [1])
"""


class ImportAndFirstCall:
    """``import kvnumba`` plus the first batched call, in a new process, numba cache warm."""

    repeat = (5, 10, 30.0)

    def setup(self):
        if common.manager_class().__module__ == "kvnumba.reference":
            raise NotImplementedError("measures BlockManager only")
        # Fill the numba cache first so the timed processes only load it.
        subprocess.run([sys.executable, "-c", FIRST_CALL], check=True)

    def timeraw_import_and_first_call(self):
        return FIRST_CALL


class StateBytes:
    """Bytes of state per block, beyond the token payload and the block tables, per policy."""

    params = (POOLS, list(EVICTION_POLICIES))
    param_names = ("num_blocks", "eviction")
    unit = "bytes/block"

    def setup(self, num_blocks, eviction):
        if common.manager_class().__module__ == "kvnumba.reference":
            raise NotImplementedError("the reference has no state arrays")
        self.mgr = common.manager_class()(
            num_blocks,
            common.BLOCK_SIZE,
            max_seqs=256,
            max_seq_len=common.MAX_SEQ_LEN,
            eviction=eviction,
        )

    def track_state_bytes_per_block(self, num_blocks, eviction):
        state = self.mgr.state
        total = sum(a.nbytes for a in state)
        return (total - state.tokens.nbytes - state.seq_table.nbytes) / num_blocks
