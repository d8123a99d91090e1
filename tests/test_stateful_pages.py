"""Three managers on one page pool: kernels against the reference model, step by step.

A pool smaller than what the managers could use together makes page misses, cache-only
pages, sibling reclaim and unmapping frequent. After every step both sides agree on block
tables, page mappings, the pool's free stack, its owner table and clock, every manager's
cache-only list with its stamps (so which sibling pages a reclaim took), counters, every
``can_append`` answer and every callback, and both pass ``check()``; every failed call leaves
the managers and the pool byte-identical.
"""

from __future__ import annotations

import numpy as np
from conftest import examples
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_stateful import windows
from user_policies import USER_POLICIES

import kvnumba
from kvnumba._kernels.physical_pages import O_CLIENT, O_VIRTUAL
from kvnumba._layout import M_CO_HEAD, NIL
from kvnumba.eviction import EVICTION_POLICIES
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool

TOKENS = st.integers(0, 2)
MANAGERS = 3  # with two or more siblings, reclaim must choose among their lists by stamp
WHO = st.sampled_from(range(MANAGERS))


class Recorder:
    """Callbacks of one side, in the order they fire."""

    def __init__(self):
        self.calls = []

    def hook(self, name):
        def record(*arrays):
            assert all(a.dtype in (np.int64, np.uint64) for a in arrays)
            # on_evict: ids and payload (the two sides hash differently); on_(un)map: pages.
            kept = (arrays[0], arrays[2]) if len(arrays) == 3 else arrays
            self.calls.append((name, *(a.tolist() for a in kept)))

        return record


def kernel_cache_only(mgr) -> list[tuple[int, int]]:
    """``(virtual page, stamp)`` of a kernel manager's cache-only list, head first."""
    state = mgr.state
    out, v = [], int(state.meta[M_CO_HEAD])
    while v != NIL:
        out.append((v, int(state.page_stamp[v])))
        v = int(state.co_next[v])
    return out


def kernel_owners(pool, managers) -> dict[int, tuple[int, int]]:
    """Physical page -> (index of its manager, virtual page), from the pool's owner table."""
    clients = [m._pages.client for m in managers]
    owner = pool.state.owner
    return {
        p: (clients.index(int(owner[p, O_CLIENT])), int(owner[p, O_VIRTUAL]))
        for p in range(pool.num_pages)
        if owner[p, O_CLIENT] != -1
    }


def reference_owners(pool, managers) -> dict[int, tuple[int, int]]:
    """The same map from the reference pool."""
    out = {}
    for p in range(pool.num_pages):
        owner = pool.owner_of(p)
        if owner is not None:
            out[p] = ([id(m) for m in managers].index(id(owner[0])), owner[1])
    return out


