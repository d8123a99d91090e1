"""Random traffic against the kernels and the pure-Python reference model, step by step.

Small pools and small token alphabets make exhaustion, eviction, copy-on-write and prefix hits
frequent. After every step both sides must agree on everything observable (ids, block tables,
payload, refcounts, free-stack and LRU order, counters), both must pass ``check()``, and every
failed call must leave the kernels' state arrays byte-identical.
"""

from __future__ import annotations

import numpy as np
from conftest import examples
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from user_policies import USER_POLICIES

import kvnumba
from kvnumba import KVCacheGroup
from kvnumba._layout import F_TRIMMED, M_LRU_HEAD, NIL
from kvnumba.eviction import BUILTIN_POLICIES, EVICTION_POLICIES
from kvnumba.reference import ReferenceBlockManager
from kvnumba.state import free_blocks
from kvnumba.windows import first_needed_block

TOKENS = st.integers(0, 2)  # a tiny alphabet, so equal prefixes (and cache hits) are common


def lru_order(mgr):
    """Cached blocks of the kernels' LRU list, head first."""
    state = mgr.state
    order, b = [], int(state.meta[M_LRU_HEAD])
    while b != NIL:
        order.append(b)
        b = int(state.lru_next[b])
    return order


def assert_same_state(before, after):
    for name, a, b in zip(before._fields, before, after, strict=True):
        assert np.array_equal(a, b), f"state field {name} changed by a failed call"


class Evictions:
    """An ``on_evict`` hook that keeps every call's report."""

    def __init__(self):
        self.calls = []

    def __call__(self, ids, hashes, tokens):
        assert ids.dtype == np.int64 and hashes.dtype == np.uint64 and tokens.dtype == np.int64
        self.calls.append((ids.tolist(), tokens.tolist()))


def kinds(block_size: int):
    """Full attention, a sliding window (shorter or longer than a block) or chunked local
    attention, as ``BlockManager`` keywords."""
    return st.one_of(
        st.just({}),
        st.builds(lambda w: {"sliding_window": w}, st.integers(1, 3 * block_size + 1)),
        st.builds(lambda c: {"attention_chunk_size": c * block_size}, st.integers(1, 3)),
    )


def windows(block_size: int):
    """The attention kind of a machine's managers (``docs/windows.md``): full attention, one
    windowed kind, or a full-attention KV cache group and one or two others over one pool."""
    groups = st.lists(kinds(block_size), min_size=1, max_size=2).map(
        lambda rest: {"kv_cache_groups": [KVCacheGroup(**kind) for kind in [{}, *rest]]}
    )
    # Now and then the engine releases out-of-window blocks itself (release_window).
    release = st.sampled_from([{}, {}, {"window_release": "explicit"}])
    return st.builds(
        lambda kind, how: {**kind, **how},
        st.one_of(st.just({}), kinds(block_size), groups),
        release,
    )


