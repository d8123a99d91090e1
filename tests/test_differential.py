"""Randomized differential test: the kernels against the pure-Python reference, op by op.

At least 200,000 operations per run, in two set-ups that alternate round by round, each round
with a fresh small geometry (so that eviction, copy-on-write, pool misses, page mapping and
sibling reclaim happen often):

- a plain manager (no page pool), with ``on_evict``;
- two managers on one ``PagePool``, with ``on_evict`` per manager and the pool's ``on_map`` /
  ``on_unmap``.

Every manager draws its eviction policy (``kvnumba.eviction``: every ``BlockManager`` policy, the
simulator's ``oracle``, which also gets random next-use hints, and three priority policies of a
user, defined in ``user_policies.py``, which get random hints and tags), so the run covers each policy in both set-ups,
and both sides must choose the same victims: the kernels call the compiled priority, the
reference its Python function.

After every call both sides agree on the outcome (result arrays, exception type, and
``needed`` / ``available`` of ``PoolExhausted``), on every callback delivered (in order), on
stats, sequence lengths, block tables, LRU order, and with a pool on its free stack, owner
table, clock and each manager's cache-only pages with their stamps; every manager (both sides)
and pool passes ``check()``.
After every failed call the state arenas of every manager and of the pool are byte-identical to
before the call.

The bulk is a plain Python loop driven by a numpy ``Generator`` (hypothesis would spend most of
the time budget in data generation). Each run draws a new seed and prints it; set
``KVNUMBA_DIFF_SEED`` to replay a run. Sequence ids are compared through a pairing of the two
sides' ids, never by value, so the test does not depend on how either side encodes ids.
"""

from __future__ import annotations

import collections
import os

import numpy as np

# The state machines' views of kernel state that the reference exposes directly.
from test_stateful import lru_order
from test_stateful_pages import kernel_cache_only, kernel_owners, reference_owners
from user_policies import AGING_LEAVES, every_feature, parents_last

import kvnumba
from kvnumba import KVCacheGroup
from kvnumba.eviction import BUILTIN_POLICIES, HINDSIGHT_POLICIES, SIMULATOR_POLICIES
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool

#: The policies a manager draws from.
POLICIES = (*SIMULATOR_POLICIES, every_feature, AGING_LEAVES, parents_last)
POLICY_NAMES = (*SIMULATOR_POLICIES, *(p.name for p in (every_feature, AGING_LEAVES, parents_last)))

MIN_OPERATIONS = 200_000
ROUND = 2_000  # operations per geometry; rounds alternate between the two set-ups
ALPHABET = 3  # a tiny token alphabet, so that equal prefixes (and cache hits) are common


class Events:
    """Every callback of one side, in the order they fire; taken after each call."""

    def __init__(self):
        self.calls = []

    def evict(self, who):
        def hook(ids, hashes, tokens):
            assert ids.dtype == np.int64 and hashes.dtype == np.uint64
            assert tokens.dtype == np.int64
            # The two sides hash differently: compare block ids and payload, not hashes.
            self.calls.append(("evict", who, ids.tolist(), tokens.tolist()))

        return hook

    def pages(self, what):
        def hook(physical, virtual):
            assert physical.dtype == np.int64 and virtual.dtype == np.int64
            self.calls.append((what, physical.tolist(), virtual.tolist()))

        return hook

    def take(self):
        calls, self.calls = self.calls, []
        return calls


class Side:
    """One implementation: its managers (and pool), and the callbacks they delivered."""

    def __init__(self, manager_cls, pool_cls, geometries, pool_pages):
        self.events = Events()
        self.pool = None
        if pool_pages:
            self.pool = pool_cls(
                pool_pages, on_map=self.events.pages("map"), on_unmap=self.events.pages("unmap")
            )
        self.managers = []
        for who, (num_blocks, block_size, kwargs) in enumerate(geometries):
            if self.pool is not None:
                kwargs = dict(kwargs, page_pool=self.pool)
            self.managers.append(
                manager_cls(num_blocks, block_size, on_evict=self.events.evict(who), **kwargs)
            )

    def arenas(self) -> list[bytes]:
        """Every state arena of the kernel side, as bytes (manager arenas, then the pool)."""
        out = [m._arenas.arena.tobytes() for m in self.managers]
        if self.pool is not None:
            out.append(self.pool.arena.tobytes())
        return out


