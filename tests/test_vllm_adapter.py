"""kvnumba's vLLM adapter against vLLM's own manager, call for call (needs vLLM 0.32-0.33).

Skipped without vLLM; ``scripts/vllm_env.sh compare`` runs it in the vLLM test environment
(``--noconftest``: that environment has no hypothesis). The randomized test drives vLLM's
``KVCacheManager`` and ``KVNumbaKVCacheManager`` with the same requests and calls and compares
what the scheduler sees: prefix hits, whether an allocation fits, the number of new blocks, free
and cached block counts, ``usage``; after every call the adapter passes its ``check()``. Prompts
end in a block of their own outputs are random and prompts admitted in chunks share no prefix, so no two blocks share a hash
(vLLM would cache both, kvnumba registers one: ``docs/vllm.md``); block ids are not compared (the free order
of one release differs on purpose).
"""

from __future__ import annotations

import os
import random

import pytest

from kvnumba.integrations.vllm.version import SUPPORTED_RELEASES, release_of  # noqa: E402

vllm = pytest.importorskip("vllm")
if release_of(vllm.__version__) not in SUPPORTED_RELEASES:
    pytest.skip("the adapter is written for vLLM 0.32.x-0.33.x", allow_module_level=True)

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

import kvnumba  # noqa: E402
from kvnumba.integrations.vllm import KVNumbaKVCacheManager  # noqa: E402
from kvnumba.integrations.vllm.scheduler import _VLLM_KV_CACHE_MANAGER  # noqa: E402

BS = 4


def _config(num_blocks: int) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def _managers(num_blocks: int, **kwargs):
    args = dict(max_model_len=512, scheduler_block_size=BS, hash_block_size=BS, **kwargs)
    return (
        _VLLM_KV_CACHE_MANAGER(_config(num_blocks), **args),
        KVNumbaKVCacheManager(_config(num_blocks), **args),
    )


def _request(rid: str, tokens: list[int], max_tokens: int = 1000) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
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


def _same_view(ref, kvn) -> None:
    assert kvn.block_pool.get_num_free_blocks() == ref.block_pool.get_num_free_blocks()
    assert kvn.usage == pytest.approx(ref.usage)
    assert len(kvn.block_pool.cached_block_hash_to_block) == len(
        ref.block_pool.cached_block_hash_to_block
    )
    # Blocks registered per hash: copies of a cached block are cached beside it on both sides.
    assert _copies(kvn) == _copies(ref)
    kvn.check()


def _copies(manager) -> list[int]:
    """Blocks registered per hash, sorted (more than 1: a block computed again is cached)."""
    held = manager.block_pool.cached_block_hash_to_block._cache.values()
    return sorted(len(v) if isinstance(v, dict) else 1 for v in held)


