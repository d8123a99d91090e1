"""kvnumba's vLLM manager of several KV cache groups against vLLM's own, call for call.

Needs vLLM 0.32-0.33 (skipped without it; ``scripts/vllm_env.sh compare`` runs it in the vLLM
test environment). vLLM's ``KVCacheManager`` and ``KVNumbaGroupsKVCacheManager`` get the same
requests and calls, for models with full-attention, sliding-window and chunked-local groups over
one pool: admissions with prefix hits, chunked prefills, decode steps with lookahead slots,
tokens still in flight, preemptions, deferred frees. Everything the scheduler and an event
consumer see must be the same: every block of every group (null blocks included, block ids up
to kvnumba's documented free order within one release, see ``_Pairs``), refcounts, prefix hits,
whether an allocation fits, free-block counts, ``usage`` and the KV cache events (hashes, equal
exactly). After every call the adapter passes its ``check()``.
"""

from __future__ import annotations

import collections
import os
import random

import numpy as np
import pytest

import kvnumba
from kvnumba.integrations.vllm.version import SUPPORTED_RELEASES, release_of

vllm = pytest.importorskip("vllm")
if release_of(vllm.__version__) not in SUPPORTED_RELEASES:
    pytest.skip("the adapter is written for vLLM 0.32.x-0.33.x", allow_module_level=True)

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from kvnumba.integrations.vllm.groups import KVNumbaGroupsKVCacheManager  # noqa: E402
from kvnumba.integrations.vllm.scheduler import _VLLM_KV_CACHE_MANAGER  # noqa: E402
from kvnumba.state import BlockFlag  # noqa: E402

BS = 4
_SPEC = dict(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)


def _spec(kind: str):
    if kind == "full":
        return FullAttentionSpec(**_SPEC)
    if kind.startswith("sw"):
        return SlidingWindowSpec(**_SPEC, sliding_window=int(kind[2:]))
    return ChunkedLocalAttentionSpec(**_SPEC, attention_chunk_size=int(kind[5:]))


#: Layouts of real models in miniature: gpt-oss/Gemma (full + sliding window), Gemma 3 (several
#: sliding-window groups), Llama 4 (full + chunked local), all-local models.
LAYOUTS = {
    "full+sw": ["full", "sw8"],
    "full+sw+sw": ["full", "sw8", "sw8"],
    "full+2sw": ["full", "sw5", "sw13"],
    "full+chunk": ["full", "chunk8"],
    "sw": ["sw6"],
    "chunk": ["chunk12"],
    "full+sw+chunk": ["sw9", "full", "chunk16"],
}
#: Layouts served with vLLM's default retention interval 0 (what an engine gets): a
#: sliding-window group caches only the blocks a later hit can end at.
SPARSE = {"full+sw", "full+sw+sw", "full+2sw", "sw", "full+sw+chunk"}


def _config(kinds: list[str], num_blocks: int, retention: int | None = None) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], _spec(k)) for i, k in enumerate(kinds)],
        prefix_cache_retention_interval=retention,
    )


def _managers(kinds, num_blocks: int, retention: int | None = None, **kwargs):
    args = dict(max_model_len=512, scheduler_block_size=BS, hash_block_size=BS, **kwargs)
    return (
        _VLLM_KV_CACHE_MANAGER(_config(kinds, num_blocks, retention), **args),
        KVNumbaGroupsKVCacheManager(_config(kinds, num_blocks, retention), **args),
    )


def _request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(sha256)