def random_kind(rng, block_size: int) -> dict:
    """Full attention, a sliding window (shorter or longer than a block) or chunked local
    attention of one to three blocks a chunk, about equally often."""
    draw = rng.random()
    if draw < 0.35:
        return {}
    if draw < 0.7:
        return {"sliding_window": int(rng.integers(1, 3 * block_size + 2))}
    return {"attention_chunk_size": block_size * int(rng.integers(1, 4))}


def random_window(rng, block_size: int) -> dict:
    """Full attention for about 40% of the managers, one windowed kind for 40%, and two or
    three KV cache groups over the one pool (a hybrid model's) for the rest."""
    draw = rng.random()
    if draw < 0.4:
        return {}
    if draw < 0.8:
        kind = random_kind(rng, block_size) or {"sliding_window": block_size + 1}
    else:
        groups = [{}] + [random_kind(rng, block_size) for _ in range(int(rng.integers(1, 3)))]
        kind = {"kv_cache_groups": [KVCacheGroup(**kind) for kind in groups]}
    # Now and then the engine releases out-of-window blocks itself (release_window).
    if rng.random() < 0.3:
        kind["window_release"] = "explicit"
    return kind


def random_geometries(rng, paged: bool):
    """Small managers: a few blocks, short sequences, a pool smaller than their sum."""
    count = 2 if paged else 1
    geometries = []
    for _ in range(count):
        block_size = int(rng.integers(1, 5))
        kwargs = dict(
            max_seqs=int(rng.integers(3, 9)),
            max_seq_len=int(rng.integers(2, 7)) * block_size + int(rng.integers(0, 3)),
            prefix_caching=bool(rng.random() < 0.85),
            eviction=POLICIES[int(rng.integers(0, len(POLICIES)))],
            # A full block equal to a registered one is registered too, as vLLM does.
            cache_duplicates=bool(rng.random() < 0.3),
        )
        kwargs["_hindsight"] = kwargs["eviction"] in HINDSIGHT_POLICIES
        kwargs.update(random_window(rng, block_size))
        if paged:
            k = int(rng.integers(1, 5))
            kwargs["blocks_per_page"] = k
            num_blocks = k * int(rng.integers(1, 6))
        else:
            num_blocks = int(rng.integers(2, 17))
        geometries.append((num_blocks, block_size, kwargs))
    pool_pages = int(rng.integers(2, 7)) if paged else 0
    return geometries, pool_pages