@pytest.mark.parametrize("seed", range(int(os.environ.get("KVNUMBA_VLLM_SEEDS", "6"))))
def test_adapter_matches_vllm_manager(seed):
    rng = random.Random(seed)
    ref, kvn = _managers(rng.choice([24, 40, 80]))
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(0, 5 * BS))] for _ in range(4)]
    running: dict[str, tuple[Request, Request]] = {}
    serial = copies = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.3 or not running:
            serial += 1
            rid = f"r{serial}"
            chunked = rng.random() < 0.3
            # Shared prefixes, prompts of whole blocks (the last one is computed again) and
            # few distinct output tokens: blocks equal to cached ones are computed again.
            tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(9))]
            if rng.random() < 0.3 and len(tokens) > BS:
                tokens = tokens[: len(tokens) // BS * BS]
            tokens = tokens or [rng.randrange(1000)]
            pair = (_request(rid, tokens), _request(rid, tokens))
            hits = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), pair, strict=True)]
            assert hits[0][1] == hits[1][1], "prefix hit tokens"
            num_new = len(tokens) - hits[0][1]
            if chunked:
                num_new = rng.randrange(1, num_new + 1)  # a first chunk
            got = [
                m.allocate_slots(r, num_new, h[1], h[0])
                for m, r, h in zip((ref, kvn), pair, hits, strict=True)
            ]
            assert (got[0] is None) == (got[1] is None), "admission fits"
            if got[0] is not None:
                assert len(got[0].blocks[0]) == len(got[1].blocks[0])
                for r in pair:
                    r.status = RequestStatus.RUNNING
                    r.num_computed_tokens = hits[0][1] + num_new
                running[rid] = pair
        elif op < 0.85:
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
            lookahead = rng.choice([0, 0, 3])
            got = [
                m.allocate_slots(r, num_new, num_lookahead_tokens=lookahead)
                for m, r in zip((ref, kvn), pair, strict=True)
            ]
            assert (got[0] is None) == (got[1] is None), "growth fits"
            if got[0] is not None:
                assert len(got[0].blocks[0]) == len(got[1].blocks[0]), "new blocks"
                for r in pair:
                    r.num_computed_tokens += num_new
            elif rng.random() < 0.5:  # preempt it, as the scheduler would
                for m, r in zip((ref, kvn), pair, strict=True):
                    m.free(r)
                del running[rid]
        else:
            rid = rng.choice(list(running))
            for m, r in zip((ref, kvn), running.pop(rid), strict=True):
                m.free(r)
        _same_view(ref, kvn)
        copies += max(_copies(kvn), default=1) > 1
        for rid in running:
            assert len(kvn.get_block_ids(rid)[0]) == len(ref.get_block_ids(rid)[0])
    for pair in running.values():
        for m, r in zip((ref, kvn), pair, strict=True):
            m.free(r)
    _same_view(ref, kvn)
    assert ref.reset_prefix_cache() and kvn.reset_prefix_cache()
    _same_view(ref, kvn)
    assert copies > 0, "no step held a copy of a cached block"


@pytest.mark.parametrize("eviction", kvnumba.EVICTION_POLICIES)
def test_every_eviction_policy_serves_the_scheduler_calls(eviction, monkeypatch):
    # The policy comes from the environment (vLLM builds the manager); shared prefixes, a
    # pool small enough to evict, preemptions: the adapter's view stays consistent.
    monkeypatch.setenv("KVNUMBA_EVICTION", eviction)
    kvn = _managers(24, enable_kv_cache_events=True)[1]
    assert kvn.kvnumba.eviction == eviction
    rng = random.Random(eviction)
    prefixes = [[rng.randrange(1000) for _ in range(3 * BS)] for _ in range(3)]
    running, hits, serial = {}, 0, 0
    for _ in range(200):
        if rng.random() < 0.4 or not running:
            serial += 1
            tokens = rng.choice(prefixes) + [100_000 + serial] * (BS + 1)
            req = _request(f"r{serial}", tokens)
            blocks, cached = kvn.get_computed_blocks(req)[:2]
            hits += cached
            if kvn.allocate_slots(req, len(tokens) - cached, cached, blocks) is not None:
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = len(tokens)
                running[req.request_id] = req
        else:
            req = running.pop(rng.choice(list(running)))
            if rng.random() < 0.5:
                req.append_output_token_ids(rng.randrange(1000))
                if kvn.allocate_slots(req, 1) is not None:
                    req.num_computed_tokens += 1
                    running[req.request_id] = req
                    continue
            kvn.free(req)
        kvn.check()
    assert hits > 0 and kvn.kvnumba.stats().evictions > 0
    removed = sum(type(e).__name__ == "BlockRemoved" for e in kvn.take_events())
    assert removed > 0
    for req in running.values():
        kvn.free(req)
    assert kvn.reset_prefix_cache()
    kvn.check()