class PagesVersusReference(RuleBasedStateMachine):
    @initialize(
        blocks_per_page=st.lists(st.integers(1, 4), min_size=MANAGERS, max_size=MANAGERS),
        pages_per_manager=st.lists(st.integers(1, 5), min_size=MANAGERS, max_size=MANAGERS),
        pool_pages=st.integers(2, 7),
        block_size=st.sampled_from([1, 2, 3]),
        evictions=st.lists(
            st.sampled_from((*EVICTION_POLICIES, *USER_POLICIES)),
            min_size=MANAGERS,
            max_size=MANAGERS,
        ),
        data=st.data(),
    )
    def setup(self, blocks_per_page, pages_per_manager, pool_pages, block_size, evictions, data):
        self.kv_hooks, self.ref_hooks = Recorder(), Recorder()
        self.kv_pool = kvnumba.PagePool(
            pool_pages, on_map=self.kv_hooks.hook("map"), on_unmap=self.kv_hooks.hook("unmap")
        )
        self.ref_pool = ReferencePagePool(
            pool_pages, on_map=self.ref_hooks.hook("map"), on_unmap=self.ref_hooks.hook("unmap")
        )
        self.kv, self.ref = [], []
        for who in range(MANAGERS):
            # Managers differ in page size and page count: a small one is capped by its
            # unmapped virtual pages, not by what its siblings could give.
            k = blocks_per_page[who]
            num_blocks = k * pages_per_manager[who]
            geometry = dict(
                max_seqs=8,
                max_seq_len=6 * block_size + 2,
                blocks_per_page=k,
                eviction=evictions[who],
                **data.draw(windows(block_size)),
            )
            self.kv.append(
                kvnumba.BlockManager(
                    num_blocks,
                    block_size,
                    page_pool=self.kv_pool,
                    on_evict=self.kv_hooks.hook(f"evict{who}"),
                    **geometry,
                )
            )
            self.ref.append(
                ReferenceBlockManager(
                    num_blocks,
                    block_size,
                    page_pool=self.ref_pool,
                    on_evict=self.ref_hooks.hook(f"evict{who}"),
                    id_tag=self.kv[-1].id_tag,  # the same ids on both sides
                    **geometry,
                )
            )
        self.live = [[] for _ in range(MANAGERS)]

    # -------------------------------------------------------------------------------- helpers
    def snapshots(self):
        return [self.kv_pool.snapshot(), *(m.snapshot() for m in self.kv)]

    def both(self, who, call, *args, **kwargs):
        """Run one call on manager ``who`` of both sides; they must agree on the outcome."""
        before = self.snapshots()
        sibling_pages = [m.stats().mapped_pages for m in self.kv]
        outcome = []
        for mgr in (self.kv[who], self.ref[who]):
            try:
                outcome.append(("ok", getattr(mgr, call)(*args, **kwargs)))
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
            for x, y in zip(before, self.snapshots(), strict=True):
                for name, a, b in zip(x._fields, x, y, strict=True):
                    assert np.array_equal(a, b), f"{name} changed by a failed {call}"
            return None, None
        givers = [
            i
            for i, m in enumerate(self.kv)
            if i != who and m.stats().mapped_pages < sibling_pages[i]
        ]
        if call in ("append", "admit") and givers:
            event(f"{len(givers)} sibling(s) gave up cache-only pages")
        return kv_value, ref_value

    def pick(self, data, who):
        if not self.live[who]:
            return []
        return data.draw(st.lists(st.sampled_from(self.live[who]), max_size=3, unique=True))

    # ---------------------------------------------------------------------------------- rules
    @rule(who=WHO, count=st.integers(1, 2))
    def new_sequences(self, who, count):
        kv, ref = self.both(who, "new_sequences", count)
        if kv is not None:
            assert kv.tolist() == ref.tolist()
            self.live[who] += kv.ravel().tolist()

    @rule(who=WHO, data=st.data(), with_tokens=st.booleans(), atomic=st.booleans())
    def append(self, who, data, with_tokens, atomic):
        ids = self.pick(data, who)
        counts = data.draw(st.lists(st.integers(0, 5), min_size=len(ids), max_size=len(ids)))
        tokens = data.draw(st.lists(TOKENS, min_size=sum(counts), max_size=sum(counts)))
        kv, ref = self.both(
            who, "append", ids, counts, tokens if with_tokens else None, atomic=atomic
        )
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field

    @rule(who=WHO, data=st.data(), atomic=st.booleans())
    def admit(self, who, data, atomic):
        prompts = data.draw(
            st.lists(st.lists(TOKENS, min_size=1, max_size=10), min_size=1, max_size=3)
        )
        tokens = [t for p in prompts for t in p]
        kv, ref = self.both(who, "admit", tokens, [len(p) for p in prompts], atomic=atomic)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field
            self.live[who] += [i for i in kv.ids.ravel().tolist() if i >= 0]

    @rule(who=WHO, prompt=st.lists(TOKENS, min_size=1, max_size=12))
    def cache_prompt(self, who, prompt):
        """Admit one prompt and release it: its full blocks stay cached, often on a page of
        their own, which becomes cache-only (what sibling reclaim gives up)."""
        kv, ref = self.both(who, "admit", prompt, [len(prompt)])
        if kv is not None:
            assert kv.ids.tolist() == ref.ids.tolist()
            self.both(who, "release", kv.ids.ravel())

    @rule(who=WHO, data=st.data())
    def fork(self, who, data):
        ids = self.pick(data, who)
        kv, ref = self.both(who, "fork", ids, 1)
        if kv is not None:
            assert kv.tolist() == ref.tolist()
            self.live[who] += kv.ravel().tolist()

    @rule(who=WHO, data=st.data())
    def release(self, who, data):
        ids = self.pick(data, who)
        self.both(who, "release", ids)
        for i in ids:
            self.live[who].remove(i)

    @rule(who=WHO)
    def release_all(self, who):
        """Release every sequence of one manager: its cached pages become cache-only."""
        self.both(who, "release", self.live[who])
        self.live[who] = []

    @rule(who=WHO, data=st.data())
    def truncate(self, who, data):
        """Shorten sequences: freed blocks go back to their pages, which may unmap."""
        ids = self.pick(data, who)
        lens = self.ref[who].seq_lens(ids).tolist()
        new_lens = [data.draw(st.integers(0, n)) for n in lens]
        self.both(who, "truncate", ids, new_lens)
        if new_lens != lens:
            event("truncate shortened a sequence")

    @rule(who=WHO, data=st.data())
    def fork_truncate_append(self, who, data):
        """Cut into a block shared with a fork, release the sharer, grow: the cut block is
        copied, and the old one may become cached or free (its page cache-only or unmapped)."""
        if not self.live[who]:
            return
        parent = data.draw(st.sampled_from(self.live[who]))
        kv, _ = self.both(who, "fork", [parent], 1)
        if kv is None:
            return
        child = int(kv[0, 0])
        length = int(self.ref[who].seq_lens([child])[0])
        self.both(who, "truncate", [child], [data.draw(st.integers(0, length))])
        self.both(who, "release", [parent])
        self.live[who].remove(parent)
        self.live[who].append(child)
        count = data.draw(st.integers(1, 3))
        tokens = data.draw(st.lists(TOKENS, min_size=count, max_size=count))
        kv, ref = self.both(who, "append", [child], [count], tokens)
        if kv is not None:
            for field in kv._fields:
                assert np.array_equal(getattr(kv, field), getattr(ref, field)), field

    @rule(who=WHO, data=st.data())
    def evict(self, who, data):
        """Evict given blocks: a page left without cached or referenced blocks is unmapped."""
        nb = self.kv[who].num_blocks
        blocks = data.draw(st.lists(st.integers(0, nb - 1), max_size=4))
        kv, ref = self.both(who, "evict", blocks)
        assert kv == ref
        if kv:
            event("evict evicted blocks")

    @rule(who=WHO)
    def reset_prefix_cache(self, who):
        kv, ref = self.both(who, "reset_prefix_cache")
        assert kv == ref
        assert self.kv[who].stats().cached == 0
        if kv:
            event("reset_prefix_cache evicted blocks")

    @rule(who=WHO)
    def trim(self, who):
        kv, ref = self.both(who, "trim")
        assert kv == ref
        if kv:
            event("trim unmapped pages")

    @rule(who=WHO, data=st.data())
    def can_append(self, who, data):
        ids = self.pick(data, who)
        counts = data.draw(st.lists(st.integers(0, 8), min_size=len(ids), max_size=len(ids)))
        kv, ref = self.both(who, "can_append", ids, counts)
        assert kv == ref
        ref_mgr = self.ref[who]
        unmapped = len(ref_mgr.unmapped_pages())
        offered = sum(len(m.cache_only_pages()) for m in self.ref if m is not ref_mgr)
        if kv is not None and offered and unmapped < self.ref_pool.num_free + offered:
            event("can_append with sibling pages capped by unmapped virtual pages")

    # ----------------------------------------------------------------------------- invariants
    @invariant()
    def agree(self):
        if not hasattr(self, "kv"):
            return
        self.kv_pool.check()
        assert self.kv_pool.num_free == self.ref_pool.num_free
        assert self.kv_pool.state.free[: self.kv_pool.num_free].tolist() == (
            self.ref_pool.free_pages()
        )
        assert self.kv_pool.clock == self.ref_pool.clock
        assert kernel_owners(self.kv_pool, self.kv) == reference_owners(self.ref_pool, self.ref)
        mapped = 0
        for who in range(MANAGERS):
            kv, ref = self.kv[who], self.ref[who]
            kv.check()
            ref.check()
            assert kv.stats() == ref.stats()
            assert kv.mapped_pages().tolist() == ref.mapped_pages().tolist()
            assert kernel_cache_only(kv) == ref.cache_only_pages()
            mapped += kv.stats().mapped_pages
            if self.live[who]:
                assert np.array_equal(
                    kv.block_tables(self.live[who]), ref.block_tables(self.live[who])
                )
        assert mapped + self.kv_pool.num_free == self.kv_pool.num_pages
        assert self.kv_hooks.calls == self.ref_hooks.calls
        if any(c[0] == "unmap" for c in self.kv_hooks.calls):
            event("pages were unmapped")

    def teardown(self):
        if not hasattr(self, "kv"):
            return
        for who in range(MANAGERS):
            if self.live[who]:
                self.kv[who].release(self.live[who])
            self.kv[who].trim()
            self.kv[who].check()
            assert self.kv[who].stats().mapped_pages == 0
        assert self.kv_pool.num_free == self.kv_pool.num_pages


PagesVersusReference.TestCase.settings = settings(
    max_examples=examples(1000),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPagesVersusReference = PagesVersusReference.TestCase
