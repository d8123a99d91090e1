"""Eviction policies of the model: which cached block an allocation reclaims.

``docs/eviction.md`` describes the policies; this module is their executable rule book. The
manager keeps the cached blocks on ``_lru`` (release order, oldest first) for every policy and
tells its policy object what happens to blocks through a few hooks:

* :meth:`LruPolicy.registered` / :meth:`LruPolicy.unregistered`: a block got or lost its entry
  in the prefix table (``registered`` gets the block's parent in the prefix forest and its
  position in its sequence);
* :meth:`LruPolicy.entered` / :meth:`LruPolicy.leaving`: a block was released into the cache /
  is about to leave it (claimed by a hit or evicted), while it is still on ``_lru``;
* :meth:`LruPolicy.hit`: a block was a prefix hit of an admitted prompt;
* :meth:`LruPolicy.victim`: pick the block an allocation evicts (and commit to it: the manager
  evicts it right away).

Each policy is a dataclass whose fields are its whole state, so that ``==`` compares two
states and :meth:`LruPolicy.copy` snapshots one for the rollback of a failed call. Victims are
found by plain scans (``min`` over the candidates): the model favours clarity, the kernels use
heaps and intrusive lists for the same choice.

Parent markers of the leaf policies: :data:`ROOT` (a sequence's first block, or a keyed block
whose previous block is not registered) and :data:`ORPHAN_AT_BIRTH` (registered while no block
held its parent's content: an orphan whenever it is cached).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Any, ClassVar, TypeVar

#: Parent of a block with no parent in the prefix forest.
ROOT = -1
#: Parent of a block registered while its parent's content was registered nowhere.
ORPHAN_AT_BIRTH = -2
#: Oracle keys of orphans and of blocks never used again (below every ``-next_use``).
_ORACLE_ORPHAN = -(2**62) - 1
_ORACLE_NEVER = -(2**62)


def _successor(lru, block: int) -> int | None:
    """The block after ``block`` in release order, ``None`` if it is the newest."""
    order = list(lru)
    i = order.index(block) + 1
    return order[i] if i < len(order) else None


P = TypeVar("P", bound="LruPolicy")


@dataclass(kw_only=True)
class LruPolicy:
    """``lru``: evict the least recently released cached block (the head of ``_lru``).

    The base of every policy: it keeps the release stamps, which the other policies use to
    break ties (smallest stamp first).

    Attributes
    ----------
    stamp : list of int
        Per block, the value of ``clock`` at its latest release into the cache.
    clock : int
        Releases into the cache so far (the next stamp).
    """

    name: ClassVar[str] = "lru"
    stamp: list[int] = field(repr=False)
    clock: int = 0
    #: Tokens of the sequence being released (the manager sets it before releasing blocks; a
    #: priority policy's ``length`` feature), not part of the state.
    release_len: int = field(default=0, repr=False, compare=False)
    #: ... and its tag (``set_sequence_tags``; 0: none), given to the blocks it caches.
    release_tag: int = field(default=0, repr=False, compare=False)

    def releasing(self, length: int, tag: int) -> None:
        """A sequence of ``length`` tokens and tag ``tag`` is about to release blocks: what a
        priority policy sees of the blocks this caches."""
        self.release_len, self.release_tag = length, tag

    @classmethod
    def new(cls: type[P], num_blocks: int) -> P:
        """The policy's state for a fresh pool of ``num_blocks`` blocks."""
        return cls(**cls._fresh(num_blocks))

    @classmethod
    def _fresh(cls, num_blocks: int) -> dict:
        """The initial values of the per-block fields (the others have defaults)."""
        return {"stamp": [-1] * num_blocks}

    def copy(self: P) -> P:
        """A copy sharing no mutable container with this state (a rollback snapshot)."""
        clone = copy.copy(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (list, dict, set)):
                setattr(clone, f.name, value.copy())
        return clone

    # ------------------------------------------------------------------ hooks

    def registered(self, block: int, parent: int, pos: int) -> None:
        """``block`` got its entry in the prefix table at position ``pos`` of its sequence;
        ``parent``: see the module notes."""

    def unregistered(self, block: int) -> None:
        """``block`` lost its entry in the prefix table (evicted or unhashed)."""

    def entered(self, block: int) -> None:
        """``block`` was released into the cache (it is the newest entry of ``_lru``)."""
        self.stamp[block] = self.clock
        self.clock += 1

    def leaving(self, block: int, lru) -> None:
        """``block`` is about to leave the cache (claimed or evicted); it is still on ``lru``."""

    def hit(self, block: int) -> None:
        """``block`` is a prefix hit of a prompt being admitted."""

    def victim(self, lru) -> int:
        """The cached block an allocation evicts now (``lru`` is not empty)."""
        return next(iter(lru))

    # ------------------------------------------------------------------ check

    def check(self, lru, is_registered: Callable[[int], bool], fail: Callable) -> None:
        """Call ``fail(message)`` at the first inconsistency of the policy's state."""
        stamps = [self.stamp[b] for b in lru]
        if any(a >= b for a, b in pairwise([*stamps, self.clock])):
            fail(f"release stamps {stamps} of the cached blocks do not increase below the clock")


