"""Sequence ids: an id belongs to the manager that issued it (its tag), live managers never share
a tag, and a slot's generation wraps to one after its limit, in the kernels and in the
reference model alike."""

from __future__ import annotations

import pytest

import kvnumba
from kvnumba import BlockManager, PagePool


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
    from kvnumba import ids as _ids
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

    from kvnumba import ids as _ids

    def release_inside():
        with _ids._lock:
            _ids._release_tag(1 << 20)

    worker = threading.Thread(target=release_inside, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive()
