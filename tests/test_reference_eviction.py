"""Eviction policies of the pure-Python model (``kvnumba.reference.eviction``).

Each scenario's victims are derived by hand from the rules of ``docs/eviction.md`` (block size
2 throughout; a new manager hands out free blocks 0, 1, 2, ...). The model is the oracle the
kernels are compared against, so these tests pin the rules themselves. Pure Python: no numba.
"""

from __future__ import annotations

import copy
import random
import zlib

import eviction_scenarios as scenarios
import numpy as np
import pytest
from eviction_scenarios import hold, use

from kvnumba.errors import InvariantViolation, PoolExhausted, SequenceTooLong, TooManySequences
from kvnumba.eviction import BUILTIN_POLICIES, EVICTION_POLICIES, SIMULATOR_POLICIES
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool
from kvnumba.reference._common import _STATE
from kvnumba.reference.eviction import ORPHAN_AT_BIRTH, ROOT


def make(num_blocks, policy, **kw):
    """A model manager (block size 2) with ``policy`` and the log of its evictions."""
    return scenarios.make(ReferenceBlockManager, num_blocks, policy, **kw)


def frozen(mgr):
    """The model's rollback state (the eviction policy's included) as a comparable value."""
    return copy.deepcopy({name: getattr(mgr, name) for name in _STATE})


# ---------------------------------------------------------------- construction


def test_policy_names_and_validation():
    assert ReferenceBlockManager(4, 2).eviction == "lru"
    for name in EVICTION_POLICIES:
        assert ReferenceBlockManager(4, 2, eviction=name).eviction == name
    for name in SIMULATOR_POLICIES:
        assert ReferenceBlockManager(4, 2, eviction=name, _hindsight=True).eviction == name
    for bad in ("fifo", "LRU", "", None, 0):
        with pytest.raises(ValueError, match="unknown eviction policy"):
            ReferenceBlockManager(4, 2, eviction=bad)
    with pytest.raises(ValueError, match="simulator option only"):
        ReferenceBlockManager(4, 2, eviction="oracle")


@pytest.mark.parametrize("policy", BUILTIN_POLICIES)
def test_set_next_use_is_oracle_only(policy):
    mgr, _ = make(4, policy)
    with pytest.raises(ValueError, match="oracle"):
        mgr.set_next_use([0], [3])


def test_set_next_use_validates_everything_first():
    mgr, _ = make(4, "oracle")
    value = mgr._policy.value
    for blocks, uses, error in (
        ([0, 1], [3], ValueError),  # lengths differ
        ([0, 4], [3, 3], ValueError),  # block out of range (after a valid one)
        ([0, -1], [3, 3], ValueError),
        ([0, 1], [3, -2], ValueError),  # below "never used again"
        ([[0]], [[3]], ValueError),  # not 1-D
        ([0.0], [3], TypeError),
        ([0], [True], TypeError),
    ):
        with pytest.raises(error):
            mgr.set_next_use(blocks, uses)
        assert value == [-1] * 4  # nothing changed
    mgr.set_next_use(np.array([2, 0, 2], dtype=np.int32), [5, -1, 7])  # the later entry wins
    mgr.set_next_use([], [])
    assert mgr._policy.value == [-1, -1, 7, -1]


# ---------------------------------------------------------------- lru


def test_lru_is_the_default_and_evicts_the_oldest_release():
    mgr, log = make(4, "lru")
    a, b = hold(mgr, [1, 2, 3, 4]), hold(mgr, [5, 6, 7, 8])  # blocks 0, 1 and 2, 3
    mgr.release([a, b])  # tail first: 1, 0, then 3, 2
    assert mgr.lru_blocks() == [1, 0, 3, 2]
    assert mgr._policy.stamp == [1, 0, 3, 2] and mgr._policy.clock == 4
    hold(mgr, [9, 10, 11])
    assert log.blocks == [1, 0] and mgr.lru_blocks() == [3, 2]


# ---------------------------------------------------------------- lfu