@dataclass(kw_only=True)
class HitCounting(LruPolicy):
    """Base of the policies that count prefix hits per block (``lfu``, ``sieve``).

    Attributes
    ----------
    value : list of int
        Per block, its prefix hits since it was registered (``sieve``'s hand clears it).
    """

    value: list[int] = field(repr=False)

    @classmethod
    def _fresh(cls, num_blocks: int) -> dict:
        return {**super()._fresh(num_blocks), "value": [0] * num_blocks}

    def registered(self, block: int, parent: int, pos: int) -> None:
        self.value[block] = 0

    def hit(self, block: int) -> None:
        self.value[block] += 1


@dataclass(kw_only=True)
class LfuPolicy(HitCounting):
    """``lfu``: LFU with dynamic aging; evict the smallest ``(prio, stamp)``.

    Attributes
    ----------
    value : list of int
        Per block, its prefix hits since it was registered.
    prio : dict of int to int
        Per cached block, ``age + value`` at its release into the cache.
    age : int
        The priority of the latest victim of an allocation (explicit evictions leave it).
    """

    name: ClassVar[str] = "lfu"
    prio: dict[int, int] = field(default_factory=dict, repr=False)
    age: int = 0

    def entered(self, block: int) -> None:
        super().entered(block)
        self.prio[block] = self.age + self.value[block]

    def leaving(self, block: int, lru) -> None:
        del self.prio[block]

    def victim(self, lru) -> int:
        block = min(lru, key=lambda b: (self.prio[b], self.stamp[b]))
        self.age = self.prio[block]  # aging: only an allocation's victim moves the age
        return block

    def check(self, lru, is_registered, fail) -> None:
        super().check(lru, is_registered, fail)
        for block in lru:
            if block not in self.prio:
                fail(f"lfu: cached block {block} has no priority")
        for block, prio in self.prio.items():
            if block not in lru:
                fail(f"lfu: block {block} has a priority but is not cached")
            if prio < self.age:  # every victim had the smallest priority
                fail(f"lfu: cached block {block} has priority {prio} below the age {self.age}")
        if self.age < 0 or min(self.value, default=0) < 0:
            fail(f"lfu: negative age {self.age} or hit count")