class Differential:
    """Drives both sides with the same random calls and compares them after each one."""

    def __init__(self, rng, paged: bool):
        self.rng = rng
        geometries, pool_pages = random_geometries(rng, paged)
        self.setup = (geometries, pool_pages)
        self.kv = Side(kvnumba.BlockManager, kvnumba.PagePool, geometries, pool_pages)
        self.ref = Side(ReferenceBlockManager, ReferencePagePool, geometries, pool_pages)
        # Live sequences per manager, as (kernel id, reference id) pairs.
        self.live = [[] for _ in geometries]
        self.released = [[] for _ in geometries]  # a few released pairs, for stale-id calls
        self.counts = collections.Counter()
        self.twins = [set() for _ in geometries]  # per manager: the reference's twin blocks

    # ------------------------------------------------------------------------------ drawing
    def pick(self, who, most=3):
        """A few distinct live pairs of manager ``who`` (possibly none)."""
        live = self.live[who]
        if not live:
            return []
        n = int(self.rng.integers(0, min(most, len(live)) + 1))
        return [live[i] for i in self.rng.choice(len(live), n, replace=False)]

    def tokens(self, n):
        return self.rng.integers(0, ALPHABET, n).tolist()

    # ---------------------------------------------------------------------------- one call
    def both(self, who, call, kv_args, ref_args, **kwargs):
        """Run ``call`` on manager ``who`` of both sides; returns the two results or None."""
        before = self.kv.arenas()
        pages_before = [m.stats().mapped_pages for m in self.kv.managers]
        outcome = []
        for side, args in ((self.kv, kv_args), (self.ref, ref_args)):
            try:
                outcome.append((True, getattr(side.managers[who], call)(*args, **kwargs)))
            except kvnumba.KVNumbaError as exc:
                outcome.append((False, exc))
        (kv_ok, kv_value), (ref_ok, ref_value) = outcome
        assert kv_ok == ref_ok, f"{call}: kernels {kv_value!r}, reference {ref_value!r}"
        events = self.kv.events.take()
        assert events == self.ref.events.take(), f"{call}: callbacks differ"
        self.counts.update(f"{event[0]} callback" for event in events)
        if kv_ok:
            self.counts[call] += 1
            pages_after = [m.stats().mapped_pages for m in self.kv.managers]
            others = [i for i in range(len(pages_after)) if i != who]
            if call in ("append", "admit") and any(
                pages_after[i] < pages_before[i] for i in others
            ):
                self.counts["sibling reclaim"] += 1
            return kv_value, ref_value
        self.counts[f"{call} raised {type(kv_value).__name__}"] += 1
        assert type(kv_value) is type(ref_value), f"{call}: {kv_value!r} vs {ref_value!r}"
        if isinstance(kv_value, kvnumba.PoolExhausted):
            assert (kv_value.needed, kv_value.available) == (ref_value.needed, ref_value.available)
        after = self.kv.arenas()
        for i, (x, y) in enumerate(zip(before, after, strict=True)):
            assert x == y, f"failed {call} changed arena {i} (managers, then the pool)"
        return None

    @staticmethod
    def same_ids(kv_ids, ref_ids):
        """Ids of one result: the same failures (-1) in the same places; returns the pairs."""
        kv_ids, ref_ids = np.ravel(kv_ids).tolist(), np.ravel(ref_ids).tolist()
        assert [i == -1 for i in kv_ids] == [i == -1 for i in ref_ids]
        return [(k, r) for k, r in zip(kv_ids, ref_ids, strict=True) if k != -1]

    # ------------------------------------------------------------------------------ calls
    def new_sequences(self, who):
        count = int(self.rng.integers(1, 3))
        out = self.both(who, "new_sequences", (count,), (count,))
        if out:
            self.live[who] += self.same_ids(*out)

    def append(self, who):
        pairs = self.pick(who)
        counts = self.rng.integers(0, 6, len(pairs)).tolist()
        tokens = self.tokens(sum(counts)) if self.rng.random() < 0.7 else None
        atomic = bool(self.rng.random() < 0.6)
        out = self.both(
            who,
            "append",
            ([k for k, _ in pairs], counts, tokens),
            ([r for _, r in pairs], counts, tokens),
            atomic=atomic,
        )
        if out:
            for field, a, b in zip(out[0]._fields, *out, strict=True):
                assert np.array_equal(a, b), f"append: {field} differs"
            self.counts["copy-on-write"] += len(out[0].cow_src) > 0

    def admit(self, who):
        n = int(self.rng.integers(1, 4))
        # Mostly prompts that fit; now and then one may be a token or two too long.
        longest = self.kv.managers[who].max_seq_len + 2 * (self.rng.random() < 0.15)
        lengths = self.rng.integers(1, longest + 1, n).tolist()
        tokens = self.tokens(sum(lengths))
        kwargs = {"atomic": bool(self.rng.random() < 0.6)}
        if self.rng.random() < 0.2:
            kwargs["salts"] = self.rng.integers(0, 2, n).tolist()
        out = self.both(who, "admit", (tokens, lengths), (tokens, lengths), **kwargs)
        if out:
            kv, ref = out
            for field in ("num_cached_tokens", "slot_mapping", "ok"):
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), f"admit: {field}"
            self.live[who] += self.same_ids(kv.ids, ref.ids)
            self.count_window_hits(who, kv)

    def count_window_hits(self, who, result):
        """Count admitted prompts whose hit starts past a released position: the window rule
        reused blocks behind a gap (what a full-attention lookup could not); and hits of
        prompts admitted into several KV cache groups."""
        mgr = self.kv.managers[who]
        rows = np.reshape(result.ids, (len(result.num_cached_tokens), -1))
        for ids, cached in zip(rows, result.num_cached_tokens, strict=True):
            hit = int(cached) // mgr.block_size
            if ids[0] == -1 or hit == 0:
                continue
            if len(ids) > 1:
                self.counts["admit hit in several KV cache groups"] += 1
            for row in mgr.block_tables(ids)[:, :hit]:
                if row[0] == kvnumba.NULL_BLOCK and (row >= 0).any():
                    self.counts["admit hit across a window"] += 1

    def fork(self, who):
        pairs = self.pick(who, 2)
        n = int(self.rng.integers(1, 3))
        out = self.both(who, "fork", ([k for k, _ in pairs], n), ([r for _, r in pairs], n))
        if out:
            assert out[0].shape == out[1].shape == (len(pairs), n)
            self.live[who] += self.same_ids(*out)

    def release(self, who, pairs=None):
        pairs = self.pick(who) if pairs is None else pairs
        self.both(who, "release", ([k for k, _ in pairs],), ([r for _, r in pairs],))
        for pair in pairs:
            self.live[who].remove(pair)
        self.released[who] = (self.released[who] + pairs)[-4:]

    def release_all(self, who):
        self.release(who, list(self.live[who]))

    def can_append(self, who):
        pairs = self.pick(who)
        counts = self.rng.integers(0, 9, len(pairs)).tolist()
        kv_ids, ref_ids = [k for k, _ in pairs], [r for _, r in pairs]
        out = self.both(who, "can_append", (kv_ids, counts), (ref_ids, counts))
        if out:
            assert out[0] == out[1], "can_append differs"

    def release_window(self, who):
        """Release out-of-window blocks at a length up to each sequence's (the stateful
        machines try the lengths out of range)."""
        pairs = self.pick(who)
        lengths = [
            int(self.rng.integers(0, self.kv.managers[who].seq_lens([k])[0] + 1)) for k, _ in pairs
        ]
        kv_ids, ref_ids = [k for k, _ in pairs], [r for _, r in pairs]
        out = self.both(who, "release_window", (kv_ids, lengths), (ref_ids, lengths))
        if out:
            assert out[0] == out[1], "release_window differs"
            self.counts["release_window released blocks"] += out[0] > 0

    def trim(self, who):
        out = self.both(who, "trim", (), ())
        if out:
            assert out[0] == out[1], "trim differs"

    def stale(self, who):
        """A call with a released id: ``InvalidSequence`` on both sides, nothing changed."""
        if not self.released[who]:
            return
        k, r = self.released[who][int(self.rng.integers(0, len(self.released[who])))]
        call = ("append", "release", "fork")[int(self.rng.integers(0, 3))]
        args = {"append": lambda i: ([i], [1]), "release": lambda i: ([i],)}
        make = args.get(call, lambda i: ([i], 1))
        assert self.both(who, call, make(k), make(r)) is None, f"{call} took a released id"

    def hint(self, who):
        """Next-use hints of the ``oracle`` policy, hints and tags of the priority policies."""
        kv = self.kv.managers[who]
        if kv.eviction in BUILTIN_POLICIES:
            return  # they take neither
        n = int(self.rng.integers(1, 4))
        blocks = self.rng.integers(0, kv.num_blocks, n).tolist()
        uses = self.rng.integers(-1, 30, n).tolist()
        roll = self.rng.random()
        if kv.eviction in HINDSIGHT_POLICIES or roll < 0.4:
            kv.set_next_use(blocks, uses)
            self.ref.managers[who].set_next_use(blocks, uses)
            self.counts[f"{'oracle' if kv.eviction == 'oracle' else 'priority'} hint"] += 1
        elif roll < 0.7:
            pairs = self.pick(who)
            tags = self.rng.integers(0, 4, len(pairs)).tolist()
            self.both(
                who,
                "set_sequence_tags",
                ([k for k, _ in pairs], tags),
                ([r for _, r in pairs], tags),
            )
            self.counts["priority sequence tag"] += 1
        else:
            kv.set_tags(blocks, uses)
            self.ref.managers[who].set_tags(blocks, uses)
            self.counts["priority tag"] += 1

    OPERATIONS = (
        # (method, weight): appends and admits dominate, as in an engine's step loop
        ("append", 30),
        ("admit", 20),
        ("release", 12),
        ("new_sequences", 8),
        ("fork", 8),
        ("can_append", 10),
        ("release_all", 4),
        ("trim", 4),
        ("release_window", 4),
        ("stale", 4),
        ("hint", 4),
    )

    # ---------------------------------------------------------------------------- compare
    def agree(self):
        """Both sides in the same state; every manager and the pool pass ``check()``."""
        for who, (kv, ref) in enumerate(zip(self.kv.managers, self.ref.managers, strict=True)):
            kv.check()
            ref.check()
            assert kv.stats() == ref.stats(), f"manager {who}: stats differ"
            assert lru_order(kv) == ref.lru_blocks(), f"manager {who}: LRU order differs"
            # Duplicates (cache_duplicates): a copy registered beside the first block of its
            # key, and a copy that took the first's place when that left (what lookups find).
            twins = {b for copies in ref._twins.values() for b in copies}
            self.counts["duplicate registered"] += len(twins) > 0
            self.counts["duplicate promoted"] += len(self.twins[who] & set(ref._prefix.values()))
            self.twins[who] = twins
            live = self.live[who]
            if live:
                kv_ids, ref_ids = [k for k, _ in live], [r for _, r in live]
                assert np.array_equal(kv.seq_lens(kv_ids), ref.seq_lens(ref_ids))
                tables = kv.block_tables(kv_ids)
                assert np.array_equal(tables, ref.block_tables(ref_ids))
                if (tables == kvnumba.NULL_BLOCK).any():
                    self.counts["window released blocks"] += 1
            if self.kv.pool is not None:
                assert np.array_equal(kv.mapped_pages(), ref.mapped_pages())
                assert kernel_cache_only(kv) == ref.cache_only_pages(), f"manager {who}"
        pool, ref_pool = self.kv.pool, self.ref.pool
        if pool is not None:
            pool.check()
            assert pool.state.free[: pool.num_free].tolist() == ref_pool.free_pages()
            assert pool.clock == ref_pool.clock
            assert kernel_owners(pool, self.kv.managers) == reference_owners(
                ref_pool, self.ref.managers
            )

    def run(self, operations: int, history: collections.deque) -> None:
        names = [name for name, _ in self.OPERATIONS]
        weights = np.array([w for _, w in self.OPERATIONS], dtype=float)
        draws = self.rng.choice(len(names), operations, p=weights / weights.sum())
        whos = self.rng.integers(0, len(self.live), operations)
        for step in range(operations):
            name, who = names[draws[step]], int(whos[step])
            history.append((name, who))
            getattr(self, name)(who)
            self.agree()