def test_events_of_a_decode_step_that_fills_a_block():
    ref, kvn = _managers(16, enable_kv_cache_events=True)
    pair = [_request("a", list(range(BS + 2))) for _ in range(2)]
    for m, r in zip((ref, kvn), pair, strict=True):
        m.allocate_slots(r, BS + 2, num_lookahead_tokens=BS)  # slots for the next block already
        r.num_computed_tokens = BS + 2
    for _ in range(BS - 2):
        for m, r in zip((ref, kvn), pair, strict=True):
            r.append_output_token_ids(7)
            assert m.allocate_slots(r, 1, num_lookahead_tokens=BS) is not None
            r.num_computed_tokens += 1
    events = [m.take_events() for m in (ref, kvn)]
    assert events[0] == events[1] and len(events[0]) == 2
    for m, r in zip((ref, kvn), pair, strict=True):
        m.free(r)
    assert ref.reset_prefix_cache() and kvn.reset_prefix_cache()
    assert [type(e) for e in ref.take_events()] == [type(e) for e in kvn.take_events()]


def test_reset_refused_while_blocks_are_held():
    ref, kvn = _managers(16)
    pair = [_request("a", list(range(2 * BS))) for _ in range(2)]
    for m, r in zip((ref, kvn), pair, strict=True):
        m.allocate_slots(r, 2 * BS)
    assert not ref.reset_prefix_cache() and not kvn.reset_prefix_cache()
    _same_view(ref, kvn)


def _fill(ref, kvn, rid: str, blocks: int) -> tuple[Request, Request]:
    """A running request holding ``blocks`` fresh blocks in both managers (unique tokens)."""
    tokens = [10_000 * ord(rid[0]) + i for i in range(blocks * BS)]
    pair = (_request(rid, tokens), _request(rid, tokens))
    for m, r in zip((ref, kvn), pair, strict=True):
        assert m.allocate_slots(r, blocks * BS) is not None
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = blocks * BS
    return pair


@pytest.mark.parametrize("spare", [-1, 0, 1])
def test_one_free_block_decides_an_admission(spare):
    # 10 blocks, the null block never free: 9 usable. A holds 6, so 3 are free, and the new
    # request asks for 3 + spare: it fits exactly when spare <= 0, in both managers.
    ref, kvn = _managers(10)
    _fill(ref, kvn, "a", 6)
    free = ref.block_pool.get_num_free_blocks()
    assert free == kvn.block_pool.get_num_free_blocks() == 3
    tokens = [70_000 + i for i in range((free + spare) * BS)]
    pair = (_request("b", tokens), _request("b", tokens))
    got = [m.allocate_slots(r, len(tokens)) for m, r in zip((ref, kvn), pair, strict=True)]
    assert (got[0] is None) == (spare > 0)
    assert (got[1] is None) == (spare > 0), "kvnumba decides the last free block otherwise"
    _same_view(ref, kvn)


@pytest.mark.parametrize("spare", [-1, 0, 1])
def test_one_free_block_decides_a_decode_step(spare):
    # A decode step that crosses into new blocks (lookahead slots) when exactly ``1 + spare``
    # more blocks than are free would be needed.
    ref, kvn = _managers(10)
    a = _fill(ref, kvn, "a", 4)
    _fill(ref, kvn, "b", 3)
    free = ref.block_pool.get_num_free_blocks()
    assert free == kvn.block_pool.get_num_free_blocks() == 2
    lookahead = (free + spare) * BS - 1  # one sampled token plus these fill free + spare blocks
    got = []
    for m, r in zip((ref, kvn), a, strict=True):
        r.append_output_token_ids(5)
        got.append(m.allocate_slots(r, 1, num_lookahead_tokens=lookahead))
    assert (got[0] is None) == (spare > 0)
    assert (got[1] is None) == (spare > 0), "kvnumba decides the last free block otherwise"
    if got[0] is not None:
        assert len(got[0].blocks[0]) == len(got[1].blocks[0]) == free + spare
    _same_view(ref, kvn)


