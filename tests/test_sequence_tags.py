"""Sequence tags (``set_sequence_tags``): a priority policy's ``tag`` feature given by request.

A tag set on a live sequence reaches the blocks that its release caches (``release``,
``truncate``, a window's drop), so a tenant, a conversation or a priority class set once per
request steers eviction. Proven on the kernels and on the reference model alike: the blocks a
tagged sequence leaves behind outlive older untagged ones, fork's children inherit the tag, a
slot forgets it when its sequence is released, a block's own ``set_tags`` still wins when it
comes later, bad input raises its typed error and changes nothing, and ``check()`` catches a
tag where none may be.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import njit

import kvnumba
from kvnumba._kernels.check import C_SEQ_TAG, MESSAGES
from kvnumba.priority import PriorityPolicy
from kvnumba.reference import ReferenceBlockManager

IMPLEMENTATIONS = (kvnumba.BlockManager, ReferenceBlockManager)


@njit
def _keep_tagged(f):
    # Tagged blocks after every untagged one, then release order: LRU within each class.
    return f.stamp + (1 << 40) * f.tag


KEEP_TAGGED = PriorityPolicy(_keep_tagged, name="keep-tagged")


class Victims:
    def __init__(self):
        self.ids: list[int] = []

    def __call__(self, ids, hashes, tokens):
        self.ids.extend(ids.tolist())


def _cache_four(mgr, tag_first=0):
    """Four one-block prompts admitted and released in order (blocks 0..3); the first one's
    sequence tagged ``tag_first`` before its release."""
    for token in range(4):
        (s,) = mgr.admit([token], [1]).ids
        if token == 0 and tag_first:
            mgr.set_sequence_tags([s], [tag_first])
        mgr.release([s])


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_a_tagged_release_protects_what_it_caches(cls):
    victims = Victims()
    mgr = cls(4, 1, eviction=KEEP_TAGGED, on_evict=victims)
    _cache_four(mgr, tag_first=1)  # block 0: the oldest release, but tagged
    mgr.admit([7, 8, 9], [3])
    assert victims.ids == [1, 2, 3]
    mgr.check()


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_without_a_tag_release_order_decides(cls):
    victims = Victims()
    mgr = cls(4, 1, eviction=KEEP_TAGGED, on_evict=victims)
    _cache_four(mgr)
    mgr.admit([7, 8, 9], [3])
    assert victims.ids == [0, 1, 2]


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_truncate_gives_the_tag_to_the_blocks_it_caches(cls):
    victims = Victims()
    mgr = cls(4, 1, eviction=KEEP_TAGGED, on_evict=victims)
    (long,) = mgr.admit([0, 1], [2]).ids  # blocks 0, 1
    mgr.set_sequence_tags([long], [5])
    mgr.truncate([long], [1])  # caches block 1, tagged
    for token in (2, 3):
        (s,) = mgr.admit([token], [1]).ids
        mgr.release([s])  # blocks 2, 3: newer, untagged
    mgr.admit([7, 8], [2])
    assert victims.ids == [2, 3]
    mgr.check()


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_fork_children_inherit_the_tag_and_release_forgets_it(cls):
    victims = Victims()
    mgr = cls(4, 1, eviction=KEEP_TAGGED, on_evict=victims)
    (parent,) = mgr.admit([0], [1]).ids  # block 0
    mgr.set_sequence_tags([parent], [2])
    (child,) = mgr.fork([parent], 1)[0]
    mgr.release([parent])  # block 0 still held by the child: nothing cached yet
    mgr.append([child], [1], tokens=[1])  # block 1 (a copy-free growth of the child)
    mgr.release([child])  # caches blocks 1 and 0 with the child's inherited tag
    (s,) = mgr.admit([2], [1]).ids  # block 2, in a slot that held a tagged sequence
    mgr.release([s])
    (s,) = mgr.admit([3], [1]).ids
    mgr.release([s])
    mgr.admit([7, 8], [2])
    assert victims.ids == [2, 3]  # the untagged newer releases go first
    mgr.check()


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
def test_a_later_block_tag_wins_and_zero_clears_a_sequence_tag(cls):
    victims = Victims()
    mgr = cls(4, 1, eviction=KEEP_TAGGED, on_evict=victims)
    (a,) = mgr.admit([0], [1]).ids
    (b,) = mgr.admit([1], [1]).ids
    mgr.set_sequence_tags([a, b, b], [3, 4, 0])  # b's later entry clears its tag
    mgr.release([a, b])  # block 0 tagged 3, block 1 untagged
    mgr.set_tags([0], [0])  # the block's own tag, set later, wins
    mgr.set_tags([1], [1])
    for token in (2, 3):
        (s,) = mgr.admit([token], [1]).ids
        mgr.release([s])
    mgr.admit([7, 8, 9], [3])
    assert victims.ids == [0, 2, 3]
    mgr.check()


def test_kernels_and_reference_agree_on_tagged_random_work():
    """Random admits, tags, forks, truncations and releases over a tiny alphabet: the same
    victims, in the same order, on both implementations."""
    runs = []
    for cls in IMPLEMENTATIONS:
        rng = np.random.default_rng(11)
        victims = Victims()
        mgr = cls(10, 2, eviction=KEEP_TAGGED, on_evict=victims)
        live: list[int] = []
        for _ in range(1500):
            roll = rng.random()
            if len(live) < 3 and roll < 0.45:
                tokens = rng.integers(0, 3, int(rng.integers(1, 9))).tolist()
                try:
                    live.append(int(mgr.admit(tokens, [len(tokens)]).ids[0]))
                except kvnumba.PoolExhausted:
                    pass
            elif live and roll < 0.6:
                mgr.set_sequence_tags([live[int(rng.integers(len(live)))]], [int(rng.integers(3))])
            elif live and roll < 0.65 and len(live) < 4:
                live.append(int(mgr.fork([live[int(rng.integers(len(live)))]], 1)[0, 0]))
            elif live and roll < 0.75:
                s = live[int(rng.integers(len(live)))]
                (length,) = mgr.seq_lens([s])
                mgr.truncate([s], [int(rng.integers(0, length + 1))])
            elif live:
                mgr.release([live.pop(int(rng.integers(len(live))))])
            mgr.check()
        runs.append((victims.ids, mgr.stats()))
    assert len(runs[0][0]) > 100
    assert runs[0] == runs[1]


def test_bad_input_raises_and_changes_nothing(assert_unchanged):
    for cls in IMPLEMENTATIONS:
        mgr = cls(4, 2, eviction=KEEP_TAGGED)
        (s,) = mgr.admit([0, 1], [2]).ids
        (gone,) = mgr.admit([5], [1]).ids
        mgr.release([gone])
        bad = [
            (([s, s], [1]), ValueError),
            (([s, gone], [1, 2]), kvnumba.SequenceReleased),
            (([s, 12345], [1, 2]), kvnumba.InvalidSequence),
            (([s], [1.5]), TypeError),
        ]
        for args, exc in bad:
            if cls is kvnumba.BlockManager:
                assert_unchanged(mgr, functools.partial(mgr.set_sequence_tags, *args), exc)
            else:
                with pytest.raises(exc):
                    mgr.set_sequence_tags(*args)
        mgr.check()


@pytest.mark.parametrize("cls", IMPLEMENTATIONS)
@pytest.mark.parametrize("eviction", ["lru", "lfu", "leaf-lru"])
def test_a_policy_that_reads_no_tags_refuses_them(cls, eviction):
    mgr = cls(4, 1, eviction=eviction)
    (s,) = mgr.admit([0], [1]).ids
    with pytest.raises(ValueError, match="priority policy"):
        mgr.set_sequence_tags([s], [1])


def test_check_catches_a_tag_on_a_free_slot():
    mgr = kvnumba.BlockManager(4, 2, eviction=KEEP_TAGGED)
    (s,) = mgr.admit([0], [1]).ids
    mgr.set_sequence_tags([s], [9])
    mgr.check()
    mgr.release([s])
    mgr._arenas.s.seq_tag[1] = 9  # slot 1 was never taken
    with pytest.raises(kvnumba.InvariantViolation) as info:
        mgr.check()
    assert str(info.value) == MESSAGES[C_SEQ_TAG].format(a=1, b=9)


def test_the_docs_tenant_example_tags_what_the_request_leaves_behind():
    """The example of ``docs/eviction.md`` runs as written and tags the cached blocks."""
    from pathlib import Path

    from kvnumba._layout import FT_TAG, M_FEATURE_COL
    from kvnumba.priority import priority_policy

    text = (Path(__file__).parents[1] / "docs" / "eviction.md").read_text()
    example = text.split("A tag set once per request")[1].split("```python\n")[1].split("```")[0]
    prompt = list(range(40))  # two full blocks of 16 and a partial one
    space = {"kvnumba": kvnumba, "priority_policy": priority_policy, "prompt": prompt}
    exec(compile(example, "docs/eviction.md", "exec"), space)
    mgr = space["mgr"]
    assert mgr.stats().cached == 2
    tag_column = mgr.state.meta[M_FEATURE_COL + FT_TAG]
    assert mgr.state.pol_words[:2, tag_column].tolist() == [2, 2]
    mgr.check()
