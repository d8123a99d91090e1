"""Priority policies (``kvnumba.priority``): a user's function over block features, compiled into
the kernels' policy machinery.

The differential run and the stateful machines draw the test-file policies of
``tests/user_policies.py``; this file proves the rest: a priority written as a built-in policy's
rule chooses the built-in's victims, the simulator feeds a hindsight priority the future, the
shipped policies follow their stated rules, planted bugs are caught, bad input is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit
from user_policies import AGING_LEAVES, every_feature

import kvnumba
from kvnumba.eviction import needs_future, policy_code, policy_name
from kvnumba.priority import BlockFeatures, PriorityPolicy, priority_policy, resolve
from kvnumba.reference import ReferenceBlockManager
from kvnumba.sim import Request, SimConfig, simulate

TESTS = Path(__file__).parent


@njit
def _as_lru(f):
    return f.stamp


@njit
def _as_leaf_lru(f):
    return -1 if f.orphan else 0


AS_LRU = PriorityPolicy(_as_lru, name="as-lru")
AS_LEAF_LRU = PriorityPolicy(_as_leaf_lru, name="as-leaf-lru", leaves_only=True)


@priority_policy("as-oracle", leaves_only=True, hindsight=True)
def as_oracle(f):
    """The simulator's ``oracle`` rule written as a priority (its keys, in the same order)."""
    if f.orphan:
        return -(1 << 62) - 1
    if f.next_use < 0:
        return -(1 << 62)
    return -f.next_use


def _workload(mgr, seed, steps=1500):
    """Random admits of prompts over a tiny alphabet and releases; returns the evicted ids."""
    rng = np.random.default_rng(seed)
    live = []
    for _ in range(steps):
        if len(live) < 3 and rng.random() < 0.55:
            tokens = rng.integers(0, 2, int(rng.integers(1, 9))).tolist()
            try:
                live.append(int(mgr.admit(tokens, [len(tokens)]).ids[0]))
            except kvnumba.PoolExhausted:
                pass
        elif live:
            mgr.release([live.pop(int(rng.integers(len(live))))])
        mgr.check()
    return mgr


class Victims:
    def __init__(self):
        self.ids = []

    def __call__(self, ids, hashes, tokens):
        self.ids.extend(ids.tolist())


@pytest.mark.parametrize(("priority", "builtin"), [(AS_LRU, "lru"), (AS_LEAF_LRU, "leaf-lru")])
def test_a_builtin_rule_written_as_a_priority_evicts_the_same_blocks(priority, builtin):
    seen = {}
    for eviction in (priority, builtin):
        victims = Victims()
        mgr = _workload(kvnumba.BlockManager(10, 2, eviction=eviction, on_evict=victims), 5)
        seen[policy_name(eviction)] = (victims.ids, mgr.stats())
    (ours, our_stats), (theirs, their_stats) = seen.values()
    assert len(ours) > 100 and ours == theirs
    assert our_stats == their_stats


def test_kernels_and_reference_agree_on_a_test_file_policy():
    for policy in (every_feature, AGING_LEAVES):
        victims = [Victims(), Victims()]
        kv = _workload(kvnumba.BlockManager(9, 2, eviction=policy, on_evict=victims[0]), 8)
        ref = _workload(ReferenceBlockManager(9, 2, eviction=policy, on_evict=victims[1]), 8)
        assert victims[0].ids == victims[1].ids and len(victims[0].ids) > 100
        assert kv.stats() == ref.stats() and kv.eviction == ref.eviction == policy.name


