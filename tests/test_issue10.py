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
    import kvnumba.physical_pages as pages

    def fail(*args, **kwargs):
        raise OSError("no room")

    monkeypatch.setattr(pages, "open_shm", fail)  # the name physical_pages calls
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(OSError, match="no room"):
        PagePool.shared(name, 2)
    assert not os.path.exists(pages.lock_path(name))


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


# --- hole 3: an id belongs to one manager -------------------------------------------------------
def _twins():
    """Two fresh managers: their first sequences sit in the same slot with the same generation."""
    a, b = BlockManager(16, 4, max_seqs=4), BlockManager(16, 4, max_seqs=4)
    (ida,), (idb,) = a.new_sequences(1), b.new_sequences(1)
    a.append([ida], [3])
    b.append([idb], [5])
    return a, b, int(ida), int(idb)


def test_an_id_of_another_manager_is_invalid_for_every_call(assert_unchanged):
    a, b, ida, idb = _twins()
    assert ida != idb and a.id_tag != b.id_tag
    for mgr, foreign in ((a, idb), (b, ida)):
        for call in (
            lambda m=mgr, f=foreign: m.append([f], [1]),
            lambda m=mgr, f=foreign: m.append([f], [1], atomic=False),
            lambda m=mgr, f=foreign: m.release([f]),
            lambda m=mgr, f=foreign: m.fork([f]),
            lambda m=mgr, f=foreign: m.block_tables([f]),
            lambda m=mgr, f=foreign: m.seq_lens([f]),
            lambda m=mgr, f=foreign: m.can_append([f], [1]),
        ):
            err = assert_unchanged(mgr, call, kvnumba.InvalidSequence)
            assert not isinstance(err, kvnumba.SequenceReleased)
        assert not mgr.is_live(foreign)
    # Each manager still serves its own sequence, untouched by the other's calls.
    assert a.seq_lens([ida]).tolist() == [3] and b.seq_lens([idb]).tolist() == [5]


def test_managers_on_one_pool_do_not_accept_each_others_ids(assert_unchanged):
    pool = PagePool(8)
    a, b = (BlockManager(16, 4, max_seqs=4, page_pool=pool, blocks_per_page=2) for _ in range(2))
    (ida,), (idb,) = a.new_sequences(1), b.new_sequences(1)
    assert_unchanged(a, lambda: a.append([idb], [2]), kvnumba.InvalidSequence)
    assert_unchanged(b, lambda: b.release([ida]), kvnumba.InvalidSequence)
    a.release([ida])
    b.release([idb])
    pool.check()


def test_the_reference_model_rejects_foreign_ids_and_mirrors_a_tag():
    from kvnumba.reference import ReferenceBlockManager

    a, _, ida, idb = _twins()
    mirror = ReferenceBlockManager(16, 4, max_seqs=4, id_tag=a.id_tag)
    assert mirror.new_sequences(1).tolist() == [ida]
    with pytest.raises(kvnumba.InvalidSequence) as err:
        mirror.seq_lens([idb])
    assert not isinstance(err.value, kvnumba.SequenceReleased)
    own = ReferenceBlockManager(16, 4, max_seqs=4)
    assert own.id_tag != a.id_tag
    with pytest.raises(kvnumba.InvalidSequence):
        own.seq_lens([ida])


def test_live_managers_never_share_a_tag():
    managers = [BlockManager(4, 1, max_seqs=1) for _ in range(50)]
    assert len({m.id_tag for m in managers}) == 50
    assert all(1 <= m.id_tag < 1 << 16 for m in managers)


def test_generation_wraps_to_one_after_its_limit_in_kernels_and_model():
    from kvnumba.ids import generation_limit, make_id, split_id
    from kvnumba.reference import ReferenceBlockManager

    mgr = BlockManager(8, 2, max_seqs=2)
    ref = ReferenceBlockManager(8, 2, max_seqs=2, id_tag=mgr.id_tag)
    limit = generation_limit(2)
    assert limit == (1 << 46) - 1  # 1 slot bit: 46 bits of generation under the 16-bit tag
    # Put slot 0 at the last generation on both sides, then hand it out twice more.
    mgr._arenas.s.seq_gen[0] = limit - 1
    ref._gen[0] = limit - 1
    first = mgr.new_sequences(1).tolist()
    assert first == ref.new_sequences(1).tolist() == [make_id(mgr.id_tag, limit, 0, 2)]
    mgr.release(first)
    ref.release(first)
    again = mgr.new_sequences(1).tolist()
    assert again == ref.new_sequences(1).tolist()
    assert split_id(again[0], 2) == (mgr.id_tag, 1, 0)
    with pytest.raises(kvnumba.InvalidSequence):
        mgr.seq_lens(first)  # the last generation's id: no longer live
    mgr.check()


def test_a_tag_outside_its_range_is_refused_and_tags_can_run_out(monkeypatch):
    from kvnumba.reference import ReferenceBlockManager

    for bad in (0, -1, 1 << 16):
        with pytest.raises(kvnumba.InvalidGeometry):
            ReferenceBlockManager(4, 1, id_tag=bad)
    # Every tag held by a live manager: the next manager is refused with a typed error.
    monkeypatch.setattr(_ids, "_live", set(range(1, 1 << 16)))
    with pytest.raises(kvnumba.InvalidGeometry, match="live managers"):
        BlockManager(4, 1)


def test_a_tag_released_while_a_tag_is_taken_does_not_deadlock():
    # A garbage collection inside new_tag can run a collected manager's finalizer in the same
    # thread, which releases its tag under the same lock.
    import threading

    def release_inside():
        with _ids._lock:
            _ids._release_tag(1 << 20)

    worker = threading.Thread(target=release_inside, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive()
