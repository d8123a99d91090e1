"""Memory bounds in the constructors: a geometry whose state would not fit is refused with
:class:`~kvnumba.InvalidGeometry` before anything is allocated."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kvnumba
from kvnumba import BlockManager, PagePool


def test_absurd_block_size_is_invalid_geometry():
    with pytest.raises(kvnumba.InvalidGeometry, match="bytes"):
        BlockManager(4, 2**62)


def test_max_state_bytes_bounds_a_normal_geometry():
    with pytest.raises(kvnumba.InvalidGeometry, match=r"needs \d+ bytes.*max_state_bytes"):
        BlockManager(64, 16, max_state_bytes=1000)
    BlockManager(64, 16, max_state_bytes=10**8).check()
    with pytest.raises(kvnumba.InvalidGeometry):
        BlockManager(64, 16, max_state_bytes=0)


def test_absurd_page_count_is_invalid_geometry():
    with pytest.raises(kvnumba.InvalidGeometry, match="bytes"):
        PagePool(2**31 - 2)


def test_huge_block_tables_fail_under_the_address_space_limit():
    # 16 GiB of block tables: in a child process whose address space is bounded, so that a
    # missing check fails the test instead of the machine.
    code = (
        "import resource, kvnumba\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    kvnumba.BlockManager(4, 1, max_seqs=2, max_seq_len=2**31 - 2)\n"
        "except kvnumba.InvalidGeometry as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "RLIMIT_AS" in done.stdout, done.stdout
