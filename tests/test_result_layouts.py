"""Every entry kernel returns the tuple its named layout says (``kvnumba.kernels.RESULTS``), so
the facade's decoders, made from the layouts' field names, read the fields they name."""

from typing import get_type_hints

import numpy as np
import pytest

import kvnumba
from kvnumba import kernels
from kvnumba._kernel_set import KERNEL_NAMES, ready
from kvnumba.kernels import RESULTS, CountOnlyLayout, NoneLayout


class Recorder:
    """Wraps every kernel of a manager's ``KernelSet`` and keeps what each returned."""

    def __init__(self, manager):
        self.seen = {}
        kernel_set = manager._kernels
        for name in KERNEL_NAMES:
            setattr(kernel_set, name, self.wrap(name, getattr(kernel_set, name)))

    def wrap(self, name, kernel):
        def call(*args):
            result = ready(kernel)(*args)
            self.seen.setdefault(name, []).append(result)
            return result

        return call


def assert_layouts(seen):
    for name, results in seen.items():
        layout = RESULTS[name]
        for result in results:
            if layout is CountOnlyLayout:
                assert isinstance(result, (int, np.integer)), name
            elif layout is NoneLayout:
                assert result is None, name
            else:
                assert isinstance(result, tuple), name
                assert len(result) == len(layout._fields), (name, layout.__name__, result)
                # The typed fields hold what their annotations say.
                hints = get_type_hints(layout)
                for field, value in zip(layout._fields, result, strict=True):
                    if hints[field] is np.ndarray:
                        assert isinstance(value, np.ndarray), (name, field)
                    else:
                        assert isinstance(value, (int, np.integer, bool, np.bool_)), (name, field)


def keys_of(n, start=0):
    return np.arange(start, start + 4 * n, dtype=np.uint64).reshape(n, 4)


def test_every_kernel_of_a_plain_manager_returns_its_layout():
    mgr = kvnumba.BlockManager(16, 2, max_seqs=8, max_seq_len=32, block_keys=True)
    rec = Recorder(mgr)
    ids = mgr.new_sequences(2)
    mgr.append(ids, [3, 2])
    assert mgr.can_append(ids, [1, 1])
    (child,) = mgr.fork(ids[:1], 1)[0]
    assert mgr.block_tables(ids).shape[0] == 2 and mgr.seq_lens(ids).tolist() == [3, 2]
    mgr.set_keys(ids[:1], [0], [1], keys_of(1))
    mgr.truncate(ids[1:], [1])
    assert mgr.release_window(ids[1:], [1]) == 0
    mgr.release([child, *ids])
    admitted = mgr.admit(None, [4], keys=keys_of(2, 100), key_counts=[2])
    # At most length - 1 tokens are served from the cache: one block of two.
    assert mgr.lookup(None, [4], keys=keys_of(2, 100), key_counts=[2]).num_cached_tokens[0] == 2
    one = mgr.append_one(int(admitted.ids[0]), 1)
    assert one[1] == 3
    seq, cached = mgr.admit_one(length=4, keys=keys_of(2, 100))
    assert cached == 2
    hits = mgr.lookup_one(length=4, keys=keys_of(2, 100))
    assert hits.tolist() == mgr.block_tables([seq])[0][:1].tolist()
    mgr.append_one(seq, 2, key_start=2, keys=keys_of(1, 200))
    mgr.release([seq, int(admitted.ids[0])])
    assert mgr.evict([0, 1, 2, 3, 4, 5, 6, 7]) >= 1
    mgr.reset_prefix_cache()
    big, small = mgr.new_sequences(2)
    mgr.append([big], [32])  # every block of the pool
    with pytest.raises(kvnumba.PoolExhausted):
        mgr.append([small], [2])
    with pytest.raises(kvnumba.PoolExhausted):  # several prompts, atomic: logged, rolled back
        mgr.admit(None, [2, 2], keys=keys_of(2, 300), key_counts=[1, 1])
    mgr.check()
    tokens_mgr = kvnumba.BlockManager(8, 2, max_seqs=4, max_seq_len=16)
    tokens_rec = Recorder(tokens_mgr)
    tokens_mgr.admit_one([1, 2, 3, 4])
    tokens_mgr.admit([5, 6], [2])
    assert tokens_mgr.lookup_one([1, 2, 3, 4]).tolist() == [0]
    assert_layouts(rec.seen)
    assert_layouts(tokens_rec.seen)
    seen = set(rec.seen) | set(tokens_rec.seen)
    untried = {"k_give_up", "k_commit_give_up", "k_lookup"}
    untried |= {"k_set_next_use", "k_set_tags", "k_set_sequence_tags"}
    assert set(RESULTS) - seen <= untried, sorted(set(RESULTS) - seen - untried)


def test_the_kernels_of_a_paged_and_a_policy_manager_return_their_layouts():
    pool = kvnumba.PagePool(4)
    paged = kvnumba.BlockManager(8, 2, max_seqs=4, page_pool=pool, blocks_per_page=4)
    rec = Recorder(paged)
    ids = paged.new_sequences(1)
    paged.admit([1, 2, 3, 4], [4])
    paged.append(ids, [3])
    assert paged.can_append(ids, [1])
    paged.release(ids)
    paged.check()
    assert paged.trim() >= 0
    oracle = kvnumba.BlockManager(4, 1, eviction="oracle", _hindsight=True)
    oracle_rec = Recorder(oracle)
    oracle.release(oracle.admit([1, 2], [2]).ids)
    oracle.set_next_use([0, 1], [5, 9])
    oracle.check()
    tagged = kvnumba.BlockManager(4, 1, eviction="t-lru")
    tagged_rec = Recorder(tagged)
    tagged.release(tagged.admit([1, 2], [2]).ids)
    tagged.set_tags([0], [1])
    tagged.set_sequence_tags(tagged.admit([3], [1]).ids, [2])
    assert_layouts(rec.seen)
    assert_layouts(oracle_rec.seen)
    assert_layouts(tagged_rec.seen)
    assert {"k_set_tags", "k_set_sequence_tags"} <= set(tagged_rec.seen)
    assert {"k_give_up", "k_admit", "k_append", "k_check"} <= set(rec.seen)
    assert {"k_set_next_use"} <= set(oracle_rec.seen)


def test_a_layout_without_status_first_is_refused_at_import():
    class Backwards(kernels.NamedTuple):
        bad: int
        status: int

    saved = dict(RESULTS)
    try:
        RESULTS["k_fork"] = Backwards
        with pytest.raises(ImportError, match="status is not its first field"):
            kernels._check_results()
        del RESULTS["k_fork"]
        with pytest.raises(ImportError, match="without a result layout"):
            kernels._check_results()
    finally:
        RESULTS.clear()
        RESULTS.update(saved)
    kernels._check_results()