class KernelsVersusReference(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(3, 24),
        block_size=st.sampled_from([1, 2, 3, 4]),
        max_seqs=st.integers(3, 10),
        prefix_caching=st.booleans(),
        reserved_blocks=st.sampled_from([0, 0, 1, 2]),
        eviction=st.sampled_from((*EVICTION_POLICIES, *USER_POLICIES)),
        data=st.data(),
    )
    def setup(
        self, num_blocks, block_size, max_seqs, prefix_caching, reserved_blocks, eviction, data
    ):
        max_seq_len = 6 * block_size + 2
        self.evicted_kv, self.evicted_ref = Evictions(), Evictions()
        geometry = dict(
            max_seqs=max_seqs,
            max_seq_len=max_seq_len,
            prefix_caching=prefix_caching,
            reserved_blocks=reserved_blocks,
            eviction=eviction,
            cache_duplicates=data.draw(st.booleans(), label="cache_duplicates"),
            **data.draw(windows(block_size)),
        )
        self.kv = kvnumba.BlockManager(num_blocks, block_size, on_evict=self.evicted_kv, **geometry)
        # The same id tag: both sides hand out the same ids.
        self.ref = ReferenceBlockManager(
            num_blocks, block_size, on_evict=self.evicted_ref, id_tag=self.kv.id_tag, **geometry
        )
        self.live: list[int] = []
        self.dead: list[int] = []

    # -------------------------------------------------------------------------------- helpers
    def both(self, call, *args, **kwargs):
        """Run one call on both sides; they must agree on success or on the error type."""
        return self.pair(call, lambda mgr: getattr(mgr, call)(*args, **kwargs))

    def pair(self, call, run, run_ref=None):
        """``run(kv)`` and ``(run_ref or run)(ref)``, compared as :meth:`both` does."""
        before = self.kv.snapshot()
        outcome = []
        for mgr, fn in ((self.kv, run), (self.ref, run_ref or run)):
            try:
                outcome.append(("ok", fn(mgr)))
            except (kvnumba.KVNumbaError, ValueError) as exc:  # bad input: ValueError
                outcome.append(("error", exc))
        (kv_kind, kv_value), (ref_kind, ref_value) = outcome
        assert kv_kind == ref_kind, f"{call}: kernels {kv_value!r} vs reference {ref_value!r}"
        if kv_kind == "error":
            event(f"{call} raised {type(kv_value).__name__}")
            assert type(kv_value) is type(ref_value)
            if isinstance(kv_value, kvnumba.PoolExhausted):
                assert (kv_value.needed, kv_value.available) == (
                    ref_value.needed,
                    ref_value.available,
                )
            assert_same_state(before, self.kv.snapshot())
            return None, None
        return kv_value, ref_value

    def pick(self, data, allow_dead=False):
        pool = self.live + (self.dead if allow_dead else [])
        if not pool:
            return []
        return data.draw(st.lists(st.sampled_from(pool), max_size=4, unique=True))

    # ---------------------------------------------------------------------------------- rules
    @rule(count=st.integers(0, 2))
    def new_sequences(self, count):
        kv, ref = self.both("new_sequences", count)
        if kv is not None:
            assert kv.tolist() == ref.tolist()
            self.live += kv.ravel().tolist()  # one column per KV cache group with several

    @rule(data=st.data(), with_tokens=st.booleans(), atomic=st.booleans())
    def append(self, data, with_tokens, atomic):
        ids = self.pick(data, allow_dead=data.draw(st.booleans()))
        counts = data.draw(st.lists(st.integers(0, 5), min_size=len(ids), max_size=len(ids)))
        tokens = data.draw(st.lists(TOKENS, min_size=sum(counts), max_size=sum(counts)))
        kv, ref = self.both("append", ids, counts, tokens if with_tokens else None, atomic=atomic)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field
            if kv.cow_src.size:
                event("append copied a shared tail")
            if not kv.ok.all():
                event("append: a sequence did not fit")

    @rule(data=st.data(), atomic=st.booleans())
    def admit(self, data, atomic):
        prompts = data.draw(
            st.lists(st.lists(TOKENS, min_size=1, max_size=14), min_size=1, max_size=3)
        )
        salts = data.draw(
            st.lists(st.sampled_from([0, 0, 1]), min_size=len(prompts), max_size=len(prompts))
        )
        tokens = [t for p in prompts for t in p]
        lengths = [len(p) for p in prompts]
        kv, ref = self.both("admit", tokens, lengths, salts=salts, atomic=atomic)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field
            self.live += [i for i in kv.ids.ravel().tolist() if i >= 0]
            if kv.num_cached_tokens.any():
                event("admit reused cached blocks")
            if not kv.ok.all():
                event("admit: a prompt did not fit")

    @rule(data=st.data(), n=st.integers(1, 2))
    def fork(self, data, n):
        ids = self.pick(data)
        kv, ref = self.both("fork", ids, n)
        if kv is not None:
            assert kv.tolist() == ref.tolist()
            self.live += kv.ravel().tolist()

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 2), atomic=st.booleans())
    def fork_and_diverge(self, data, n, atomic):
        """Fork one sequence and grow parent and children in a random order (copy-on-write)."""
        parent = data.draw(st.sampled_from(self.live))
        kv, ref = self.both("fork", [parent], n)
        if kv is None:
            return
        assert kv.tolist() == ref.tolist()
        family = [parent, *kv.ravel().tolist()]
        self.live += kv.ravel().tolist()
        order = data.draw(st.permutations(family))
        counts = data.draw(st.lists(st.integers(0, 3), min_size=len(order), max_size=len(order)))
        tokens = data.draw(st.lists(TOKENS, min_size=sum(counts), max_size=sum(counts)))
        kv, ref = self.both("append", order, counts, tokens, atomic=atomic)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field
            if kv.cow_src.size:
                event("fork_and_diverge copied a shared tail")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data):
        ids = self.pick(data, allow_dead=data.draw(st.booleans()))
        kv, ref = self.both("release", ids)
        if not any(i in self.dead for i in ids):
            for i in ids:
                self.live.remove(i)
                self.dead.append(i)

    @rule(data=st.data())
    def release_window(self, data):
        """Release out-of-window blocks at lengths up to the sequences' (now and then one past
        it, or a dead id: an error on both sides, nothing changed)."""
        ids = self.pick(data, allow_dead=data.draw(st.integers(0, 7)) == 0)
        live = [i for i in ids if i in self.live]
        lens = dict(zip(live, self.ref.seq_lens(live).tolist(), strict=True)) if live else {}
        lengths = [data.draw(st.integers(0, lens.get(i, 3) + 1)) for i in ids]
        kv, ref = self.both("release_window", ids, lengths)
        if kv is not None:
            assert kv == ref
            if kv:
                event("release_window released blocks")

    @rule(data=st.data())
    def truncate(self, data):
        """Shorten sequences to random lengths (now and then one too long, or a dead id)."""
        ids = self.pick(data, allow_dead=data.draw(st.booleans()))
        live = [i for i in ids if i in self.live]
        lens = dict(zip(live, self.ref.seq_lens(live).tolist(), strict=True)) if live else {}
        new_lens = [data.draw(st.integers(0, lens.get(i, 3))) for i in ids]
        if ids and data.draw(st.integers(0, 7)) == 0:  # now and then a length out of range
            j = data.draw(st.integers(0, len(ids) - 1))
            new_lens[j] = data.draw(st.sampled_from([-1, lens.get(ids[j], 3) + 1]))
        before = {i: self.ref.seq_tokens(i) for i in live}
        self.both("truncate", ids, new_lens)
        valid = all(0 <= n <= lens.get(i, -1) for i, n in zip(ids, new_lens, strict=True))
        # A windowed sequence refuses a cut below the blocks that left its window (both sides).
        if valid and self.ref.seq_lens(ids).tolist() != new_lens:
            event("truncate refused below a window")
            valid = False
        if valid:
            for i, n in zip(ids, new_lens, strict=True):
                # The sequence keeps exactly its first n tokens, on both sides.
                assert np.array_equal(kvnumba.Sequence(self.kv, i).tokens, before[i][:n])
            if any(n < lens[i] for i, n in zip(ids, new_lens, strict=True)):
                event("truncate shortened a sequence")
            if (self.kv.state.block_flags & F_TRIMMED).any():
                event("truncate cut into a shared block")

    @precondition(lambda self: self.live)
    @rule(data=st.data(), release_first=st.booleans())
    def truncate_shared(self, data, release_first):
        """Fork, cut one of the family into a block it shares, maybe release the other, then
        grow the cut one: the shared block is copied while shared; once the cut one holds it
        alone, it is reclaimed and written in place (never with the other's content left)."""
        parent = data.draw(st.sampled_from(self.live))
        kv, _ = self.both("fork", [parent], 1)
        if kv is None:
            return
        child = int(kv[0, 0])
        self.live.append(child)
        cut, other = data.draw(st.permutations([parent, child]))
        length = int(self.ref.seq_lens([cut])[0])
        new_len = data.draw(st.integers(0, length))
        self.both("truncate", [cut], [new_len])
        if release_first:
            self.both("release", [other])
            self.live.remove(other)
            self.dead.append(other)
        count = data.draw(st.integers(1, 3))
        tokens = data.draw(st.lists(TOKENS, min_size=count, max_size=count))
        kv, ref = self.both("append", [cut], [count], tokens)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field
            if kv.cow_src.size:
                event("truncate_shared: the next append copied the cut block")
            elif release_first and new_len % self.kv.block_size:
                event("truncate_shared: the next append reclaimed the cut block")

    @rule(data=st.data())
    def evict(self, data):
        """Evict given blocks: cached ones go, free ones are skipped, referenced ones refused."""
        nb = self.kv.num_blocks
        cached = set(lru_order(self.kv))
        # Mostly cached and free (or reserved) blocks; now and then any id, in range or not.
        unreferenced = [b for b in range(nb) if self.kv.ref_count(b) == 0]
        anything = st.integers(-1, nb)
        ids = st.sampled_from(unreferenced) if unreferenced else anything
        blocks = data.draw(st.lists(ids, max_size=4))
        if data.draw(st.integers(0, 7)) == 0:
            blocks.append(data.draw(anything))
        kv, ref = self.both("evict", blocks)
        if kv is not None:
            assert kv == ref == len(cached & set(blocks))
            assert not cached & set(blocks) & set(lru_order(self.kv))
            if kv:
                event("evict evicted blocks")

    @rule()
    def reset_prefix_cache(self):
        cached = len(lru_order(self.kv))
        kv, ref = self.both("reset_prefix_cache")
        assert kv == ref == cached
        if kv:
            event("reset_prefix_cache evicted blocks")
        # Nothing is registered any more: the prefix table is empty.
        assert (self.kv.state.htab == -1).all()
        assert not (self.kv.state.block_flags & 6).any()  # F_HASHED | F_REGISTERED

    @rule(data=st.data(), tags=st.booleans())
    def hint_or_tag(self, data, tags):
        """A priority policy's next-use hints or tags (a ValueError elsewhere, on both sides)."""
        n = self.kv.num_blocks
        blocks = data.draw(st.lists(st.integers(0, n - 1), max_size=3), label="blocks")
        values = data.draw(st.lists(st.integers(-1, 9), min_size=len(blocks), max_size=len(blocks)))
        call = "set_tags" if tags else "set_next_use"
        if self.kv.eviction not in BUILTIN_POLICIES:
            event(f"priority {call}")
        self.both(call, blocks, values)

    @rule(data=st.data())
    def sequence_tag(self, data):
        """Tags of live sequences for a priority policy (a ValueError elsewhere, both sides);
        a released id among them raises on both sides and changes nothing."""
        ids = self.pick(data, allow_dead=True)
        tags = data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)))
        if self.kv.eviction not in BUILTIN_POLICIES:
            event("priority set_sequence_tags")
        self.both("set_sequence_tags", ids, tags)

    @rule(data=st.data())
    def can_append(self, data):
        ids = self.pick(data)
        counts = data.draw(st.lists(st.integers(0, 8), min_size=len(ids), max_size=len(ids)))
        kv, ref = self.both("can_append", ids, counts)
        assert kv == ref

    # ----------------------------------------------------------------------------- invariants
    def assert_same_stats(self):
        assert self.kv.stats() == self.ref.stats()

    @invariant()
    def agree(self):
        if not hasattr(self, "kv"):
            return
        self.kv.check()
        self.ref.check()
        self.assert_same_stats()
        stats = self.kv.stats()
        assert stats.used + stats.cached + stats.free == self.kv.num_blocks
        state = self.kv.state
        # The reference lists its free stack bottom to top; free_blocks gives the taking order.
        assert free_blocks(state)[::-1].tolist() == self.ref.free_blocks()
        assert lru_order(self.kv) == self.ref.lru_blocks()
        refs = [self.ref.ref_count(b) for b in range(self.kv.num_blocks)]
        assert state.ref.tolist() == refs
        # refcounts recomputed from the block tables
        recomputed = np.zeros(self.kv.num_blocks, dtype=np.int64)
        if self.live:
            tables = self.kv.block_tables(self.live)
            assert np.array_equal(tables, self.ref.block_tables(self.live))
            assert np.array_equal(self.kv.seq_lens(self.live), self.ref.seq_lens(self.live))
            np.add.at(recomputed, tables[tables >= 0], 1)
            for seq_id in self.live:
                seq = kvnumba.Sequence(self.kv, seq_id)
                assert np.array_equal(seq.tokens, self.ref.seq_tokens(seq_id))
        assert np.array_equal(recomputed, state.ref)
        assert self.evicted_kv.calls == self.evicted_ref.calls
        if self.evicted_kv.calls:
            event("cached blocks were evicted")

    def teardown(self):
        if hasattr(self, "kv") and self.live:
            self.kv.release(self.live)
            self.ref.release(self.live)
        if hasattr(self, "kv"):
            self.kv.check()
            assert self.kv.stats().used == self.kv.reserved_blocks
            assert not self.kv.state.ref.any()