def test_a_deferred_free_holds_the_blocks_until_the_pool_takes_them_back():
    # vLLM's scheduler defers a free while a step in flight may write the blocks:
    # pop_blocks_for_free drops the request, block_pool.free_blocks returns its blocks later.
    ref, kvn = _managers(12)
    a = _fill(ref, kvn, "a", 3)
    _fill(ref, kvn, "b", 2)
    ids = kvn.get_block_ids("a")[0]
    for m, r in zip((ref, kvn), a, strict=True):
        m.cache_blocks(r, 3 * BS)
    popped = [m.pop_blocks_for_free(r) for m, r in zip((ref, kvn), a, strict=True)]
    assert [b.block_id for b in popped[1]] == ids
    assert len(popped[0]) == 3
    assert kvn.get_block_ids("a") == ([],)  # the request's bookkeeping is gone
    assert [[b.block_id for b in h.blocks] for h in kvn.deferred.values()] == [ids]
    _same_view(ref, kvn)  # still held: the free count has not moved
    with pytest.raises(ValueError, match="pop_blocks_for_free"):
        kvn.block_pool.free_blocks(popped[1][:2])  # not all of them
    for m, blocks in zip((ref, kvn), popped, strict=True):
        m.block_pool.free_blocks(reversed(blocks))
    _same_view(ref, kvn)
    assert not kvn.deferred
    # Its full blocks stayed cached: the same prompt hits them.
    again = [_request("a2", list(r.all_token_ids) + [1]) for r in a]
    hits = [m.get_computed_blocks(r)[1] for m, r in zip((ref, kvn), again, strict=True)]
    assert hits[0] == hits[1] == 3 * BS
    assert kvn.pop_blocks_for_free(_request("none", [1, 2, 3])) == []


# Schedulers: one class name for both of vLLM's scheduling modes.

_VLLM_CONFIGS: dict[bool, object] = {}


def _vllm_config(async_scheduling: bool):
    """A ``VllmConfig`` of the tests' model with prefix caching (built once per mode)."""
    if async_scheduling not in _VLLM_CONFIGS:
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

        model_config = ModelConfig(
            model="facebook/opt-125m",
            dtype="float16",
            seed=0,
            max_model_len=512,
            skip_tokenizer_init=True,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=512,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=async_scheduling,
            watermark=0.0,  # admission depends on the pool alone, as in vLLM's tests
        )
        cache_config = CacheConfig(block_size=BS, cache_dtype="auto", enable_prefix_caching=True)
        cache_config.num_gpu_blocks = 64
        config = VllmConfig(
            model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config
        )
        # vLLM's CPU platform turns async scheduling off; the flag as a GPU engine leaves it.
        config.scheduler_config.async_scheduling = async_scheduling
        register_all_kvcache_specs(config)
        _VLLM_CONFIGS[async_scheduling] = config
    return _VLLM_CONFIGS[async_scheduling]


def _scheduler(cls, async_scheduling: bool, num_blocks: int = 64):
    from vllm.v1.structured_output import StructuredOutputManager

    config = _vllm_config(async_scheduling)
    return cls(
        vllm_config=config,
        kv_cache_config=_config(num_blocks),
        block_size=BS,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
    )


def test_async_config_builds_the_async_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvnumba.integrations.vllm import KVNumbaAsyncScheduler, KVNumbaScheduler

    assert KVNumbaAsyncScheduler.__mro__[:4] == (
        KVNumbaAsyncScheduler,
        KVNumbaScheduler,
        AsyncScheduler,
        Scheduler,
    )
    for cls in (KVNumbaScheduler, KVNumbaAsyncScheduler):
        scheduler = _scheduler(cls, async_scheduling=True)
        assert type(scheduler) is KVNumbaAsyncScheduler
        assert isinstance(scheduler, AsyncScheduler)
        assert type(scheduler.kv_cache_manager) is KVNumbaKVCacheManager


