"""Cold compile cost: what a new user's first run, an image build or a CI run pays once.

Each measurement runs a fresh process with an empty ``NUMBA_CACHE_DIR`` and reads its CPU time
and peak memory from ``getrusage``. ``setup_cache`` runs the two processes once per benchmark
run; the ``track_*`` methods report their numbers, so a regression in compile time shows up
like any other benchmark.
"""

import os
import resource
import subprocess
import sys
import tempfile

from . import common

# The README's quick start (the six kernels a first program compiles).
QUICK_START = """
import numpy as np
import kvnumba

mgr = kvnumba.BlockManager(num_blocks=1024, block_size=16)
ids = mgr.new_sequences(2)
res = mgr.append(ids, [20, 5], tokens=np.arange(25))
kids = mgr.fork(ids[:1], n=3)
res = mgr.append(kids[0], [1, 1, 1], tokens=[7, 8, 9])
mgr.block_tables(kids[0])
mgr.release(np.concatenate([ids, kids[0]]))
hit = mgr.admit(np.arange(25), [25])
mgr.stats()
"""


def _cold(args: list[str]) -> tuple[float, float]:
    """CPU seconds and peak MB of ``python args...`` with an empty numba cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, after.ru_maxrss / 1024  # peak of the largest child so far (kB on Linux)


class ColdCompile:
    """CPU seconds and peak memory of a first run on an empty numba cache."""

    timeout = 900
    repeat = 1
    number = 1

    def setup_cache(self):
        if common.manager_class().__module__ == "kvnumba.reference":
            return None
        quick_cpu, quick_mb = _cold(["-c", QUICK_START])
        all_cpu, all_mb = _cold(["-m", "kvnumba", "compile"])
        return {"quick_cpu": quick_cpu, "quick_mb": quick_mb, "all_cpu": all_cpu, "all_mb": all_mb}

    def setup(self, measured):
        if measured is None:
            raise NotImplementedError("measures BlockManager only")

    def track_quick_start_cpu(self, measured):
        return measured["quick_cpu"]

    track_quick_start_cpu.unit = "CPU seconds"

    def track_quick_start_peak_memory(self, measured):
        return measured["quick_mb"]

    track_quick_start_peak_memory.unit = "MB"

    def track_all_kernels_cpu(self, measured):
        return measured["all_cpu"]

    track_all_kernels_cpu.unit = "CPU seconds"