KernelsVersusReference.TestCase.settings = settings(
    max_examples=examples(500),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestKernelsVersusReference = KernelsVersusReference.TestCase


# ------------------------------------------------------------------------------ engine keys
HIGH = 1 << 63  # key words beyond int64, as a sha256 hash seen as uint64 words mostly has
# Prompts share a few prefixes (system prompts, few-shot examples) so that keys hit often.
BASES = ([0, 1, 2, 0, 1, 2, 0, 1], [1, 1, 1, 1, 1, 1], [2, 0, 2, 0])
PROMPTS = st.builds(
    lambda base, cut, tail: (base[:cut] + tail) or [0],
    st.sampled_from(BASES),
    st.integers(0, 8),
    st.lists(TOKENS, max_size=4),
)


class KeyedKernelsVersusReference(KernelsVersusReference):
    """The machine above with ``block_keys`` (mostly) and ``block_events``, plus keyed admits,
    ``lookup`` and ``set_keys``; every step's block events and evictions must agree too.

    Keys behave like an engine's chained block hashes: one key per distinct token prefix
    (``key_for``), so an equal key means equal content unless the content is unknown (admits
    without token ids key their blocks from tokens the manager never sees). Half the keys
    share word 0, so only the other words tell them apart; ``_hash_bits=1`` makes every key
    collide in the kernels' hash table (keyed mode only: see ``setup``).
    """

    @initialize(
        num_blocks=st.integers(3, 24),
        block_size=st.sampled_from([1, 2, 3]),
        max_seqs=st.integers(3, 8),
        block_keys=st.sampled_from([True, True, True, False]),
        prefix_caching=st.sampled_from([True, True, True, False]),
        reserved_blocks=st.sampled_from([0, 0, 1]),
        hash_bits=st.sampled_from([64, 64, 1]),
        eviction=st.sampled_from((*EVICTION_POLICIES, *USER_POLICIES)),
        data=st.data(),
    )
    def setup(self, num_blocks, block_size, max_seqs, block_keys, prefix_caching, data, **flags):
        reserved_blocks, hash_bits = flags["reserved_blocks"], flags["hash_bits"]
        if not block_keys:
            # Token mode matches a chained hash, the salt and the block's tokens, not the
            # parent: a forced collision may hit a block the model (exact chain) does not.
            hash_bits = 64
        self.evicted_kv, self.evicted_ref = Evictions(), Evictions()
        self.hashes_kv, self.hashes_ref = [], []
        geometry = dict(
            max_seqs=max_seqs,
            max_seq_len=6 * block_size + 2,
            prefix_caching=prefix_caching,
            reserved_blocks=reserved_blocks,
            block_keys=block_keys,
            block_events=True,
            _hash_bits=hash_bits,
            eviction=flags["eviction"],
            cache_duplicates=data.draw(st.booleans(), label="cache_duplicates"),
            **data.draw(windows(block_size)),
        )

        def hook(records, hashes):
            def on_evict(ids, block_hashes, tokens):
                records(ids, block_hashes, tokens)
                hashes.append(block_hashes.tolist())

            return on_evict

        self.kv = kvnumba.BlockManager(
            num_blocks, block_size, on_evict=hook(self.evicted_kv, self.hashes_kv), **geometry
        )
        self.ref = ReferenceBlockManager(
            num_blocks,
            block_size,
            on_evict=hook(self.evicted_ref, self.hashes_ref),
            id_tag=self.kv.id_tag,
            **geometry,
        )
        self.keyed = block_keys
        self.exact_hashes = block_keys and hash_bits == 64
        self.key_ids: dict[tuple, int] = {}
        self.live, self.dead = [], []

    # -------------------------------------------------------------------------------- helpers
    def key_for(self, prefix) -> list[int]:
        """The key of the block ending a token prefix: one id per distinct prefix."""
        kid = self.key_ids.setdefault(tuple(prefix), len(self.key_ids))
        return [HIGH + kid % 2, 0, 0, kid]

    def keys_of(self, tokens, positions) -> list[list[int]]:
        bs = self.kv.block_size
        return [self.key_for(tokens[: (j + 1) * bs]) for j in positions]

    def same_fields(self, kv, ref):
        for field in kv._fields:
            assert np.array_equal(getattr(kv, field), getattr(ref, field)), field

    # ---------------------------------------------------------------------------------- rules
    @rule(data=st.data(), atomic=st.booleans(), with_tokens=st.booleans())
    def admit_keyed(self, data, atomic, with_tokens):
        """Admit prompts with keys (some), caps (some) and without token ids (some); the
        same prompts' lookup just before must agree on both sides, and predict the hits of
        a single admitted prompt."""
        bs = self.kv.block_size
        prompts = data.draw(st.lists(PROMPTS, min_size=1, max_size=3))
        n = len(prompts)
        kw = dict(salts=data.draw(st.lists(st.sampled_from([0, 0, 1]), min_size=n, max_size=n)))
        kw["max_hit_blocks"] = data.draw(
            st.one_of(
                st.none(),
                st.integers(0, 3),
                st.lists(st.integers(0, 3), min_size=n, max_size=n),
            )
        )
        if self.keyed:
            counts = [data.draw(st.integers(0, len(p) // bs)) for p in prompts]
            if data.draw(st.booleans()):
                counts = [len(p) // bs for p in prompts]  # the default
            else:
                kw["key_counts"] = counts
            rows = [
                row
                for p, c in zip(prompts, counts, strict=True)
                for row in self.keys_of(p, range(c))
            ]
            kw["keys"] = np.array(rows, dtype=np.uint64).reshape(-1, 4)
        tokens = [t for p in prompts for t in p] if with_tokens or not self.keyed else None
        lengths = [len(p) for p in prompts]
        # lookup takes no slot: it answers even for more prompts than free slots.
        look, ref_look = self.both("lookup", tokens, lengths, **kw)
        if look is not None:
            self.same_fields(look, ref_look)
            if look.num_cached_tokens.any():
                event("lookup found hits")
        kv, ref = self.both("admit", tokens, lengths, atomic=atomic, **kw)
        if kv is None:
            return
        self.same_fields(kv, ref)
        self.live += [i for i in kv.ids.ravel().tolist() if i >= 0]
        if look is not None and n == 1 and kv.ok[0]:
            assert kv.num_cached_tokens[0] == look.num_cached_tokens[0]
        if kv.num_cached_tokens.any():
            event("keyed admit reused cached blocks")

    @precondition(lambda self: self.live and self.keyed)
    @rule(data=st.data())
    def set_keys(self, data):
        """Key full blocks of live sequences (now and then a dead id, a position that is not a
        full block, or a key the block does not have). The rare cases are drawn as the
        largest value, so that shrinking (towards 0) drops them when they do not matter."""
        bs = self.kv.block_size
        ids = self.pick(data, allow_dead=data.draw(st.integers(0, 7)) == 7)
        starts, counts, rows = [], [], []
        for i in ids:
            tokens = self.ref.seq_tokens(i).tolist() if i in self.live else []
            full = len(tokens) // bs
            start = data.draw(st.integers(0, full))
            count = data.draw(st.integers(0, full - start))
            if data.draw(st.integers(0, 9)) == 9:
                count += 1  # one past the full blocks
            starts.append(start)
            counts.append(count)
            rows += self.keys_of(tokens, range(start, start + count))
            rows += [self.key_for(("past", j)) for j in range(len(rows), sum(counts))]
        # Another key for a keyed block: ValueError, also when two ids share the block. Always
        # the same one, so that it may be registered already with other tokens (the first
        # block stays registered; this one keeps the key unregistered).
        if rows and data.draw(st.integers(0, 9)) == 9:
            other = self.key_for(("other",))
            rows[data.draw(st.integers(0, len(rows) - 1))] = other
        keys = np.array(rows, dtype=np.uint64).reshape(-1, 4)
        kv, ref = self.both("set_keys", ids, starts, counts, keys)
        if kv is not None:
            assert kv == ref
            if kv:
                event("set_keys registered blocks")

    @rule(data=st.data(), with_tokens=st.booleans())
    def admit_one(self, data, with_tokens):
        """The kernels' one-request admit (and lookup) against the model's batched admit of
        one prompt whose keys are its first ``K`` full blocks."""
        prompt = data.draw(PROMPTS)
        bs, length = self.kv.block_size, len(prompt)
        salt = data.draw(st.sampled_from([0, 0, 1]))
        cap = data.draw(st.one_of(st.none(), st.integers(0, 3)))
        keys = None
        if self.keyed:
            count = data.draw(st.integers(0, length // bs))
            keys = np.array(self.keys_of(prompt, range(count)), dtype=np.uint64).reshape(-1, 4)
        tokens = prompt if with_tokens or not self.keyed else None
        kw = {} if keys is None else dict(keys=keys, key_counts=[len(keys)])
        if self.keyed:
            look, ref_look = self.pair(
                "lookup_one",
                lambda m: m.lookup_one(length=length, salt=salt, keys=keys, max_hit_blocks=cap),
                lambda m: m.lookup(None, [length], salts=[salt], max_hit_blocks=cap, **kw),
            )
        else:
            look, ref_look = self.pair(
                "lookup_one",
                lambda m: m.lookup_one(prompt, salt=salt, max_hit_blocks=cap),
                lambda m: m.lookup(prompt, [length], salts=[salt], max_hit_blocks=cap),
            )
        if look is not None:
            # -1 pads the row (one row per KV cache group with several); a windowed prompt's
            # leading NULL_BLOCK entries are hits.
            hits = int(ref_look.num_cached_tokens[0]) // bs
            assert look.tolist() == ref_look.block_ids[0][..., :hits].tolist()

        def ref_admit(m):
            r = m.admit(tokens, [length], salts=[salt], max_hit_blocks=cap, **kw)
            ids = r.ids[0]
            return int(ids) if ids.ndim == 0 else tuple(map(int, ids)), int(r.num_cached_tokens[0])

        kv, ref = self.pair(
            "admit_one",
            lambda m: m.admit_one(tokens, length=length, salt=salt, keys=keys, max_hit_blocks=cap),
            ref_admit,
        )
        if kv is not None:
            assert kv == ref
            self.live += list(kv[0]) if isinstance(kv[0], tuple) else [kv[0]]
            if kv[1]:
                event("admit_one reused cached blocks")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def append_one(self, data):
        """The kernels' one-request append (no token ids; keys of the blocks full after it)
        against the model's ``append`` then ``set_keys``. Only keys the model would accept are
        drawn: the kernels check them before any write, the model's two calls could not."""
        seq = data.draw(st.sampled_from(self.live))
        bs = self.kv.block_size
        count = data.draw(st.integers(0, 4))
        tokens = self.ref.seq_tokens(seq).tolist() + [-1] * count
        full = len(tokens) // bs
        # A windowed sequence holds no block below its released prefix, nor (when it grows)
        # below the first position its window needs: keys go to held blocks only.
        low = int((self.ref.block_tables([seq])[0] == kvnumba.NULL_BLOCK).sum())
        if count:
            window = self.ref._kind(self.ref._resolve(seq))
            low = max(low, first_needed_block(len(tokens) - count, bs, *window))
        start = data.draw(st.integers(min(low, full), full))
        keys = None
        if self.keyed and data.draw(st.booleans()):
            rows = self.keys_of(tokens, range(start, data.draw(st.integers(start, full))))
            slot = self.ref._resolve(seq)
            table, salt = self.ref._table[slot], self.ref._salt[slot]
            owned = [self.ref._key[table[j]] for j in range(start, min(len(table), full))]
            if all(k is None or k == (salt, *r) for k, r in zip(owned, rows, strict=False)):
                keys = np.array(rows, dtype=np.uint64).reshape(-1, 4)

        def ref_append(m):
            n = int(m.seq_lens([seq])[0])
            r = m.append([seq], [count])
            if keys is not None:
                m.set_keys([seq], [start], [len(keys)], keys)
            cow = (int(r.cow_src[0]), int(r.cow_dst[0])) if r.cow_src.size else (-1, -1)
            return (-(-n // bs), -(-(n + count) // bs), *cow)

        kw = {} if keys is None else dict(key_start=start, keys=keys)
        kv, ref = self.pair("append_one", lambda m: m.append_one(seq, count, **kw), ref_append)
        if kv is not None:
            assert tuple(kv) == ref
            if kv[2] >= 0:
                event("append_one copied a shared tail")

    @invariant()
    def same_events(self):
        if not hasattr(self, "kv"):
            return
        kv, ref = self.kv.take_events(), self.ref.take_events()
        assert kv.kind.tolist() == ref.kind.tolist()
        assert kv.block.tolist() == ref.block.tolist()
        if self.keyed:  # token mode: each side's own chained hash
            assert kv.key.tolist() == ref.key.tolist()
        if self.exact_hashes:
            assert self.hashes_kv == self.hashes_ref
        if len(kv.kind):
            event("block events")


KeyedKernelsVersusReference.TestCase.settings = settings(
    max_examples=examples(150),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestKeyedKernelsVersusReference = KeyedKernelsVersusReference.TestCase