class _Pairs:
    """Which kvnumba block stands for which vLLM block.

    kvnumba hands out the uncached blocks of one release in another order than vLLM (its free
    stack reuses a request's earlier block first, vLLM's queue its tail block), so block ids
    are compared as a relation: every block vLLM allocates is paired with the one kvnumba
    allocates in the same place, and every later appearance of either (a prefix hit, a block
    table) must show its partner in the same place. The null block is block 0 in both.
    """

    def __init__(self) -> None:
        self.ref_to_kvn = {0: 0}
        self.kvn_to_ref = {0: 0}

    def pair(self, ref_blocks, kvn_blocks) -> None:
        """Record the pairs of newly allocated blocks (same shape asserted)."""
        if ref_blocks is None or kvn_blocks is None:
            assert ref_blocks is kvn_blocks
            return
        for rg, kg in zip(self._shape(ref_blocks, kvn_blocks), kvn_blocks.blocks, strict=True):
            for r, k in zip(rg, kg, strict=True):
                assert (r == 0) == (k.block_id == 0)
                self.kvn_to_ref.pop(self.ref_to_kvn.pop(r, None), None)
                self.ref_to_kvn.pop(self.kvn_to_ref.pop(k.block_id, None), None)
                self.ref_to_kvn[r], self.kvn_to_ref[k.block_id] = k.block_id, r

    def same(self, ref_blocks, kvn_blocks) -> None:
        """Assert that known blocks appear with their partners (same shape asserted)."""
        for rg, kg in zip(self._shape(ref_blocks, kvn_blocks), kvn_blocks.blocks, strict=True):
            for r, k in zip(rg, kg, strict=True):
                assert self.ref_to_kvn.get(r) == k.block_id, (r, k.block_id)

    @staticmethod
    def _shape(ref_blocks, kvn_blocks) -> list[list[int]]:
        assert (ref_blocks is None) == (kvn_blocks is None)
        if ref_blocks is None:
            return []
        ref = [[b.block_id for b in g] for g in ref_blocks.blocks]
        kvn = [[b.block_id for b in g] for g in kvn_blocks.blocks]
        assert [len(g) for g in ref] == [len(g) for g in kvn]
        assert [[b == 0 for b in g] for g in ref] == [[b == 0 for b in g] for g in kvn]
        return ref


def _brief(events) -> list[tuple]:
    """Kind, group and block count of each event (what a mismatch shows first)."""
    return [
        (type(e).__name__, getattr(e, "group_idx", None), len(getattr(e, "block_hashes", ())))
        for e in events
    ]


def _copies(kvn) -> int:
    """Registered blocks whose key another registered block of the same group holds too.

    vLLM caches a block computed again beside the cached one of its hash; kvnumba's adapter
    does the same (``cache_duplicates``), so the copies must be the same on both sides.
    """
    state = kvn.kvnumba.state
    registered = np.flatnonzero(state.block_flags & BlockFlag.REGISTERED)
    keys = {(int(state.block_salt[b]), *state.block_key[b].tolist()) for b in registered}
    return len(registered) - len(keys)


def _same(ref, kvn, running, pairs: _Pairs) -> None:
    assert kvn.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
    assert kvn.usage == pytest.approx(ref.usage)
    for rid in running:
        pairs.same(ref.get_blocks(rid), kvn.get_blocks(rid))
        for rg, kg in zip(ref.get_blocks(rid).blocks, kvn.get_blocks(rid).blocks, strict=True):
            assert [b.ref_cnt for b in rg if not b.is_null] == [
                b.ref_cnt for b in kg if not b.is_null
            ]
    got, want = kvn.take_events(), ref.take_events()
    assert _brief(got) == _brief(want), f"\nkvnumba {_brief(got)}\nvLLM    {_brief(want)}"
    assert got == want
    kvn.check()


@pytest.mark.parametrize(
    ("layout", "retention"),
    [(layout, None) for layout in sorted(LAYOUTS)] + [(layout, 0) for layout in sorted(SPARSE)],
)
@pytest.mark.parametrize("seed", range(int(os.environ.get("KVNUMBA_VLLM_SEEDS", "3"))))
def test_groups_adapter_matches_vllm_manager(layout, seed, retention):
    # Two episodes on fresh managers, compared step for step; prompts and outputs repeat, so
    # blocks are computed again while cached ones hold their content (copies, see _copies).
    rng = random.Random(f"{layout}-{seed}-{retention}")
    seen = collections.Counter()
    for _ in range(2):
        assert _episode(rng, LAYOUTS[layout], 150, seen, retention=retention) == 150
    print(f"{layout} seed {seed}: {dict(seen)}")
    assert seen["steps with copies"] > 0


@pytest.mark.parametrize("layout", ["full+sw", "full+sw+chunk"])
def test_groups_adapter_matches_vllm_manager_without_prefix_caching(layout):
    rng = random.Random(layout)
    assert _episode(rng, LAYOUTS[layout], 250, collections.Counter(), enable_caching=False) == 250