def test_sync_config_builds_the_plain_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvnumba.integrations.vllm import KVNumbaScheduler

    scheduler = _scheduler(KVNumbaScheduler, async_scheduling=False)
    assert type(scheduler) is KVNumbaScheduler
    assert not isinstance(scheduler, AsyncScheduler)
    assert type(scheduler.kv_cache_manager) is KVNumbaKVCacheManager


def test_a_subclass_is_constructed_as_itself():
    from kvnumba.integrations.vllm import KVNumbaScheduler

    class Custom(KVNumbaScheduler):
        pass

    scheduler = _scheduler(Custom, async_scheduling=True)
    assert type(scheduler) is Custom
    assert type(scheduler.kv_cache_manager) is KVNumbaKVCacheManager


def _runner_output(scheduler_output):
    """One sampled token per scheduled request, derived from the request and its progress."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[500 + 7 * int(rid[1:]) + n % 5] for n, rid in enumerate(req_ids)],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def _step_view(scheduler, scheduler_output) -> dict:
    """What a model runner and the engine see of one step: tokens and block counts."""
    blocks = {}
    new = scheduler_output.scheduled_new_reqs
    for data in new:
        blocks[data.req_id] = [len(ids) for ids in data.block_ids]
    cached = scheduler_output.scheduled_cached_reqs
    for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
        blocks[rid] = None if ids is None else [len(group) for group in ids]
    return {
        "tokens": dict(scheduler_output.num_scheduled_tokens),
        "computed": {d.req_id: d.num_computed_tokens for d in new},
        "blocks": blocks,
        "finished": sorted(scheduler_output.finished_req_ids),
        "free": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
    }


def _drive_async(scheduler) -> list[dict]:
    """Async scheduling's pattern: schedule step n+1 before the output of step n arrives."""
    import collections

    prefix = list(range(3 * BS))
    arrivals = {
        0: [("r1", prefix + [40, 41]), ("r2", prefix + [50, 51, 52, 53, 54])],
        2: [("r3", prefix + [60]), ("r4", list(range(200, 200 + 2 * BS + 1)))],
        5: [("r5", prefix + [40, 41, 42])],
    }
    max_tokens = {"r1": 3, "r2": 6, "r3": 9, "r4": 4, "r5": 5}
    views, in_flight, outputs = [], collections.deque(), []
    for step in range(40):
        for rid, tokens in arrivals.get(step, []):
            scheduler.add_request(_request(rid, tokens, max_tokens[rid]))
        scheduler_output = scheduler.schedule()
        views.append(_step_view(scheduler, scheduler_output))
        in_flight.append(scheduler_output)
        if len(in_flight) == 2 or not scheduler_output.num_scheduled_tokens:
            done = in_flight.popleft()
            engine_outputs = scheduler.update_from_output(done, _runner_output(done))
            for eco in engine_outputs.values():
                outputs += [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs]
        if step > 5 and not scheduler.get_num_unfinished_requests() and not in_flight:
            break
    views.append({"outputs": outputs})
    return views


def test_async_steps_match_vllm_async_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvnumba.integrations.vllm import KVNumbaAsyncScheduler, KVNumbaScheduler

    ref = _scheduler(AsyncScheduler, async_scheduling=True, num_blocks=24)
    kvn = _scheduler(KVNumbaScheduler, async_scheduling=True, num_blocks=24)
    assert type(kvn) is KVNumbaAsyncScheduler
    assert type(ref.kv_cache_manager) is not KVNumbaKVCacheManager
    assert type(kvn.kv_cache_manager) is KVNumbaKVCacheManager
    got_ref = _drive_async(ref)
    got_kvn = _drive_async(kvn)
    kvn.kv_cache_manager.check()
    assert len(got_kvn) == len(got_ref)
    for n, (a, b) in enumerate(zip(got_ref, got_kvn, strict=True)):
        assert b == a, f"step {n}"
    finished = {rid for rid, _, reason in got_ref[-1]["outputs"] if reason is not None}
    assert finished == {"r1", "r2", "r3", "r4", "r5"}
    assert sum(v["computed"].get("r5", 0) for v in got_ref[:-1]) > 0, "r5 hits the prefix"