def _trace(n=120, seed=3):
    """Requests sharing prefixes of Mooncake-style block hashes (prompts of 2-6 blocks)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        root = int(rng.integers(0, 6))
        blocks = [root * 100 + j for j in range(int(rng.integers(2, 7)))]
        out.append(
            Request(
                index=i,
                arrival_ms=float(i * 5),
                prompt_len=len(blocks) * 16,
                output_len=8,
                hash_ids=np.array(blocks, np.int64),
            )
        )
    return out


def test_the_simulator_gives_a_hindsight_priority_the_oracles_hints():
    requests = _trace()
    results = {}
    for eviction in ("oracle", as_oracle):
        r = simulate(requests, SimConfig(num_blocks=24, block_size=16, eviction=eviction))
        results[policy_name(eviction)] = r.summary()
    oracle, ours = results["oracle"], results["as-oracle"]
    assert ours["eviction"] == "as-oracle" and oracle["evictions"] > 20
    for field in ("evictions", "prefix_hit_rate", "prefill_tokens_computed", "preemptions"):
        assert ours[field] == oracle[field], field


def test_a_hindsight_priority_is_a_simulator_option_only():
    assert needs_future(as_oracle) and not needs_future(AS_LRU)
    with pytest.raises(ValueError, match="hindsight"):
        kvnumba.BlockManager(8, 2, eviction=as_oracle)
    assert policy_code(as_oracle, hindsight=True) == policy_code("t-lru")


def test_a_policy_is_named_by_module_and_attribute(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert resolve("user_policies:AGING_LEAVES") is AGING_LEAVES
    mgr = kvnumba.BlockManager(8, 2, eviction="user_policies:AGING_LEAVES")
    assert mgr.eviction == "aging-leaves"
    for bad, words in (
        ("no_such_module:x", "cannot load"),
        ("user_policies:nothing", "cannot load"),
        ("user_policies:USER_POLICIES", "not a PriorityPolicy"),
    ):
        with pytest.raises(ValueError, match=words):
            kvnumba.BlockManager(8, 2, eviction=bad)


def test_bad_policies_are_refused():
    with pytest.raises(TypeError, match="callable"):
        PriorityPolicy(3, name="x")
    for name in ("", "lru", "leaf-lru", None):
        with pytest.raises(ValueError, match="name"):
            PriorityPolicy(_as_lru, name=name)
    with pytest.raises(ValueError, match="no priority policy"):
        resolve("not-a-policy")


def test_tags_and_hints_reorder_cached_blocks_at_once():
    """A tag set on a cached block re-keys it now: the block tagged 'keep' outlives older ones."""

    @njit
    def keep_tagged(f):
        return f.stamp + (1 << 40) * f.tag

    policy = PriorityPolicy(keep_tagged, name="keep-tagged")
    for cls in (kvnumba.BlockManager, ReferenceBlockManager):
        victims = Victims()
        mgr = cls(4, 1, eviction=policy, on_evict=victims)
        for token in range(4):
            (s,) = mgr.admit([token], [1]).ids
            mgr.release([s])
        mgr.set_tags([0], [1])  # block 0, the oldest release
        mgr.admit([7, 8, 9], [3])
        assert victims.ids == [1, 2, 3], cls
        mgr.check()
        with pytest.raises(ValueError, match="entries|tags"):
            mgr.set_tags([0, 1], [1])
        with pytest.raises(ValueError, match="outside|in \\["):
            mgr.set_tags([4], [1])


def test_t_lru_evicts_what_the_next_turn_can_recompute_first():
    """Two conversations of 8 one-token blocks; with Q = 0 and xi = 3 tokens only the last
    three blocks of each are safe: they go first, oldest release first, then LRU order."""
    from kvnumba.policies import t_lru

    policy = t_lru(next_query_tokens=0, slo_tokens=3)
    for cls in (kvnumba.BlockManager, ReferenceBlockManager):
        victims = Victims()
        mgr = cls(16, 1, eviction=policy, on_evict=victims)
        a = mgr.admit(list(range(8)), [8]).ids
        b = mgr.admit(list(range(100, 108)), [8]).ids
        mgr.release(b)
        mgr.release(a)  # b's blocks are older releases
        mgr.admit(list(range(200, 208)), [8])
        tables = {"a": list(range(0, 8)), "b": list(range(8, 16))}
        safe = [tables["b"][j] for j in (7, 6, 5)] + [tables["a"][j] for j in (7, 6, 5)]
        assert victims.ids[:6] == safe, cls
        # Then the protected ones in release order: b's (released first), tail to head.
        assert victims.ids[6:8] == [tables["b"][4], tables["b"][3]], cls


def test_gdsf_keeps_the_deeper_leaf_where_lru_and_leaf_lfu_evict_it():
    """A five-block prompt's last block (depth 4) and a one-block prompt's (depth 0), released
    in that order, neither hit: LRU and leaf-lfu evict the older release, the deep one; gdsf
    evicts the shallow one, whose tokens are cheaper to compute again."""
    expected = {"gdsf": [5, 4], "leaf-lfu": [4, 3], "lru": [4, 3]}
    for name, victims_expected in expected.items():
        for cls in (kvnumba.BlockManager, ReferenceBlockManager):
            victims = Victims()
            mgr = cls(6, 1, eviction=name, on_evict=victims)
            a = mgr.admit(list(range(5)), [5]).ids
            b = mgr.admit([100], [1]).ids
            mgr.release(a)
            mgr.release(b)
            mgr.admit([200], [1])
            mgr.admit([201], [1])
            assert victims.ids == victims_expected, (name, cls)
            mgr.check()


def test_rlt_evicts_leaves_only_and_is_reproducible():
    runs = []
    for cls in (kvnumba.BlockManager, kvnumba.BlockManager, ReferenceBlockManager):
        victims = Victims()
        _workload(cls(10, 2, eviction="rlt", on_evict=victims), 11)
        runs.append(victims.ids)
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) > 100


_PLANTED = """
import numpy as np
import kvnumba
from kvnumba.priority import PriorityPolicy