@dataclass(kw_only=True)
class SievePolicy(HitCounting):
    """``sieve``: SIEVE's hand over the release order; evict the first block not hit since the
    hand last passed it.

    Attributes
    ----------
    value : list of int
        Per block, its prefix hits since it was registered or since the hand last passed it
        (> 0: the visited bit).
    hand : int or None
        The cached block the next search starts from; ``None``: the oldest.
    """

    name: ClassVar[str] = "sieve"
    hand: int | None = None

    def leaving(self, block: int, lru) -> None:
        if self.hand == block:
            self.hand = _successor(lru, block)

    def victim(self, lru) -> int:
        order = list(lru)
        i = 0 if self.hand is None else order.index(self.hand)
        while self.value[order[i]] > 0:  # a second chance, once per pass of the hand
            self.value[order[i]] = 0
            i = (i + 1) % len(order)
        # The hand rests on the victim, so its eviction moves the hand to the next block.
        self.hand = order[i]
        return order[i]

    def check(self, lru, is_registered, fail) -> None:
        super().check(lru, is_registered, fail)
        if self.hand is not None and self.hand not in lru:
            fail(f"sieve: the hand {self.hand} is not a cached block")
        if min(self.value, default=0) < 0:
            fail("sieve: a negative hit count")


L = TypeVar("L", bound="LeafLruPolicy")


@dataclass(kw_only=True)
class LeafLruPolicy(LruPolicy):
    """``leaf-lru``: evict the leaf of the cached prefix forest with the smallest
    ``(key, stamp)``, the key being -1 for an orphan and 0 otherwise.

    A cached block is linked under its parent when its parent link is valid (the parent is
    still in the registration it had when the block was registered), an orphan when the link
    is not, and neither when it is a root.

    Attributes
    ----------
    gen : list of int
        Per block, its registrations plus unregistrations (odd: registered now).
    parent : list of int
        Per block, its parent at its latest registration (a block, ``ROOT`` or
        ``ORPHAN_AT_BIRTH``).
    pgen : list of int
        Per block, ``gen[parent]`` at its latest registration (0 without a parent block).
    kids : list of list of int
        Per block, its cached children linked under it.
    orphan : set of int
        The cached orphans.
    """

    name: ClassVar[str] = "leaf-lru"
    gen: list[int] = field(repr=False)
    parent: list[int] = field(repr=False)
    pgen: list[int] = field(repr=False)
    kids: list[list[int]] = field(repr=False)
    orphan: set[int] = field(default_factory=set)

    @classmethod
    def _fresh(cls, num_blocks: int) -> dict:
        return {
            **super()._fresh(num_blocks),
            "gen": [0] * num_blocks,
            "parent": [ROOT] * num_blocks,
            "pgen": [0] * num_blocks,
            "kids": [[] for _ in range(num_blocks)],
        }

    def copy(self: L) -> L:
        clone = super().copy()
        clone.kids = [list(k) for k in self.kids]
        return clone

    def _valid(self, block: int) -> bool:
        """Whether ``block``'s parent is a block still in the registration it was linked to."""
        p = self.parent[block]
        return p >= 0 and self.gen[p] == self.pgen[block]

    def _key(self, block: int) -> int:
        return -1 if block in self.orphan else 0

    def registered(self, block: int, parent: int, pos: int) -> None:
        self.gen[block] += 1
        self.parent[block] = parent
        self.pgen[block] = self.gen[parent] if parent >= 0 else 0

    def unregistered(self, block: int) -> None:
        # A new generation invalidates every link to this registration; cached children lose
        # their parent now (referenced ones when they are released).
        self.gen[block] += 1
        self.orphan.update(self.kids[block])
        self.kids[block] = []

    def entered(self, block: int) -> None:
        super().entered(block)
        if self.parent[block] == ROOT:
            return
        if self._valid(block):
            self.kids[self.parent[block]].append(block)
        else:
            self.orphan.add(block)

    def leaving(self, block: int, lru) -> None:
        p = self.parent[block]
        if p >= 0 and block in self.kids[p]:
            self.kids[p].remove(block)
        self.orphan.discard(block)

    def victim(self, lru) -> int:
        leaves = (b for b in lru if not self.kids[b])
        return min(leaves, key=lambda b: (self._key(b), self.stamp[b]))

    def check(self, lru, is_registered, fail) -> None:
        super().check(lru, is_registered, fail)
        for block, gen in enumerate(self.gen):
            if gen % 2 != is_registered(block):
                fail(
                    f"{self.name}: block {block} has generation {gen} but is_registered is {is_registered(block)}"
                )
        for block in self.orphan:
            if block not in lru:
                fail(f"{self.name}: orphan {block} is not cached")
        listed: dict[int, int] = {}
        for p, kids in enumerate(self.kids):
            for child in kids:
                if child in listed:
                    fail(f"{self.name}: block {child} is linked under {listed[child]} and {p}")
                listed[child] = p
                if child not in lru:
                    fail(f"{self.name}: block {child} is linked under {p} but not cached")
                if self.parent[child] != p or not self._valid(child):
                    fail(
                        f"{self.name}: block {child} is linked under {p}, its parent link is "
                        f"{self.parent[child]} (generation {self.pgen[child]})"
                    )
        for block in lru:
            p = self.parent[block]
            if p == ROOT:
                if block in listed or block in self.orphan:
                    fail(f"{self.name}: root block {block} is linked or an orphan")
            elif self._valid(block):
                if listed.get(block) != p or block in self.orphan:
                    fail(f"{self.name}: cached block {block} is not linked under its parent {p}")
            elif block not in self.orphan:
                fail(f"{self.name}: cached block {block} lost its parent {p} but is no orphan")


