"""Holes of issue 10: raising callbacks keep the call's result, shared pool names, callback and
memory checks in constructors, and small input gaps."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import kvnumba
from kvnumba import BlockManager, CallbackError, PagePool


class Boom(Exception):
    """The exception the test callbacks raise."""


def raiser(calls: list, tag: str):
    """A callback that records its call and raises ``Boom(tag)``."""

    def callback(*args):
        calls.append(tag)
        raise Boom(tag)

    return callback


def fill_cache(mgr: BlockManager) -> None:
    """Leave every block of ``mgr`` cached (released full blocks with known content)."""
    block_size = mgr.block_size
    n = mgr.num_blocks * block_size
    (seq,) = mgr.admit(np.arange(n), [n]).ids
    mgr.release([seq])
    assert mgr.stats().cached == mgr.num_blocks


# ----------------------------------------------------------------- hole 1: CallbackError


def test_callback_error_is_a_kvnumba_error():
    assert issubclass(CallbackError, kvnumba.KVNumbaError)
    assert "CallbackError" in kvnumba.__all__


def test_on_evict_raising_in_admit_keeps_the_new_ids():
    calls: list = []
    mgr = BlockManager(4, 2, max_seqs=4, on_evict=raiser(calls, "evict"))
    fill_cache(mgr)
    with pytest.raises(CallbackError) as info:
        mgr.admit([100, 101, 102, 103, 104], [3, 2])
    assert calls == ["evict"]
    assert isinstance(info.value.__cause__, Boom)
    result = info.value.result
    assert isinstance(result, kvnumba.AdmitResult)
    assert result.ids.shape == (2,) and (result.ids >= 0).all()
    assert mgr.seq_lens(result.ids).tolist() == [3, 2]
    mgr.check()
    mgr.release(result.ids)
    mgr.check()


def test_on_evict_raising_in_append_keeps_the_result():
    calls: list = []
    mgr = BlockManager(2, 2, max_seqs=4, on_evict=raiser(calls, "evict"))
    fill_cache(mgr)
    (seq,) = mgr.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        mgr.append([seq], [3], [7, 8, 9])
    assert calls == ["evict"]
    assert isinstance(info.value.result, kvnumba.AppendResult)
    assert info.value.result.slot_mapping.shape == (3,)
    assert mgr.seq_lens([seq]).tolist() == [3]
    mgr.check()


def test_on_map_raising_in_a_paged_append():
    calls: list = []
    pool = PagePool(4, on_map=raiser(calls, "map"))
    mgr = BlockManager(8, 1, page_pool=pool, blocks_per_page=2, max_seqs=4)
    (seq,) = mgr.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        mgr.append([seq], [3], [1, 2, 3])
    assert calls == ["map"]
    assert isinstance(info.value.__cause__, Boom)
    assert isinstance(info.value.result, kvnumba.AppendResult)
    assert mgr.seq_lens([seq]).tolist() == [3]
    assert len(mgr.mapped_pages()) == 2
    mgr.check()
    pool.check()


def test_every_callback_runs_and_the_first_is_the_cause():
    calls: list = []
    pool = PagePool(2, on_unmap=raiser(calls, "unmap"))
    mgr = BlockManager(4, 1, page_pool=pool, blocks_per_page=2, on_evict=raiser(calls, "evict"))
    (seq,) = mgr.admit([1, 2], [2]).ids
    mgr.release([seq])  # the page stays mapped, its two blocks cached
    assert calls == []
    with pytest.raises(CallbackError) as info:
        mgr.trim()
    assert calls == ["evict", "unmap"]
    assert str(info.value.__cause__) == "evict"
    assert info.value.result == 1  # trim's own result: pages unmapped
    assert len(mgr.mapped_pages()) == 0
    mgr.check()
    pool.check()


def test_sibling_give_up_and_own_map_callbacks_all_run():
    calls: list = []
    pool = PagePool(1, on_map=raiser(calls, "map"), on_unmap=raiser(calls, "unmap"))
    a = BlockManager(2, 1, page_pool=pool, blocks_per_page=2, on_evict=raiser(calls, "a-evict"))
    b = BlockManager(2, 1, page_pool=pool, blocks_per_page=2, max_seqs=4)
    with pytest.raises(CallbackError) as first:
        a.admit([1, 2], [2])  # maps the pool's only page: on_map raises
    assert calls == ["map"]
    calls.clear()
    a.release(first.value.result.ids)
    assert calls == []  # a's page stays mapped: its blocks are cached
    (fresh,) = b.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        b.append([fresh], [1], [9])  # takes a's cache-only page
    assert calls == ["a-evict", "unmap", "map"]
    assert str(info.value.__cause__) == "a-evict"
    assert b.seq_lens([fresh]).tolist() == [1]
    a.check()
    b.check()
    pool.check()


def test_release_callback_error_has_no_result():
    calls: list = []
    pool = PagePool(2, on_unmap=raiser(calls, "unmap"))
    mgr = BlockManager(4, 1, page_pool=pool, blocks_per_page=2)
    (seq,) = mgr.new_sequences(1)
    mgr.append([seq], [2])  # no token ids: nothing is cached, the page is unmapped on release
    with pytest.raises(CallbackError) as info:
        mgr.release([seq])
    assert calls == ["unmap"]
    assert info.value.result is None
    assert not mgr.is_live(seq)
    assert len(mgr.mapped_pages()) == 0
    mgr.check()
    pool.check()


def test_pool_map_pages_callback_error_carries_the_pages():
    pool = PagePool(2, on_map=raiser([], "map"))
    me = pool.register_client()
    with pytest.raises(CallbackError) as info:
        pool.map_pages(me, [5])
    assert info.value.result.tolist() == pool.pages_of(me).tolist()
    pool.check()


# --------------------------------------------------------- hole 5: shared pool names

BAD_NAMES = [None, "", "a/b", "../x", "x\0y", ".", "..", ".hidden", "a" * 201, 5, "sp ace"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_shared_pool_refuses_a_bad_name_and_creates_nothing(name):
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    before = set(os.listdir(shm)) if shm else set()
    parent = set(os.listdir(os.path.dirname(shm))) if shm else set()
    with pytest.raises(ValueError, match="name"):
        PagePool.shared(name, 2)
    with pytest.raises(ValueError, match="name"):
        PagePool.attach(name)
    if shm:
        assert set(os.listdir(shm)) == before
        assert set(os.listdir(os.path.dirname(shm))) == parent


def test_shared_pool_accepts_a_long_portable_name():
    name = f"kvn-t-{uuid.uuid4().hex}".ljust(200, "x")
    pool = PagePool.shared(name, 2)
    try:
        assert pool.name == name
        pool.check()
    finally:
        pool.close()
        pool.unlink()


def test_failed_shared_creation_leaves_no_lock_file(monkeypatch):
    import kvnumba.pages as pages

    def fail(*args, **kwargs):
        raise OSError("no room")

    monkeypatch.setattr(pages, "_open_shm", fail)
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(OSError, match="no room"):
        PagePool.shared(name, 2)
    assert not os.path.exists(pages._lock_path(name))


# ----------------------------------------------------- hole 6: pool callbacks callable


@pytest.mark.parametrize("kwargs", [{"on_map": 5}, {"on_unmap": "f"}], ids=repr)
def test_pool_callbacks_must_be_callable(kwargs):
    with pytest.raises(TypeError, match="callable"):
        PagePool(4, **kwargs)
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(TypeError, match="callable"):
        PagePool.shared(name, 4, **kwargs)
    assert not os.path.exists(f"/dev/shm/{name}")


# -------------------------------------------------------------- hole 7: memory bound


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


# ------------------------------------------------------------------ hole 8: input gaps


def test_bytearray_is_not_an_integer_array():
    mgr = BlockManager(8, 2, max_seqs=4)
    (seq,) = mgr.new_sequences(1)
    before = mgr.snapshot()
    for bad in (bytearray(b"\x05"), b"\x05"):
        with pytest.raises(TypeError):
            mgr.append([seq], bad)
        with pytest.raises(TypeError):
            mgr.append(bad, [1])
        with pytest.raises(TypeError):
            mgr.admit(bad, [1])
    for name in before._fields:
        assert getattr(before, name).tobytes() == getattr(mgr.state, name).tobytes(), name
    assert mgr.seq_lens([seq]).tolist() == [0]


def test_fork_of_nothing_with_a_huge_n_is_a_value_error():
    mgr = BlockManager(8, 2, max_seqs=4)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        mgr.fork([], n=2**63)
    with pytest.raises(ValueError):
        mgr.fork([], n=2**100)
    assert mgr.fork([], n=2).shape == (0, 2)
    mgr.check()


@pytest.mark.parametrize("count", [True, False])
def test_sequence_append_refuses_a_bool_count(count):
    seq = BlockManager(8, 2, max_seqs=4).sequence()
    with pytest.raises(TypeError, match="bool"):
        seq.append(count=count)
    assert len(seq) == 0