@pytest.mark.parametrize(
    ("policy", "victims", "hit"),
    [
        # lfu: [1, 2] has priority 0 + 2; the one-off blocks 0 go first, oldest first.
        ("lfu", [(10, 11), (12, 13), (14, 15)], 2),
        # lru: [1, 2] is the least recently released block when the pool runs out.
        ("lru", [(1, 2), (10, 11), (12, 13)], 0),
    ],
)
def test_lfu_keeps_a_popular_block_through_a_burst_of_one_off_prompts(policy, victims, hit):
    mgr, log = make(5, policy)
    # [1, 2] is block 0: registered by the first use, hit by the next two. The tail [9] is
    # block 1 each time (freed on release, taken again).
    assert use(mgr, [1, 2, 9], 3) == [0, 2, 2]
    # One-off prompts: the first three fill blocks 1, 2, 3 (their tails are 2, 3, 4, freed);
    # from the fourth on each needs one eviction for its tail.
    for i in range(6):
        assert use(mgr, [10 + 2 * i, 11 + 2 * i, 9]) == [0]
    assert log.tokens == victims
    if policy == "lfu":
        assert mgr._policy.age == 0  # every victim had priority 0
    assert use(mgr, [1, 2, 9]) == [hit]


def test_lfu_aging_lets_a_stale_popular_block_go():
    mgr, log = make(3, "lfu")
    policy = mgr._policy
    assert use(mgr, [1, 2, 9], 4) == [0, 2, 2, 2]  # A = block 0: 3 hits, priority 0 + 3
    assert use(mgr, [3, 4, 9], 3) == [0, 2, 2]  # B = block 1: 2 hits, priority 0 + 2
    assert policy.prio == {0: 3, 1: 2} and policy.stamp[:2] == [3, 6]
    # C = [5, 6] takes the free block 2; its tail evicts B (the lowest priority): age 2.
    # Then C's two hits give it priority 2 + 2.
    assert use(mgr, [5, 6, 9], 3) == [0, 2, 2]
    assert log.tokens == [(3, 4)] and policy.age == 2
    assert policy.prio == {0: 3, 2: 4}
    # A (3) now goes before C (4); without aging C's priority would be 2 and C would go.
    assert use(mgr, [7, 8, 9]) == [0]
    assert log.tokens == [(3, 4), (1, 2)] and policy.age == 3


@pytest.mark.parametrize("policy", ["lfu", "sieve"])
def test_hits_count_per_admitted_prompt(policy):
    mgr, _ = make(4, policy)
    value = mgr._policy.value
    a = hold(mgr, [1, 2])  # block 0, registered: no hits yet
    assert value[0] == 0
    # Two prompts of one call hit block 0 while a holds it: one hit each.
    ok = mgr.admit([1, 2, 9, 1, 2, 8], [3, 3])
    assert ok.num_cached_tokens.tolist() == [2, 2] and value[0] == 2
    mgr.lookup([1, 2, 9], [3])  # a lookup claims nothing
    assert value[0] == 2
    # One free block left: a prompt needing 3 more fails without counting its hit.
    big = [1, 2, 5, 6, 7, 8, 9]
    assert not mgr.admit(big, [7], atomic=False).ok[0]
    with pytest.raises(PoolExhausted):
        mgr.admit(big, [7])
    assert value[0] == 2
    mgr.release([a, *ok.ids])
    assert mgr.lru_blocks() == [0] and value[0] == 2
    assert mgr.evict([0]) == 1  # block 0 is on top of the free stack
    s = hold(mgr, [3, 4])
    assert mgr.block_tables([s]).tolist() == [[0]] and value[0] == 0  # registered: reset
    mgr.check()


def test_lfu_explicit_evictions_leave_the_age():
    pool = ReferencePagePool(1)  # one physical page of 2 blocks for 2 virtual pages
    mgr, log = make(4, "lfu", page_pool=pool, blocks_per_page=2)
    assert use(mgr, [1, 2, 9], 2) == [0, 2]  # block 0: one hit, priority 1
    # [3, 4] takes block 1; its tail evicts block 0 (no page left to map): age 1.
    assert use(mgr, [3, 4, 9]) == [0]
    assert log.blocks == [0] and mgr._policy.age == 1 and mgr._policy.prio == {1: 1}
    assert mgr.trim() == 1  # gives up page 0 and its cached block 1
    assert log.blocks == [0, 1] and mgr._policy.age == 1
    assert use(mgr, [5, 6, 9], 2) == [0, 2]
    mgr.reset_prefix_cache()
    assert mgr._policy.age == 1 and mgr._policy.prio == {}
    mgr.check()


# ---------------------------------------------------------------- sieve