def _episode(rng: random.Random, kinds: list[str], budget: int, seen, **kwargs) -> int:
    """Random scheduler calls on both managers; returns the steps compared, and counts steps
    that ended with copies registered in ``seen``."""
    kwargs.setdefault("enable_kv_cache_events", kwargs.get("enable_caching", True))
    ref, kvn = _managers(kinds, rng.choice([30, 50, 90]) * len(kinds) // 2 + 8, **kwargs)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(0, 9 * BS))] for _ in range(4)]
    running: dict[str, tuple[Request, Request]] = {}
    deferred: list[tuple[list, list]] = []
    pairs = _Pairs()
    serial = steps = 0
    for _ in range(budget):
        op = rng.random()
        if op < 0.25 or not running:
            serial += 1
            rid = f"r{serial}"
            chunked = rng.random() < 0.3
            prefix = rng.choice(prefixes)
            tokens = prefix + [rng.randrange(1000) for _ in range(rng.randrange(0, 13))]
            if rng.random() < 0.3 and len(tokens) > BS:
                tokens = tokens[: len(tokens) // BS * BS]  # the last full block is recomputed
            tokens = tokens or [rng.randrange(1000)]
            pair = (_request(rid, tokens), _request(rid, tokens))
            hits = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), pair, strict=True)]
            assert hits[0][1:] == hits[1][1:], "prefix hit tokens, shared-prefix boundary"
            for r, h in zip(pair, hits, strict=True):
                r.shared_prefix_boundary = h[2]  # as the scheduler keeps it
            pairs.same(hits[0][0], hits[1][0])
            num_new = len(tokens) - hits[0][1]
            if chunked:
                num_new = rng.randrange(1, num_new + 1)
            must_fit = rng.random() < 0.3
            got = [
                m.allocate_slots(r, num_new, h[1], h[0], full_sequence_must_fit=must_fit)
                for m, r, h in zip((ref, kvn), pair, hits, strict=True)
            ]
            pairs.pair(got[0], got[1])
            if got[0] is not None:
                for r in pair:
                    r.status = RequestStatus.RUNNING
                    r.num_computed_tokens = hits[0][1] + num_new
                running[rid] = pair
        elif op < 0.8:
            rid = rng.choice(list(running))
            pair = running[rid]
            req = pair[0]
            if req.num_computed_tokens < req.num_tokens:  # the prompt's next chunk
                num_new = rng.randrange(1, req.num_tokens - req.num_computed_tokens + 1)
            else:  # decode: few distinct tokens, so outputs of a shared prefix hash alike
                token = rng.randrange(3)
                for r in pair:
                    r.append_output_token_ids(token)
                num_new = 1
            in_flight = rng.choice([0, 0, min(2, req.num_computed_tokens)])
            lookahead = rng.choice([0, 0, 3])
            for r in pair:
                r.num_in_flight_tokens = in_flight
            got = [
                m.allocate_slots(r, num_new, num_lookahead_tokens=lookahead)
                for m, r in zip((ref, kvn), pair, strict=True)
            ]
            pairs.pair(got[0], got[1])
            if got[0] is not None:
                for r in pair:
                    r.num_computed_tokens += num_new
            elif rng.random() < 0.5:  # preempt it, as the scheduler would
                for m, r in zip((ref, kvn), pair, strict=True):
                    m.free(r)
                del running[rid]
        elif op < 0.85:
            rid = rng.choice(list(running))
            processed = rng.randrange(running[rid][0].num_computed_tokens + 1)
            for m in (ref, kvn):
                m.remove_skipped_blocks(rid, processed)
        elif op < 0.9:
            rid = rng.choice(list(running))
            deferred.append(
                tuple(
                    m.pop_blocks_for_free(r)
                    for m, r in zip((ref, kvn), running.pop(rid), strict=True)
                )
            )
        else:
            rid = rng.choice(list(running))
            for m, r in zip((ref, kvn), running.pop(rid), strict=True):
                m.free(r)
        if deferred and rng.random() < 0.3:
            popped = deferred.pop(0)
            for m, blocks in zip((ref, kvn), popped, strict=True):
                m.block_pool.free_blocks(reversed(blocks))
        _same(ref, kvn, running, pairs)
        seen["steps with copies"] += _copies(kvn) > 0
        steps += 1
    for popped in deferred:
        for m, blocks in zip((ref, kvn), popped, strict=True):
            m.block_pool.free_blocks(reversed(blocks))
    for pair in running.values():
        for m, r in zip((ref, kvn), pair, strict=True):
            m.free(r)
    _same(ref, kvn, {}, pairs)
    assert ref.reset_prefix_cache() and kvn.reset_prefix_cache()
    _same(ref, kvn, {}, pairs)
    return steps


