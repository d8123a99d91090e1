"""Eviction policies of the compiled manager (``BlockManager(eviction=...)``).

The scenarios run on the kernels and on the pure-Python model alike, with victims derived by
hand from the rules of ``docs/eviction.md`` (block size 2; a new manager hands out free blocks
0, 1, 2, ...). The 200,000-operation differential run and the stateful machines compare the two
on random calls for every policy; here each policy's defining behaviour is pinned, and
``check()`` is shown to catch a policy that breaks its own rules (planted bugs: a corrupted
policy state, and, in a process without the JIT, a victim chooser that picks a referenced
block or a block with cached children).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from eviction_scenarios import hold, make, use

import kvnumba
from kvnumba import InvariantViolation, PoolExhausted
from kvnumba._layout import (
    F_ORPHAN,
    F_VISITED,
    L_GEN,
    L_HEAP,
    L_PARENT,
    M_HAND,
    M_HEAP_N,
    M_LRU_HEAD,
    W_KEY,
    W_STAMP,
    W_VALUE,
)
from kvnumba.eviction import BUILTIN_POLICIES, EVICTION_POLICIES, SIMULATOR_POLICIES
from kvnumba.reference import ReferenceBlockManager

IMPLS = pytest.mark.parametrize("impl", [kvnumba.BlockManager, ReferenceBlockManager])


# ---------------------------------------------------------------- names and validation


def test_the_policy_is_chosen_at_construction():
    assert kvnumba.EVICTION_POLICIES == EVICTION_POLICIES
    assert kvnumba.BlockManager(4, 2).eviction == "lru"
    for name in EVICTION_POLICIES:
        assert kvnumba.BlockManager(4, 2, eviction=name).eviction == name
    for bad in ("LRU", "fifo", "", None, 1):
        with pytest.raises(ValueError, match="unknown eviction policy"):
            kvnumba.BlockManager(4, 2, eviction=bad)
    with pytest.raises(ValueError, match="simulator option only"):
        kvnumba.BlockManager(4, 2, eviction="oracle")


def test_a_policy_keeps_only_the_per_block_columns_it_reads():
    shapes = {}
    for policy in ("lru", "sieve", "lfu", "leaf-lru"):
        state = kvnumba.BlockManager(64, 2, eviction=policy).state
        shapes[policy] = (state.pol_words.shape, state.pol_links.shape)
    # sieve: a flag bit and a hand in meta; lfu: a heap; leaf-lru: a heap and the forest.
    assert shapes["lru"] == shapes["sieve"] == ((0, 0), (0, 0))
    assert shapes["lfu"] == ((64, 3), (64, 2))
    assert shapes["leaf-lru"] == ((64, 2), (64, 8))
    sizes = {p: kvnumba.BlockManager(64, 2, eviction=p)._arenas.arena.nbytes for p in shapes}
    assert sizes["lru"] == sizes["sieve"] < sizes["lfu"] < sizes["leaf-lru"]


@pytest.mark.parametrize("policy", BUILTIN_POLICIES)
def test_hints_and_tags_are_for_oracle_and_priority_policies_only(policy):
    mgr = kvnumba.BlockManager(4, 2, eviction=policy)
    with pytest.raises(ValueError, match="oracle"):
        mgr.set_next_use([0], [1])
    with pytest.raises(ValueError, match="priority"):
        mgr.set_tags([0], [1])


@pytest.mark.parametrize(
    ("blocks", "uses", "error"),
    [
        ([0, 1], [1], ValueError),
        ([4], [1], ValueError),
        ([-1], [1], ValueError),
        ([0], [-2], ValueError),
        ([0.5], [1], TypeError),
        ([[0]], [[1]], ValueError),
    ],
)
def test_set_next_use_rejects_bad_input_and_changes_nothing(blocks, uses, error):
    mgr, _ = make(kvnumba.BlockManager, 4, "oracle")
    mgr.release([hold(mgr, [1, 2, 3, 4])])
    before = mgr.snapshot()
    with pytest.raises(error):
        mgr.set_next_use(blocks, uses)
    after = mgr.snapshot()
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


# ---------------------------------------------------------------- each policy's behaviour


@IMPLS
@pytest.mark.parametrize(
    ("policy", "victims", "hit"),
    [
        # lfu: [1, 2] has priority 0 + 2; the one-off blocks go first, oldest first.
        ("lfu", [(10, 11), (12, 13), (14, 15)], 2),
        ("lru", [(1, 2), (10, 11), (12, 13)], 0),
    ],
)
def test_lfu_keeps_a_popular_block_through_a_burst_of_one_off_prompts(impl, policy, victims, hit):
    mgr, log = make(impl, 5, policy)
    assert use(mgr, [1, 2, 9], 3) == [0, 2, 2]
    for i in range(6):
        assert use(mgr, [10 + 2 * i, 11 + 2 * i, 9]) == [0]
    assert log.tokens == victims
    assert use(mgr, [1, 2, 9]) == [hit]


@IMPLS
def test_lfu_at_equal_priority_evicts_the_block_released_first_hits_or_not(impl):
    mgr, log = make(impl, 3, "lfu")
    assert use(mgr, [1, 2, 9], 2) == [0, 2]  # A: priority 0 + 1
    assert use(mgr, [3, 4, 9], 2) == [0, 2]  # B: priority 0 + 1, released after A
    assert use(mgr, [5, 6, 9]) == [0]  # evicts A (age 1); C, without hits, gets 1 + 0
    assert log.tokens == [(1, 2)]
    # B and C both have priority 1: B (hits, released before the age rose) goes first.
    assert use(mgr, [7, 8, 9]) == [0]
    assert log.tokens == [(1, 2), (3, 4)]
    assert use(mgr, [3, 4, 9]) == [0]
    assert log.tokens == [(1, 2), (3, 4), (5, 6)]
    mgr.check()


@IMPLS
def test_lfu_aging_lets_a_stale_popular_block_go(impl):
    mgr, log = make(impl, 3, "lfu")
    assert use(mgr, [1, 2, 9], 4) == [0, 2, 2, 2]  # A: 3 hits
    assert use(mgr, [3, 4, 9], 3) == [0, 2, 2]  # B: 2 hits
    assert use(mgr, [5, 6, 9], 3) == [0, 2, 2]  # C's tail evicts B: age 2, C then 2 + 2
    assert log.tokens == [(3, 4)]
    assert use(mgr, [7, 8, 9]) == [0]  # A (3) before C (4): aging at work
    assert log.tokens == [(3, 4), (1, 2)]


def _sieve_queue(impl, policy):
    """A = [1, 2] (block 0, hit once), then B, C, D (blocks 1, 2, 3) cached; pool full."""
    mgr, log = make(impl, 4, policy)
    assert use(mgr, [1, 2, 9], 2) == [0, 2]
    for tokens in ([3, 4], [5, 6], [7, 8]):
        mgr.release([hold(mgr, tokens)])
    return mgr, log


@IMPLS
@pytest.mark.parametrize(("policy", "victims"), [("sieve", [1, 2, 3, 0]), ("lru", [0, 1, 2, 3])])
def test_sieve_gives_a_hit_block_a_second_chance(impl, policy, victims):
    mgr, log = _sieve_queue(impl, policy)
    for token in (50, 51, 52, 53):
        hold(mgr, [token])
    assert log.blocks == victims


@IMPLS
def test_sieve_hand_moves_on_when_its_block_leaves(impl):
    mgr, log = _sieve_queue(impl, "sieve")
    hold(mgr, [50])  # the hand skips A, evicts B, rests on C
    r = mgr.admit([5, 6, 9], [3])  # claims C under the hand: it moves to D, which goes
    assert r.num_cached_tokens.tolist() == [2] and log.blocks == [1, 3]
    mgr.release(r.ids)
    for token in (60, 61, 62):
        hold(mgr, [token])
    assert log.blocks == [1, 3, 0, 2]
    mgr.check()


@IMPLS
@pytest.mark.parametrize(("policy", "victim"), [("leaf-lru", 2), ("oracle", 2), ("lru", 0)])
def test_leaf_policies_evict_a_child_before_its_older_parent(impl, policy, victim):
    mgr, log = make(impl, 4, policy)
    a = hold(mgr, [1, 2])  # P = block 0
    b = hold(mgr, [1, 2, 3, 4])  # a copy of P (block 1), then C = block 2 under P
    mgr.release([a])
    mgr.release([b])
    if policy == "oracle":
        mgr.set_next_use([0, 2], [-1, -1])  # equal: the least recent release decides
    hold(mgr, [20, 21, 22, 23, 24])
    assert log.blocks == [victim]
    mgr.check()


@IMPLS
@pytest.mark.parametrize("policy", ["leaf-lru", "oracle"])
def test_an_explicit_eviction_orphans_the_cached_child_which_goes_first(impl, policy):
    mgr, log = make(impl, 4, policy)
    x = hold(mgr, [7, 8])  # X = block 0
    s = hold(mgr, [1, 2, 3, 4])  # P = block 1, C = block 2
    mgr.release([x, s])
    if policy == "oracle":  # X is never used again, C soon: C still goes first
        mgr.set_next_use([0, 1, 2], [-1, 5, 5])
    assert mgr.evict([1]) == 1
    if impl is kvnumba.BlockManager:
        assert mgr.state.block_flags[2] & F_ORPHAN
    mgr.check()
    hold(mgr, [20, 21, 22, 23, 24])
    assert log.blocks == [1, 2]


@IMPLS
def test_oracle_evicts_the_furthest_next_use_first(impl):
    mgr, log = make(impl, 3, "oracle")
    for tokens in ([1, 2], [3, 4], [5, 6]):
        mgr.release([hold(mgr, tokens)])
    mgr.set_next_use([0, 1, 2], [5, -1, 10])
    mgr.set_next_use([0], [100])  # a cached block's new next use counts at once
    for token in (7, 8, 9):
        hold(mgr, [token])
    assert log.blocks == [1, 0, 2]


@IMPLS
def test_oracle_never_evicts_a_parent_before_its_cached_child(impl):
    mgr, log = make(impl, 3, "oracle")
    s = hold(mgr, [1, 2, 3, 4])
    x = hold(mgr, [5, 6])
    mgr.release([s, x])
    mgr.set_next_use([0, 1, 2], [-1, 3, 7])
    for token in (7, 8, 9):
        hold(mgr, [token])
    assert log.blocks == [2, 1, 0]


# ---------------------------------------------------------------- rollback


@pytest.mark.parametrize("policy", SIMULATOR_POLICIES)
def test_a_failed_atomic_admit_leaves_the_state_byte_identical(policy):
    mgr, log = make(kvnumba.BlockManager, 6, policy)
    use(mgr, [5, 6, 9], 3)
    a = hold(mgr, [1, 2, 3, 4])
    hold(mgr, [30, 31, 32, 33, 34, 35])
    mgr.release([a])
    if policy == "oracle":
        mgr.set_next_use([0, 1, 2], [4, 1, 1])
    before = mgr.snapshot()
    prompts = [1, 2, 3, 4, 9, 7, 8, 9, 10, 11]
    with pytest.raises(PoolExhausted):  # the first prompt evicts, the second cannot fit
        mgr.admit(prompts, [5, 5])
    after = mgr.snapshot()
    for name, x, y in zip(before._fields, before, after, strict=True):
        assert np.array_equal(x, y), name
    assert log.blocks == []
    mgr.check()
    assert mgr.admit(prompts, [5, 5], atomic=False).ok.tolist() == [True, False]
    assert log.blocks == [0]  # not atomic: the first prompt's eviction stays


# ---------------------------------------------------------------- planted bugs


def _cached_pool(policy, hits=None):
    """Chains of two blocks (parent, child), all cached: 8 blocks, prompts of 4 tokens. With
    ``hits`` (the default under lfu, whose blocks released without hits are kept outside the
    heap) each prompt is admitted once more, so that its blocks have hits."""
    mgr, _ = make(kvnumba.BlockManager, 8, policy)
    prompts = [[10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3] for i in range(4)]
    for tokens in prompts:
        mgr.release([hold(mgr, tokens)])
    if policy == "lfu" if hits is None else hits:
        for tokens in prompts:
            use(mgr, tokens)
    held = hold(mgr, [99, 98])  # one block in use
    mgr.check()
    return mgr, int(mgr.block_tables([held])[0, 0])


def _writable(mgr):
    return mgr._arenas.s


@pytest.mark.parametrize("policy", ["lfu", "leaf-lru", "oracle"])
def test_check_finds_a_referenced_block_in_the_eviction_heap(policy):
    mgr, referenced = _cached_pool(policy)
    s = _writable(mgr)
    s.pol_links[0, L_HEAP] = referenced  # the next victim would be a block in use
    with pytest.raises(InvariantViolation, match="eviction heap"):
        mgr.check()


def test_check_finds_the_sieve_hand_on_a_referenced_block():
    mgr, referenced = _cached_pool("sieve")
    _writable(mgr).meta[M_HAND] = referenced
    with pytest.raises(InvariantViolation, match="sieve: the hand"):
        mgr.check()


@pytest.mark.parametrize("policy", ["sieve", "lfu", "leaf-lru"])
def test_check_finds_a_visited_bit_where_sieve_cannot_have_set_it(policy):
    mgr, _ = _cached_pool(policy)
    partial = mgr.new_sequences(1)
    mgr.append(partial, [1])  # a block in use that is not registered
    mgr.check()
    target = int(mgr.block_tables(partial)[0, 0])
    # Under sieve only a registered block may be visited; under other policies none.
    _writable(mgr).block_flags[target] |= F_VISITED
    with pytest.raises(InvariantViolation, match="visited bit"):
        mgr.check()


def test_check_finds_lfu_floor_out_of_release_order_or_in_the_heap():
    mgr, _ = _cached_pool("lfu", hits=False)  # released without hits: the floor, no heap
    s = _writable(mgr)
    assert s.meta[M_HEAP_N] == 0 and s.meta[M_HAND] == s.meta[M_LRU_HEAD]
    s.meta[M_HAND] = s.lru_next[s.meta[M_LRU_HEAD]]  # the floor's oldest skipped
    with pytest.raises(InvariantViolation, match="floor's oldest"):
        mgr.check()
    s.meta[M_HAND] = s.meta[M_LRU_HEAD]
    mgr.check()
    s.pol_words[s.meta[M_HAND], W_VALUE] = 1  # a floor block with a hit: it belongs in the heap
    with pytest.raises(InvariantViolation, match="floor mark"):
        mgr.check()


@pytest.mark.parametrize("policy", ["lfu", "leaf-lru"])
def test_check_finds_a_broken_heap_order(policy):
    mgr, _ = _cached_pool(policy)
    s = _writable(mgr)
    assert s.meta[M_HEAP_N] >= 2
    top, other = int(s.pol_links[0, L_HEAP]), int(s.pol_links[1, L_HEAP])
    # The top now comes after its child entry.
    s.pol_words[top, W_STAMP] = s.pol_words[other, W_STAMP] + 100
    if policy == "lfu":
        s.pol_words[top, W_KEY] = s.pol_words[other, W_KEY]
    with pytest.raises(InvariantViolation, match="eviction heap"):
        mgr.check()


@pytest.mark.parametrize("policy", ["leaf-lru", "oracle"])
def test_check_finds_an_unreachable_cached_block_left_unmarked(policy):
    mgr, _ = _cached_pool(policy)
    s = _writable(mgr)
    # A parent evicted without orphaning its cached child: the child's link is stale.
    links = s.pol_links
    child = next(b for b in range(8) if links[b, L_PARENT] >= 0 and s.ref[b] == 0)
    links[links[child, L_PARENT], L_GEN] += 2
    with pytest.raises(InvariantViolation, match="prefix forest"):
        mgr.check()


_BUGGY_VICTIM = """
import numpy as np
import kvnumba
from kvnumba._kernels import blocks
from kvnumba._layout import M_LRU_TAIL