@dataclass(kw_only=True)
class OraclePolicy(LeafLruPolicy):
    """``oracle`` (simulator only): among the leaves, orphans first, then blocks never used
    again, then the furthest next use; ties: smallest stamp.

    Attributes
    ----------
    value : list of int
        Per block, the next use :meth:`set_next_use` gave it (-1: never used again); -1 when
        registered.
    """

    name: ClassVar[str] = "oracle"
    value: list[int] = field(repr=False)

    @classmethod
    def _fresh(cls, num_blocks: int) -> dict:
        return {**super()._fresh(num_blocks), "value": [-1] * num_blocks}

    def set_next_use(self, block: int, next_use: int) -> None:
        """Record ``block``'s next use (-1: never used again)."""
        self.value[block] = next_use

    def registered(self, block: int, parent: int, pos: int) -> None:
        super().registered(block, parent, pos)
        self.value[block] = -1

    def _key(self, block: int) -> int:
        if block in self.orphan:
            return _ORACLE_ORPHAN
        if self.value[block] < 0:
            return _ORACLE_NEVER
        return -self.value[block]

    def check(self, lru, is_registered, fail) -> None:
        super().check(lru, is_registered, fail)
        if min(self.value, default=-1) < -1:
            fail("oracle: a next use below -1")


@dataclass(kw_only=True)
class PriorityRulePolicy(LeafLruPolicy):
    """A priority policy (``kvnumba.priority``): evict the candidate with the smallest
    ``(key, stamp)``, the key being the policy's priority of the block's features when it was
    last computed. Candidates: every cached block, or only the leaves (``leaves_only``).

    The key is computed when the block is released into the cache and again, while it is
    cached, when it becomes an orphan, when its hint or tag is set, and (not ``leaves_only``)
    when a child of it enters or leaves the cache.

    Attributes
    ----------
    name : str
        The policy's name.
    rule : PriorityPolicy
        The policy; its function is called as Python.
    hits, hint, tag, length, depth : list of int
        Per block, its features (``kvnumba.priority.BlockFeatures``).
    key : dict of int to int
        Per cached block, its key.
    age : int
        The largest key of an allocation's victim so far (0 before the first).
    """

    # Per instance here (the policy is the user's), per class for the built-in policies.
    name: str = ""  # type: ignore[misc]
    rule: Any = field(default=None, repr=False, compare=False)
    hits: list[int] = field(repr=False)
    hint: list[int] = field(repr=False)
    tag: list[int] = field(repr=False)
    length: list[int] = field(repr=False)
    depth: list[int] = field(repr=False)
    key: dict[int, int] = field(default_factory=dict, repr=False)
    age: int = 0
    block_size: int = 0

    @classmethod
    def _fresh(cls, num_blocks: int) -> dict:
        return {
            **super()._fresh(num_blocks),
            "hits": [0] * num_blocks,
            "hint": [0] * num_blocks,
            "tag": [0] * num_blocks,
            "length": [0] * num_blocks,
            "depth": [0] * num_blocks,
        }

    def _features(self, block: int):
        from kvnumba.priority import BlockFeatures

        return BlockFeatures(
            block=block,
            hits=self.hits[block],
            stamp=self.stamp[block],
            clock=self.clock,
            age=self.age,
            depth=self.depth[block],
            children=len(self.kids[block]),
            orphan=int(block in self.orphan),
            next_use=self.hint[block],
            tag=self.tag[block],
            length=self.length[block],
            block_size=self.block_size,
        )

    def _rekey(self, block: int) -> None:
        if block in self.key:  # cached
            self.key[block] = self.rule.python_priority(self._features(block))

    def registered(self, block: int, parent: int, pos: int) -> None:
        super().registered(block, parent, pos)
        self.hits[block], self.hint[block], self.tag[block] = 0, -1, 0
        self.depth[block] = pos

    def unregistered(self, block: int) -> None:
        orphaned = self.kids[block]
        super().unregistered(block)
        for child in orphaned:
            self._rekey(child)

    def hit(self, block: int) -> None:
        self.hits[block] += 1

    def entered(self, block: int) -> None:
        super().entered(block)
        self.length[block] = self.release_len
        if self.release_tag:
            self.tag[block] = self.release_tag
        p = self.parent[block]
        if not self.rule.leaves_only and p >= 0 and block in self.kids[p]:
            self._rekey(p)
        self.key[block] = 0
        self._rekey(block)

    def leaving(self, block: int, lru) -> None:
        p = self.parent[block]
        linked = p >= 0 and block in self.kids[p]
        super().leaving(block, lru)
        del self.key[block]
        if linked and not self.rule.leaves_only:
            self._rekey(p)

    def victim(self, lru) -> int:
        candidates = (b for b in lru if not (self.rule.leaves_only and self.kids[b]))
        block = min(candidates, key=lambda b: (self.key[b], self.stamp[b]))
        self.age = max(self.age, self.key[block])
        return block

    def set_next_use(self, block: int, next_use: int) -> None:
        """Record ``block``'s next-use hint."""
        self.hint[block] = next_use
        self._rekey(block)

    def set_tag(self, block: int, tag: int) -> None:
        """Record ``block``'s tag."""
        self.tag[block] = tag
        self._rekey(block)

    def check(self, lru, is_registered, fail) -> None:
        super().check(lru, is_registered, fail)
        if set(self.key) != set(lru):
            fail(f"{self.name}: keys {sorted(self.key)} are not those of the cached blocks")
        if self.age < 0:
            fail(f"{self.name}: negative age {self.age}")


_POLICIES = {p.name: p for p in (LruPolicy, LfuPolicy, SievePolicy, LeafLruPolicy, OraclePolicy)}


def make_policy(eviction, num_blocks: int, block_size: int = 0) -> LruPolicy:
    """The fresh state of policy ``eviction`` (already validated by ``kvnumba.eviction``): a
    built-in name, or a priority policy (an object or what names one)."""
    from kvnumba.eviction import is_priority_spec
    from kvnumba.priority import resolve

    if is_priority_spec(eviction):
        rule = resolve(eviction)
        state = PriorityRulePolicy.new(num_blocks)
        state.name, state.rule, state.block_size = rule.name, rule, block_size
        return state
    return _POLICIES[eviction].new(num_blocks)