def _sieve_queue(policy):
    """A = [1, 2] (block 0, hit once), then B, C, D (blocks 1, 2, 3) cached; pool full."""
    mgr, log = make(4, policy)
    assert use(mgr, [1, 2, 9], 2) == [0, 2]
    for tokens in ([3, 4], [5, 6], [7, 8]):
        mgr.release([hold(mgr, tokens)])
    assert mgr.lru_blocks() == [0, 1, 2, 3]
    return mgr, log


def test_sieve_gives_a_hit_block_a_second_chance():
    mgr, log = _sieve_queue("sieve")
    policy = mgr._policy
    assert policy.value[0] == 1 and policy.hand is None
    hold(mgr, [50])  # the hand skips A (clearing its bit) and evicts B; it moves on to C
    assert log.blocks == [1] and policy.value[0] == 0 and policy.hand == 2
    hold(mgr, [51])
    assert log.blocks == [1, 2] and policy.hand == 3
    hold(mgr, [52])  # D was the newest: the hand has nowhere to go
    assert log.blocks == [1, 2, 3] and policy.hand is None
    hold(mgr, [53])  # from the oldest again: A, its second chance used up
    assert log.blocks == [1, 2, 3, 0] and policy.hand is None

    lru, lru_log = _sieve_queue("lru")
    for token in (50, 51, 52, 53):
        hold(lru, [token])
    assert lru_log.blocks == [0, 1, 2, 3]


def test_sieve_hand_moves_on_when_its_block_leaves():
    mgr, log = _sieve_queue("sieve")
    policy = mgr._policy
    hold(mgr, [50])
    assert log.blocks == [1] and policy.hand == 2 and mgr.lru_blocks() == [0, 2, 3]
    # A hit claims C under the hand: the hand moves to D, which the prompt's tail evicts;
    # D was the newest, so the hand is left nowhere.
    r = mgr.admit([5, 6, 9], [3])
    assert r.num_cached_tokens.tolist() == [2]
    assert log.blocks == [1, 3] and policy.hand is None and policy.value[2] == 1
    mgr.release(r.ids)  # C back at the newest end, its bit kept
    assert mgr.lru_blocks() == [0, 2]
    hold(mgr, [60])  # the free block 3
    hold(mgr, [61])  # from the oldest: A (bit cleared by the first search); hand to C
    assert log.blocks == [1, 3, 0] and policy.hand == 2
    hold(mgr, [62])  # C's bit is cleared, the hand wraps around to C itself
    assert log.blocks == [1, 3, 0, 2] and policy.hand is None and policy.value[2] == 0
    mgr.check()


# ---------------------------------------------------------------- leaf-lru and oracle


@pytest.mark.parametrize(("policy", "victim"), [("leaf-lru", 2), ("lru", 0)])
def test_leaf_lru_evicts_a_child_before_its_older_parent(policy, victim):
    mgr, log = make(4, policy)
    a = hold(mgr, [1, 2])  # P = block 0
    # b's block 1 is a copy of P (its key, unregistered); its block 2 = C is registered as
    # the child of the registered P, which b does not hold.
    b = hold(mgr, [1, 2, 3, 4])
    mgr.release([a])  # P cached first
    mgr.release([b])  # then C (linked under P); block 1 is freed
    assert mgr.lru_blocks() == [0, 2]
    if policy == "leaf-lru":
        assert mgr._policy.parent[2] == 0 and mgr._policy.kids[0] == [2]
    hold(mgr, [20, 21, 22, 23, 24])  # free blocks 1 and 3, then one eviction
    assert log.blocks == [victim]
    mgr.check()


@pytest.mark.parametrize(("policy", "victim"), [("leaf-lru", 2), ("oracle", 2), ("lru", 0)])
def test_explicit_evict_of_a_parent_orphans_its_cached_child(policy, victim):
    mgr, log = make(4, policy)
    x = hold(mgr, [7, 8])  # X = block 0
    s = hold(mgr, [1, 2, 3, 4])  # P = block 1, C = block 2
    mgr.release([x, s])
    assert mgr.lru_blocks() == [0, 2, 1]
    if policy == "oracle":  # X is never used again, C soon: C still goes first
        mgr.set_next_use([0, 1, 2], [-1, 5, 5])
    assert mgr.evict([1]) == 1
    if policy != "lru":
        assert mgr._policy.orphan == {2} and mgr._policy.kids[1] == []
    mgr.check()
    hold(mgr, [20, 21, 22, 23, 24])  # free blocks 1 and 3, then one eviction
    assert log.blocks == [1, victim]
    mgr.check()