policy, bug = {policy!r}, {bug!r}
mgr = kvnumba.BlockManager(8, 2, max_seqs=8, eviction=policy)

correct = blocks.policy_victim
armed = []

def buggy(v):
    if not armed:
        return correct(v)
    if bug == "referenced":
        return np.int64(int(np.flatnonzero(v.ref)[0]))
    return np.int64(v.meta[M_LRU_TAIL])  # the newest release: a parent with a cached child

blocks.policy_victim = buggy
for i in range(4):  # chains of two blocks, all cached
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [4], [10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3])
    mgr.release([s])
(s,) = mgr.new_sequences(1)
mgr.append([s], [2], [99, 98])  # one block in use: a cached one was evicted for it
mgr.check()
(t,) = mgr.new_sequences(1)
armed.append(True)
try:
    mgr.append([t], [2], [97, 96])  # one eviction, by the buggy chooser
    mgr.check()
except kvnumba.InvariantViolation as exc:
    print("caught:", exc)
except Exception as exc:  # the corrupted state may fail the call itself
    print("failed:", type(exc).__name__, exc)
else:
    print("missed")
"""


@pytest.mark.parametrize(
    ("policy", "bug"),
    [
        *((p, "referenced") for p in EVICTION_POLICIES),
        ("leaf-lru", "non-leaf"),
    ],
)
def test_a_planted_victim_bug_is_caught(policy, bug):
    """Without the JIT the kernels are Python and the victim chooser can be replaced: a policy
    that evicts a referenced block, or (leaf-lru) a block with cached children, is caught."""
    script = textwrap.dedent(_BUGGY_VICTIM.format(policy=policy, bug=bug))
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(("caught:", "failed:")), out.stdout
    if policy == "leaf-lru" and bug == "non-leaf":
        assert "must never choose" in out.stdout, out.stdout