def _ids(blocks) -> list[int]:
    return [b.block_id for b in blocks.blocks[0]]


def test_block_lists_follow_growth_free_and_preemption():
    # get_blocks hands out the request's own list, as vLLM's manager does: a list taken earlier
    # grows with the request; the new blocks allocate_slots returns are a list of their own.
    ref, kvn = _managers(32)
    pair = _fill(ref, kvn, "a", 2)
    taken = [m.get_blocks("a") for m in (ref, kvn)]
    assert len(taken[0].blocks[0]) == len(taken[1].blocks[0]) == 2
    new = []
    for m, r in zip((ref, kvn), pair, strict=True):
        r.append_output_token_ids(5)
        new.append(m.allocate_slots(r, 1, num_lookahead_tokens=2 * BS))
        r.num_computed_tokens += 1
    assert len(new[0].blocks[0]) == len(new[1].blocks[0]) == 3
    for t, m in zip(taken, (ref, kvn), strict=True):
        assert len(t.blocks[0]) == 5, "the list taken earlier grew in place"
        assert _ids(t) == m.get_block_ids("a")[0] == _ids(m.get_blocks("a"))
    for m, r in zip((ref, kvn), pair, strict=True):  # more slots: the earlier result stays
        r.append_output_token_ids(6)
        assert m.allocate_slots(r, 1, num_lookahead_tokens=4 * BS) is not None
        r.num_computed_tokens += 1
    assert len(new[0].blocks[0]) == len(new[1].blocks[0]) == 3
    assert _ids(kvn.get_blocks("a")) == kvn.get_block_ids("a")[0]
    assert kvn.coordinator.get_blocks("a")[0] is kvn.get_blocks("a").blocks[0]
    kvn.check()
    # Preemption frees the request; re-admitted, it gets a fresh list, hits first.
    held_before = kvn.get_block_ids("a")[0]
    for m, r in zip((ref, kvn), pair, strict=True):
        m.free(r)
        assert m.get_blocks("a") is m.empty_kv_cache_blocks
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
    assert len(taken[1].blocks[0]) == 7, "a freed request's list is left as it was"
    hits = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), pair, strict=True)]
    assert hits[0][1] == hits[1][1] == 2 * BS
    assert _ids(hits[1][0]) == held_before[:2]
    for m, r, h in zip((ref, kvn), pair, hits, strict=True):
        assert m.allocate_slots(r, r.num_tokens - h[1], h[1], h[0]) is not None
    again = kvn.get_blocks("a")
    assert again.blocks[0] is not taken[1].blocks[0]
    assert _ids(again) == kvn.get_block_ids("a")[0] and _ids(again)[:2] == held_before[:2]
    assert len(again.blocks[0]) == len(ref.get_blocks("a").blocks[0])
    _same_view(ref, kvn)


def test_a_corrupted_block_list_is_caught():
    # vLLM's scheduler never changes the lists it is handed (vLLM's own manager keeps the same
    # list); check() catches one that was changed, and a replaced wrapper is not reused.
    _, kvn = _managers(16)
    tokens = list(range(3 * BS))
    r = _request("a", tokens)
    kvn.allocate_slots(r, len(tokens))
    blocks = kvn.get_blocks("a")
    blocks.blocks = ([],)
    assert _ids(kvn.get_blocks("a")) == kvn.get_block_ids("a")[0]
    kvn.check()
    kvn.get_blocks("a").blocks[0].pop()
    with pytest.raises(kvnumba.InvariantViolation, match="block list"):
        kvn.check()