def test_leaf_lru_unregistering_a_referenced_parent_orphans_its_cached_child():
    mgr, _ = make(4, "leaf-lru")
    policy = mgr._policy
    a = hold(mgr, [1, 2])  # P = block 0
    r = mgr.admit([1, 2, 3, 4, 9], [5])  # hits P; C = block 1 (child of P), tail block 2
    mgr.release(r.ids)
    assert mgr.lru_blocks() == [1] and policy.kids[0] == [1]
    assert policy.gen[0] == 1 and policy.pgen[1] == 1
    mgr.truncate([a], [1])  # a holds P alone: cut, so unhashed
    assert policy.gen[0] == 2 and policy.orphan == {1} and policy.kids[0] == []
    mgr.check()


def test_leaf_lru_orphan_from_birth():
    mgr, _ = make(4, "leaf-lru")
    policy = mgr._policy
    a = hold(mgr, [1, 2])  # P = block 0
    b = hold(mgr, [1, 2])  # block 1: a copy of P, unregistered
    mgr.release([a])
    mgr.evict([0])  # no block is registered with P's key any more
    mgr.append([b], [2], [3, 4])  # C = block 0 (the top of the free stack)
    assert mgr.block_tables([b]).tolist() == [[1, 0]]
    assert policy.parent[0] == ORPHAN_AT_BIRTH and policy.parent[1] == ROOT
    mgr.release([b])
    assert mgr.lru_blocks() == [0] and policy.orphan == {0}
    mgr.check()


def test_leaf_lru_parents_under_engine_keys():
    mgr, _ = make(8, "leaf-lru", block_keys=True)
    parent = mgr._policy.parent
    r = mgr.admit(None, [5], keys=[[11, 0, 0, 0], [12, 0, 0, 0]])
    (seq,) = r.ids
    assert mgr.block_tables([seq]).tolist() == [[0, 1, 2]]
    assert (parent[0], parent[1]) == (ROOT, 0)
    mgr.append([seq], [1])  # block 2 fills: set_keys registers it under block 1
    mgr.set_keys([seq], [2], [1], [[13, 0, 0, 0]])
    assert parent[2] == 1
    (other,) = mgr.new_sequences(1)
    mgr.append([other], [4])  # blocks 3 and 4, position 0 never keyed
    mgr.set_keys([other], [1], [1], [[14, 0, 0, 0]])
    assert parent[4] == ROOT  # the block before it is not registered
    mgr.release([seq, other])
    assert mgr.lru_blocks() == [2, 1, 0, 4]
    assert mgr._policy.kids[0] == [1] and mgr._policy.kids[1] == [2]
    mgr.check()


def test_oracle_evicts_the_furthest_next_use_first():
    mgr, log = make(3, "oracle")
    for tokens in ([1, 2], [3, 4], [5, 6]):  # roots A, B, C = blocks 0, 1, 2
        mgr.release([hold(mgr, tokens)])
    mgr.set_next_use([0, 1, 2], [5, -1, 10])
    mgr.set_next_use([0], [100])  # a cached block's new next use counts at once
    for token in (7, 8, 9):
        hold(mgr, [token])
    assert log.blocks == [1, 0, 2]  # never used again, then at 100, then at 10


def test_oracle_never_evicts_a_parent_before_its_cached_child():
    mgr, log = make(3, "oracle")
    s = hold(mgr, [1, 2, 3, 4])  # P = block 0, C = block 1
    x = hold(mgr, [5, 6])  # X = block 2
    mgr.release([s, x])
    mgr.set_next_use([0, 1, 2], [-1, 3, 7])
    for token in (7, 8, 9):
        hold(mgr, [token])
    # Leaves C (3) and X (7): X. Then C, the only leaf, though P is never used again.
    assert log.blocks == [2, 1, 0]


def test_oracle_next_use_reset_by_registration_not_by_hits():
    mgr, _ = make(4, "oracle")
    value = mgr._policy.value
    mgr.set_next_use([0], [42])  # a free block
    a = hold(mgr, [1, 2])  # block 0 registered
    assert value[0] == -1
    mgr.set_next_use([0], [7])
    r = mgr.admit([1, 2, 9], [3])
    assert r.num_cached_tokens.tolist() == [2] and value[0] == 7
    mgr.release([a, *r.ids])
    mgr.check()