@pytest.mark.parametrize("eviction", kvnumba.EVICTION_POLICIES)
def test_every_eviction_policy_serves_a_hybrid_model(eviction):
    # Shared prefixes, a pool small enough to evict, window releases, preemptions: the
    # adapter's view stays consistent with kvnumba's state under every policy.
    rng = random.Random(eviction)
    kvn = KVNumbaGroupsKVCacheManager(
        _config(LAYOUTS["full+sw+chunk"], 60),
        max_model_len=512,
        scheduler_block_size=BS,
        hash_block_size=BS,
        eviction=eviction,
        enable_kv_cache_events=True,
    )
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(0, 9 * BS))] for _ in range(3)]
    running: dict[str, Request] = {}
    hits = 0
    for serial in range(300):
        if rng.random() < 0.3 or not running:
            tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(5)]
            req = _request(f"r{serial}", tokens)
            blocks, num_hit, _ = kvn.get_computed_blocks(req)
            hits += num_hit
            if kvn.allocate_slots(req, len(tokens) - num_hit, num_hit, blocks) is not None:
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = len(tokens)
                running[req.request_id] = req
        elif rng.random() < 0.8:
            req = running[rng.choice(list(running))]
            req.append_output_token_ids(rng.randrange(1000))
            if kvn.allocate_slots(req, 1) is None:
                kvn.free(running.pop(req.request_id))
            else:
                req.num_computed_tokens += 1
        else:
            kvn.free(running.pop(rng.choice(list(running))))
        kvn.take_events()
        kvn.check()
    assert hits > 0


def _reason(config: KVCacheConfig, **kwargs) -> str | None:
    from kvnumba.integrations.vllm.support import manager_fallback_reason

    args = dict(scheduler_block_size=BS, hash_block_size=BS) | kwargs
    return manager_fallback_reason(config, **args)


def test_hybrid_and_windowed_layouts_are_served_by_the_groups_manager():
    from kvnumba.integrations.vllm.scheduler import SwitchingKVCacheManager, kvnumba_enabled

    args = dict(max_model_len=512, scheduler_block_size=BS, hash_block_size=BS)
    for kinds, retention in [(["full", "sw8"], 0), (["sw6"], None), (["full", "chunk8"], 0)]:
        config = _config(kinds, 40, retention)
        assert _reason(config) is None
        with kvnumba_enabled():
            manager = SwitchingKVCacheManager(config, **args)
        assert type(manager) is KVNumbaGroupsKVCacheManager
        assert manager.num_kv_cache_groups == len(kinds)
    with kvnumba_enabled():
        manager = SwitchingKVCacheManager(_config(["full"], 40), **args)
    assert type(manager).__name__ == "KVNumbaKVCacheManager"


def test_the_one_group_manager_refuses_a_hybrid_layout():
    from kvnumba.integrations.vllm import KVNumbaKVCacheManager

    with pytest.raises(ValueError, match="KVNumbaGroupsKVCacheManager"):
        KVNumbaKVCacheManager(
            _config(["full", "sw8"], 40),
            max_model_len=512,
            scheduler_block_size=BS,
            hash_block_size=BS,
        )


def test_layouts_kvnumba_does_not_serve_name_their_reason():
    from vllm.v1.kv_cache_interface import MambaSpec

    mamba = MambaSpec(block_size=BS, shapes=((1, 1),), dtypes=(torch.float32,))
    hybrid = _config(["full", "sw8"], 40)
    hybrid.kv_cache_groups.append(KVCacheGroupSpec(["m"], mamba))
    assert "MambaSpec" in _reason(hybrid)
    assert "retention" in _reason(_config(["full", "sw8"], 40, retention=2 * BS))
    assert "EAGLE" in _reason(_config(["full", "sw8"], 40), use_eagle=True)
    assert "EAGLE" in _reason(_config(["chunk8"], 40), num_prefill_lookahead=2)
    assert "at most 8" in _reason(_config(["full"] + ["sw8"] * 8, 40))
    assert "block size" in _reason(_config(["full", "sw8"], 40), scheduler_block_size=2 * BS)
    wide = SlidingWindowSpec(**_SPEC, sliding_window=8, extra_retained_tokens=2)
    assert "extra retained" in _reason(
        KVCacheConfig(
            num_blocks=40,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(["a"], FullAttentionSpec(**_SPEC)),
                KVCacheGroupSpec(["b"], wide),
            ],
        )
    )
    # EAGLE over one full-attention group stays served by the one-group manager.
    assert _reason(_config(["full"], 40), use_eagle=True) is None