def test_differential_against_the_reference(capsys):
    seed = int(os.environ.get("KVNUMBA_DIFF_SEED", np.random.SeedSequence().entropy))
    rng = np.random.default_rng(seed)
    counts = collections.Counter()
    n = rounds = 0
    while n < MIN_OPERATIONS:
        paged = rounds % 2 == 1
        diff = Differential(rng, paged)
        history = collections.deque(maxlen=12)
        try:
            diff.run(ROUND, history)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\nKVNUMBA_DIFF_SEED={seed}, round {rounds} ({'paged' if paged else 'plain'}"
                f" {diff.setup}), last calls (name, manager): {list(history)}"
            ) from exc
        counts.update(diff.counts)
        for manager in diff.kv.managers:
            counts[f"evictions under {manager.eviction}"] += manager.stats().evictions
        n += ROUND
        rounds += 1
    with capsys.disabled():  # the count shows in every run, not only with -s
        print(f"\ndifferential: {n} operations in {rounds} rounds, seed {seed}")
        print("differential outcomes:", dict(sorted(counts.items())))
    assert n >= MIN_OPERATIONS
    # The mix must reach the paths it is here for; a change that made them unreachable
    # would otherwise pass quietly.
    for outcome in (
        *(f"evictions under {name}" for name in POLICY_NAMES),
        "oracle hint",
        "priority hint",
        "priority tag",
        "append raised PoolExhausted",
        "admit raised PoolExhausted",
        "append raised SequenceReleased",
        "fork raised SequenceReleased",
        "admit raised SequenceTooLong",
        "new_sequences raised TooManySequences",
        "trim",
        "copy-on-write",
        "window released blocks",
        "admit hit across a window",
        "admit hit in several KV cache groups",
        "release_window released blocks",
        "duplicate registered",
        "duplicate promoted",
        "sibling reclaim",
        "evict callback",
        "map callback",
        "unmap callback",
    ):
        assert counts[outcome] > 0, f"no {outcome!r} in {n} operations"