# ---------------------------------------------------------------- rollback


@pytest.mark.parametrize("policy", SIMULATOR_POLICIES)
def test_failed_atomic_admit_restores_the_policy_state(policy):
    mgr, log = make(6, policy)
    use(mgr, [5, 6, 9], 3)  # block 0: [5, 6], two hits
    a = hold(mgr, [1, 2, 3, 4])  # blocks 1, 2 (2 is the child of 1)
    hold(mgr, [30, 31, 32, 33, 34, 35])  # blocks 3, 4, 5: the pool is full
    mgr.release([a])
    assert mgr.lru_blocks() == [0, 2, 1]
    if policy == "oracle":
        mgr.set_next_use([0, 1, 2], [4, 1, 1])
    before = frozen(mgr)
    # The first prompt claims blocks 1, 2 and evicts block 0 for its tail; the second finds
    # nothing left: the whole call is rolled back.
    prompts = [1, 2, 3, 4, 9, 7, 8, 9, 10, 11]
    with pytest.raises(PoolExhausted):
        mgr.admit(prompts, [5, 5])
    assert frozen(mgr) == before and log.blocks == []
    mgr.check()
    # The same call, not atomic, keeps the first prompt: the rollback had work to undo.
    assert mgr.admit(prompts, [5, 5], atomic=False).ok.tolist() == [True, False]
    after = frozen(mgr)
    assert log.blocks == [0] and after["_lru"] != before["_lru"]
    if policy != "lru":  # lru's state changes only when a block enters the cache
        assert after["_policy"] != before["_policy"]
    mgr.check()


# ---------------------------------------------------------------- random operations


def _keys(tokens, count):
    """Engine keys of the first ``count`` blocks of ``tokens``: a digest of each prefix."""
    rows = [
        [zlib.crc32(repr(tuple(tokens[: (j + 1) * 2])).encode()), 0, 0, 0] for j in range(count)
    ]
    return np.array(rows, dtype=np.uint64).reshape(count, 4)


# The calls of the random walk, the common ones listed more than once.
_OPS = ["admit", "admit", "append", "release", "release", "fork", "truncate"] * 2 + [
    "evict",
    "reset",
    "trim",
    "next_use",
]