bug = {bug!r}
mgr = None

def watch(f):
    # Run as Python (NUMBA_DISABLE_JIT): the kernels' state is readable while they run.
    s = mgr.state
    if s.ref[f.block] != 0 or not s.block_flags[f.block] & 4:
        print("priority of a block that is not cached:", f.block)
    if bug == "garbage":
        return (f.block * 7919 + f.clock * 104729) % 1000003 - 500000
    return -(1 << 62) if f.block % 2 else (1 << 62)

mgr = kvnumba.BlockManager(10, 2, eviction=PriorityPolicy(watch, name="watch"))
rng = np.random.default_rng(2)
live = []
for step in range(400):
    if len(live) < 3 and rng.random() < 0.55:
        t = rng.integers(0, 2, int(rng.integers(1, 9))).tolist()
        try:
            live.append(int(mgr.admit(t, [len(t)]).ids[0]))
        except kvnumba.PoolExhausted:
            pass
    elif live:
        mgr.release([live.pop(int(rng.integers(len(live))))])
    mgr.check()
print("evictions", mgr.stats().evictions)
"""


@pytest.mark.parametrize("bug", ["garbage", "extremes"])
def test_a_priority_sees_only_cached_blocks_and_cannot_evict_a_referenced_one(bug):
    """Whatever a priority returns (scrambled keys, the int64 extremes), it is called for cached
    blocks only (it never sees a freed or referenced block: the kernels write the record from
    cached blocks' state) and the victim is a candidate: ``check()`` after every step."""
    script = textwrap.dedent(_PLANTED.format(bug=bug))
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, NUMBA_DISABLE_JIT="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "not cached" not in out.stdout
    assert int(out.stdout.split()[-1]) > 50


@njit
def _newest_first(f):
    return -f.stamp


def _six_cached(function, name):
    """A manager under priority ``function`` whose six blocks were cached one by one, checked,
    and its writable state views (as a bug in a kernel would write)."""
    mgr = kvnumba.BlockManager(8, 1, eviction=PriorityPolicy(function, name=name))
    for token in range(6):
        (s,) = mgr.admit([token], [1]).ids
        mgr.release([s])
    mgr.check()
    return mgr, mgr._arenas.s


def test_a_planted_heap_bug_under_a_priority_policy_is_caught():
    """A corrupted key (a block sorted before its heap parent) is reported by ``check()``.

    Newest first: each key is below every earlier one, so after the two runs took one block
    each the others go to the heap."""
    from kvnumba._layout import L_HEAP, M_HEAP_N, W_KEY

    mgr, state = _six_cached(_newest_first, "newest")
    assert state.meta[M_HEAP_N] == 4
    child = state.pol_links[1, L_HEAP]
    state.pol_words[child, W_KEY] = -(1 << 60)
    with pytest.raises(kvnumba.InvariantViolation, match="heap"):
        mgr.check()


@pytest.mark.parametrize("where", ["order", "hand", "mark"])
def test_a_planted_run_bug_under_a_priority_policy_is_caught(where):
    """A run out of release-key order, a hand that is not the run's oldest block, or a block
    marked in both runs is reported by ``check()``."""
    from kvnumba._layout import F_RUN1, M_HEAP_N, M_RUN_HAND, W_KEY

    mgr, state = _six_cached(_as_lru, "stamp")
    assert state.meta[M_HEAP_N] == 0  # keys grow with release: all six in run 0
    oldest = state.meta[M_RUN_HAND]
    second = state.lru_next[oldest]
    if where == "order":
        state.pol_words[second, W_KEY] = state.pol_words[oldest, W_KEY] - 1
        match = "out of order"
    elif where == "hand":
        state.meta[M_RUN_HAND] = second
        match = "out of order"
    else:
        state.block_flags[second] |= F_RUN1
        match = "policy flags"
    with pytest.raises(kvnumba.InvariantViolation, match=match):
        mgr.check()


def test_t_lru_keeps_its_blocks_in_two_runs_not_the_heap():
    """T-LRU's keys are the release stamp, offset for protected blocks: each class grows with
    release order, so every cached block waits in one of the two runs and no eviction walks a
    heap; the victims stay the reference model's (the differential run)."""
    from kvnumba._layout import M_HEAP_N, M_RUN_HAND, NUM_RUNS
    from kvnumba.policies import t_lru

    # 16-token prompts of 4-token blocks: the first two blocks protected, the last two not.
    mgr = kvnumba.BlockManager(64, 4, eviction=t_lru(next_query_tokens=0, slo_tokens=8))
    for i in range(20):  # 80 blocks through a pool of 64: evictions from both runs
        (s,) = mgr.admit(np.arange(16) + 100 * i, [16]).ids
        mgr.release([s])
        mgr.check()
    state = mgr._arenas.s
    assert mgr.stats().evictions > 0
    assert state.meta[M_HEAP_N] == 0
    assert all(state.meta[M_RUN_HAND + r] >= 0 for r in range(NUM_RUNS))


def _stamp_only(f):
    return f.stamp


def _passes_f_on(f):
    return _stamp_only(f)


def _aliases_f(f):
    g = f
    return g.hits


def _indexes_f(f):
    return f[2] + f.depth


def _captures_f(f):
    return (lambda: f.hits)()


def _branches(f):
    return f.stamp if f.children else f.depth + f.orphan


def _stores_then_reads(f):
    return (base := 100) * f.hits + base  # Python 3.13 fuses the store with the load of f


def _loads_two(f):
    x = 2
    return x + f.tag  # Python 3.13 loads x and f in one instruction


def _reads_then_loads(f):
    x = 3
    return f.depth + x


def _rebinds_f(f):
    x = f
    f = x
    return f.hits


EVERY = set(BlockFeatures._fields)


@pytest.mark.parametrize(
    ("fn", "reads"),
    [
        (_stamp_only, {"stamp"}),
        (_branches, {"stamp", "children", "depth", "orphan"}),
        (_passes_f_on, EVERY),  # what the callee reads is not looked at: all
        (_aliases_f, EVERY),
        (_indexes_f, EVERY),
        (_captures_f, EVERY),
        (_stores_then_reads, {"hits"}),
        (_loads_two, {"tag"}),
        (_reads_then_loads, {"depth"}),
        (_rebinds_f, EVERY),
    ],
)
def test_features_read_never_leave_out_what_the_function_uses(fn, reads):
    assert PriorityPolicy(fn, name="p").features_read() == reads


class _Recorder:
    """A feature record that notes every feature read and answers with ``value``."""

    def __init__(self, value):
        self.value, self.seen = value, set()

    def __getattr__(self, name):
        self.seen.add(name)
        return self.value


def test_every_feature_a_policy_reads_is_one_it_stores():
    """The kernels keep only the features ``features_read`` names, so a read it missed would
    see a placeholder: every attribute each function reads, called as Python on records of
    several values (through every branch of these), is among them."""
    from user_policies import USER_POLICIES

    from kvnumba.policies import SHIPPED

    functions = [_stamp_only, _branches, _stores_then_reads, _loads_two, _reads_then_loads]
    policies = [*SHIPPED.values(), *USER_POLICIES, AS_LRU, AS_LEAF_LRU, as_oracle]
    functions += [getattr(p.priority, "py_func", p.priority) for p in policies]
    for fn in functions:
        reads = PriorityPolicy(fn, name="p").features_read()
        for value in (-1, 0, 1, 7, 1 << 33):
            record = _Recorder(value)
            try:
                fn(record)
            except ArithmeticError:  # a division by a feature of 0: what it read still counts
                pass
            assert record.seen <= reads, (fn.__name__, record.seen - reads)


def test_rekey_triggers_are_the_features_read_or_all_with_a_clock():
    from kvnumba._layout import REKEY_CHILDREN, REKEY_NEXT_USE, REKEY_ORPHAN, REKEY_TAG
    from kvnumba.policies import SHIPPED

    every = REKEY_CHILDREN | REKEY_ORPHAN | REKEY_NEXT_USE | REKEY_TAG
    assert PriorityPolicy(_stamp_only, name="p").rekey_triggers() == 0
    assert PriorityPolicy(_branches, name="p").rekey_triggers() == REKEY_CHILDREN | REKEY_ORPHAN
    assert PriorityPolicy(lambda f: f.tag + f.next_use, name="p").rekey_triggers() == (
        REKEY_TAG | REKEY_NEXT_USE
    )
    assert PriorityPolicy(lambda f: f.clock, name="p").rekey_triggers() == every
    assert PriorityPolicy(lambda f: f.age - f.stamp, name="p").rekey_triggers() == every
    assert SHIPPED["t-lru"].rekey_triggers() == 0  # stamp, depth, length: fixed while cached
    assert SHIPPED["rlt"].rekey_triggers() == every


def test_only_a_policy_that_reads_the_forest_keeps_it():
    """The cached prefix forest costs its links (24 bytes a block) and its upkeep only under a
    policy that reads what depends on it; without, the kernels choose the reference model's
    victims all the same (the model keeps its forest), and ``check()`` holds."""
    from kvnumba._layout import HEAP_LINKS, POL_LINKS
    from kvnumba.policies import SHIPPED

    assert not SHIPPED["t-lru"].needs_forest()
    assert SHIPPED["rlt"].needs_forest() and SHIPPED["gdsf"].needs_forest()  # leaves only
    assert PriorityPolicy(_branches, name="p").needs_forest()  # reads orphan and children
    assert PriorityPolicy(lambda f: f.clock, name="p").needs_forest()  # keyed at every change
    assert not PriorityPolicy(lambda f: f.tag + f.depth, name="p").needs_forest()
    widths = {}
    for policy in (SHIPPED["t-lru"], AS_LRU, every_feature, AS_LEAF_LRU):
        victims = [Victims(), Victims()]
        kv = _workload(kvnumba.BlockManager(9, 2, eviction=policy, on_evict=victims[0]), 4)
        ref = _workload(ReferenceBlockManager(9, 2, eviction=policy, on_evict=victims[1]), 4)
        assert victims[0].ids == victims[1].ids and len(victims[0].ids) > 100, policy.name
        assert kv.stats() == ref.stats()
        widths[policy.name] = kv.state.pol_links.shape[1]
    assert widths == {
        "t-lru": HEAP_LINKS,
        "as-lru": HEAP_LINKS,
        every_feature.name: POL_LINKS,
        "as-leaf-lru": POL_LINKS,
    }


@priority_policy("hits-then-tag")
def _hits_then_tag(f):
    return f.hits * 1000 + f.tag * 10 + f.stamp % 10


def test_a_block_keeps_only_the_features_its_priority_reads():
    """A stored feature (hits, next-use hint, tag, length, depth) costs its 8 bytes a block
    only under a policy whose function reads it; a tag or hint set for one that does not is
    dropped, and the victims stay the reference model's, which keeps every feature."""
    from kvnumba._layout import FT_HITS, FT_TAG, HEAP_WORDS, M_FEATURE_COL
    from kvnumba.policies import SHIPPED

    widths = {}
    for policy in (AS_LRU, SHIPPED["t-lru"], _hits_then_tag, every_feature):
        victims = [Victims(), Victims()]
        sides = []
        for cls, sink in zip((kvnumba.BlockManager, ReferenceBlockManager), victims, strict=True):
            mgr = cls(9, 2, eviction=policy, on_evict=sink)
            ids = mgr.admit([0, 1, 0, 1, 1], [5]).ids
            mgr.set_sequence_tags(ids, [3])
            mgr.set_tags([0, 1], [7, 4])
            mgr.set_next_use([0], [5])
            mgr.release(ids)
            sides.append(_workload(mgr, 6))
        assert victims[0].ids == victims[1].ids and len(victims[0].ids) > 100, policy.name
        assert sides[0].stats() == sides[1].stats()
        widths[policy.name] = sides[0].state.pol_words.shape[1]
    assert widths == {
        "as-lru": HEAP_WORDS,  # key and stamp
        "t-lru": HEAP_WORDS + 2,  # length and depth
        "hits-then-tag": HEAP_WORDS + 2,
        every_feature.name: HEAP_WORDS + 5,
    }
    meta = kvnumba.BlockManager(4, 2, eviction=_hits_then_tag).state.meta
    assert meta[M_FEATURE_COL + FT_HITS] == HEAP_WORDS
    assert meta[M_FEATURE_COL + FT_TAG] == HEAP_WORDS + 1
    assert [meta[M_FEATURE_COL + i] for i in range(5)].count(-1) == 3


def test_check_refuses_an_orphan_mark_without_the_forest():
    mgr = kvnumba.BlockManager(4, 1, eviction=AS_LRU)
    mgr.release(mgr.admit([1, 2], [2]).ids)
    mgr.check()
    from kvnumba._layout import F_ORPHAN

    mgr._arenas.s.block_flags[1] |= F_ORPHAN  # planted: no forest, so no block is an orphan
    with pytest.raises(kvnumba.InvariantViolation, match="flag"):
        mgr.check()


def test_features_are_documented_in_record_order():
    from kvnumba.priority import FEATURES, NUM_FEATURES

    assert FEATURES == BlockFeatures._fields and NUM_FEATURES == 12
    doc = BlockFeatures.__doc__
    assert all(name in doc for name in FEATURES)


def test_the_tutorials_policy_runs_as_the_docs_say(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS.parent / "docs" / "examples"))
    victims = [Victims(), Victims()]
    spec = "tutorial_policy:shallow_first"
    kv = _workload(kvnumba.BlockManager(10, 2, eviction=spec, on_evict=victims[0]), 4)
    ref = _workload(ReferenceBlockManager(10, 2, eviction=spec, on_evict=victims[1]), 4)
    assert kv.eviction == "shallow-first" and victims[0].ids == victims[1].ids
    assert kv.stats() == ref.stats() and len(victims[0].ids) > 100