def test_lookup_keys_follow_a_rebuilt_hash_list():
    # A waiting request's keys are converted once and reused; vLLM clears or cuts and regrows
    # the hash list of a streaming session, and the lookup must then use the new hashes.
    ref, kvn = _managers(32)
    prompts = {"x": list(range(3 * BS)), "y": list(range(500, 500 + 3 * BS))}
    block_ids = {}
    for rid, tokens in prompts.items():
        for m in (ref, kvn):
            r = _request(rid, tokens)
            m.allocate_slots(r, len(tokens))
            r.num_computed_tokens = len(tokens)
            block_ids[rid] = m.get_block_ids(rid)[0]  # kvnumba's, the last of the two
            m.free(r)
    hashes = {rid: _request(rid, t + [7]).block_hashes for rid, t in prompts.items()}
    probe = [_request("p", prompts["x"] + [7]) for _ in range(2)]

    def lookup(want: int, rid: str) -> None:
        got = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), probe, strict=True)]
        assert got[0][1] == got[1][1] == want * BS
        assert _ids(got[1][0]) == block_ids[rid][:want]

    lookup(3, "x")
    lookup(3, "x")  # the converted keys again
    for r in probe:  # rebuilt shorter: the other prompt's first two blocks
        r.block_hashes.clear()
        r.block_hashes.extend(hashes["y"][:2])
    lookup(2, "y")
    for r in probe:  # cut below what was converted
        del r.block_hashes[1:]
    lookup(1, "y")
    for r in probe:  # as long as before, other hashes
        r.block_hashes[:] = hashes["x"]
    lookup(3, "x")
    kvn.check()


def test_a_lookup_sees_keys_queued_by_a_running_request():
    # Request a computes its prompt in two chunks; the second chunk's block keys are queued
    # (registered in one batch later). A lookup whose first missed block is one of them must
    # register them first and hit them; one that misses elsewhere leaves them queued.
    ref, kvn = _managers(32)
    tokens = list(range(4 * BS)) + [9]
    pair = (_request("a", tokens), _request("a", tokens))
    for m, r in zip((ref, kvn), pair, strict=True):
        assert m.allocate_slots(r, 2 * BS) is not None
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = 2 * BS
        assert m.allocate_slots(r, 2 * BS) is not None
        r.num_computed_tokens = 4 * BS
    assert kvn._pending, "the second chunk's keys are queued"
    other = [_request("o", list(range(900, 900 + 3 * BS))) for _ in range(2)]
    got = [m.get_computed_blocks(r)[1] for m, r in zip((ref, kvn), other, strict=True)]
    assert got == [0, 0]
    assert kvn._pending, "a lookup that cannot hit a queued key registers nothing"
    same = [_request("b", tokens[: 4 * BS] + [5]) for _ in range(2)]
    got = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), same, strict=True)]
    assert got[0][1] == got[1][1] == 4 * BS
    assert _ids(got[1][0]) == kvn.get_block_ids("a")[0][:4]
    assert not kvn._pending
    _same_view(ref, kvn)


@pytest.mark.parametrize("first_chunk", [10, 36])
def test_long_hits_past_the_first_keys_looked_at(first_chunk):
    # A lookup first looks at a window of keys and at all of them only when the window hits in
    # full; the blocks past it, queued (second chunk) or registered, are hit as vLLM hits them.
    ref, kvn = _managers(128)
    tokens = list(range(40 * BS)) + [9]
    pair = (_request("a", tokens), _request("a", tokens))
    for m, r in zip((ref, kvn), pair, strict=True):
        assert m.allocate_slots(r, first_chunk * BS) is not None
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = first_chunk * BS
        assert m.allocate_slots(r, (40 - first_chunk) * BS) is not None
        r.num_computed_tokens = 40 * BS
    for want in (40, 35, 33, 32, 31):
        same = [_request(f"b{want}", tokens[: want * BS] + [5, 6]) for _ in range(2)]
        got = [m.get_computed_blocks(r) for m, r in zip((ref, kvn), same, strict=True)]
        assert got[0][1] == got[1][1] == want * BS
        assert _ids(got[1][0]) == kvn.get_block_ids("a")[0][:want]
    _same_view(ref, kvn)