def _random_step(mgr, live, rng, keyed):
    """One random call on ``mgr`` (``live``: its sequence ids); capacity errors are fine."""
    op = rng.choice(_OPS)
    try:
        if op == "admit":
            tokens, lengths = [], []
            for _ in range(rng.randint(1, 3)):
                family = rng.randrange(3)
                prompt = [10 * family + k for k in range(rng.randint(0, 6))]
                prompt += [40 + rng.randrange(3) for _ in range(rng.randint(1, 3))]
                tokens += prompt
                lengths.append(len(prompt))
            kw = {}
            if keyed:
                starts = np.cumsum([0, *lengths]).tolist()
                counts = [n // 2 for n in lengths]  # every full block keyed
                rows = [_keys(tokens[starts[k] :], c) for k, c in enumerate(counts)]
                kw = {"keys": np.concatenate(rows), "key_counts": counts}
            result = mgr.admit(tokens, lengths, atomic=rng.random() < 0.5, **kw)
            live += [s for s in result.ids.tolist() if s >= 0]
        elif op == "append" and live:
            seq = rng.choice(live)
            count = rng.randint(1, 3)
            mgr.append([seq], [count], [40 + rng.randrange(3) for _ in range(count)])
            if keyed:  # key the blocks filled since (decode), as an engine would
                tokens = mgr.seq_tokens(seq).tolist()
                full = len(tokens) // 2
                mgr.set_keys([seq], [0], [full], _keys(tokens, full))
        elif op == "release" and live:
            mgr.release([live.pop(rng.randrange(len(live)))])
        elif op == "fork" and live:
            live.append(int(mgr.fork([rng.choice(live)])[0, 0]))
        elif op == "truncate" and live:
            seq = rng.choice(live)
            mgr.truncate([seq], [rng.randint(0, int(mgr.seq_lens([seq])[0]))])
        elif op == "evict" and mgr.lru_blocks():
            cached = mgr.lru_blocks()
            mgr.evict(rng.sample(cached, min(2, len(cached))))
        elif op == "reset" and rng.random() < 0.3:
            mgr.reset_prefix_cache()
        elif op == "trim":
            mgr.trim()
        elif op == "next_use" and mgr.eviction == "oracle":
            blocks = rng.sample(range(mgr.num_blocks), 3)
            mgr.set_next_use(blocks, [rng.randint(-1, 20) for _ in blocks])
    except (PoolExhausted, TooManySequences, SequenceTooLong):
        pass


@pytest.mark.parametrize("mode", ["tokens", "keys", "pages"])
@pytest.mark.parametrize("policy", SIMULATOR_POLICIES)
def test_check_holds_after_random_operations(policy, mode):
    for seed in range(3):
        rng = random.Random(seed)
        kw = {"max_seqs": 6, "block_keys": mode == "keys"}
        if mode == "pages":
            pool = ReferencePagePool(6)
            mgrs = [make(8, policy, page_pool=pool, blocks_per_page=2, **kw)[0] for _ in range(2)]
        else:
            mgrs = [make(10, policy, **kw)[0]]
        live = [[] for _ in mgrs]
        for _ in range(300):
            i = rng.randrange(len(mgrs))
            _random_step(mgrs[i], live[i], rng, mode == "keys")
            for mgr in mgrs:
                mgr.check()
        evictions = sum(mgr.stats().evictions for mgr in mgrs)
        assert evictions > 20  # the policies did get to choose


# ---------------------------------------------------------------- planted bugs


def _forest(policy):
    """X = block 0 cached; P = 1 and its child C = 2 cached; D = 3 referenced."""
    mgr, _ = make(6, policy)
    x, s = hold(mgr, [7, 8]), hold(mgr, [1, 2, 3, 4])
    hold(mgr, [9, 10])
    mgr.release([x, s])
    assert mgr.lru_blocks() == [0, 2, 1]
    mgr.check()
    return mgr


def _swap_stamps(p):
    p.stamp[0], p.stamp[2] = p.stamp[2], p.stamp[0]


def _wrong_parent(p):
    p.kids[1].remove(2)
    p.kids[0].append(2)


def _dropped_orphan_flag(mgr):
    mgr.evict([1])
    mgr.check()  # C is an orphan now
    mgr._policy.orphan.discard(2)


@pytest.mark.parametrize(
    ("policy", "plant", "words"),
    [
        ("lru", _swap_stamps, "release stamps"),
        ("lfu", lambda p: p.prio.pop(2), "no priority"),
        ("lfu", lambda p: p.prio.__setitem__(3, 0), "not cached"),
        ("lfu", lambda p: setattr(p, "age", 1), "below the age"),
        ("sieve", lambda p: setattr(p, "hand", 3), "hand 3 is not a cached block"),
        ("leaf-lru", _wrong_parent, "linked under 0"),
        ("oracle", _wrong_parent, "linked under 0"),
        ("leaf-lru", lambda p: p.kids[1].append(2), "linked under 1 and 1"),
        ("leaf-lru", lambda p: p.kids[1].remove(2), "not linked under its parent 1"),
        ("leaf-lru", lambda p: p.kids[3].append(0), "block 0 is linked under 3"),
        ("leaf-lru", lambda p: p.orphan.add(3), "orphan 3 is not cached"),
        ("leaf-lru", lambda p: p.orphan.add(0), "root block 0"),
        ("leaf-lru", lambda p: p.gen.__setitem__(3, 2), "generation"),
        ("leaf-lru", lambda p: p.pgen.__setitem__(2, 7), "linked under 1, its parent link"),
        ("oracle", lambda p: p.value.__setitem__(0, -5), "next use below -1"),
    ],
)
def test_check_finds_planted_policy_bugs(policy, plant, words):
    mgr = _forest(policy)
    plant(mgr._policy)
    with pytest.raises(InvariantViolation, match=words):
        mgr.check()


@pytest.mark.parametrize("policy", ["leaf-lru", "oracle"])
def test_check_finds_a_dropped_orphan_flag(policy):
    mgr = _forest(policy)
    _dropped_orphan_flag(mgr)
    with pytest.raises(InvariantViolation, match="lost its parent 1 but is no orphan"):
        mgr.check()
