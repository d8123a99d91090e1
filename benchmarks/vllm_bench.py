"""Side-by-side benchmark of vLLM's own Scheduler with vLLM's KV cache manager and kvnumba's.

Run inside a cached vLLM CPU environment (``scripts/vllm_env.sh [--vllm 0.32.0] bench [ARGS]``;
``--async-scheduling`` drives vLLM's ``AsyncScheduler`` and ``KVNumbaAsyncScheduler``). In one
process it builds a request stream (the Mooncake trace's lengths and 512-token prefix structure,
or a synthetic stream), then drives vLLM's ``Scheduler`` through it step by step: ``schedule()``,
a fake ``ModelRunnerOutput`` with one sampled token per request that finished its prefill, and
``update_from_output()``. Each request stops at its trace output length. No model runs; only the
scheduler and its KV cache manager do work.

Every run gets a fresh scheduler. The one with vLLM's manager is ``vllm``'s own ``Scheduler``;
the one with kvnumba's is ``kvnumba.integrations.vllm.KVNumbaScheduler`` (a ``Scheduler``
subclass that builds a ``KVNumbaKVCacheManager`` in place of vLLM's). The scheduler's manager is
replaced by a timing proxy: every public method and property the scheduler reaches through
``scheduler.kv_cache_manager`` (including ``.block_pool.*`` and ``.coordinator.*``) is timed with
``time.perf_counter_ns`` and counted. Calls the manager makes internally are not wrapped, so they
cost nothing extra and are not counted twice.

Per step it records the KV-manager time, the ``schedule()`` and ``update_from_output()`` times,
and what was scheduled (tokens per request, preemptions, prefix-cache queries and hits), then
checks that every run scheduled the same thing as the first one and prints a table of medians
and means with the kvnumba/vLLM ratios, then a per-call table of the scheduler's per-request
calls (``get_computed_blocks``, ``allocate_slots``, ``get_blocks``, ``free``: mean and median
microseconds per call) with the KV-manager time per step. ``--json PATH`` writes all of it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The Mooncake trace's hash_ids each stand for this many prompt tokens.
TRACE_HASH_BLOCK = 512

# The calls the scheduler makes per request (admission, every step, output, finish): the
# per-call table, for which every call's time is kept (for medians).
PER_CALL_METHODS = ("get_computed_blocks", "allocate_slots", "get_blocks", "free")

# vLLM and the integration log each scheduler's construction; this benchmark builds several.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


# --------------------------------------------------------------------------------------------
# Request streams
# --------------------------------------------------------------------------------------------


@dataclass
class RequestSpec:
    """One request of the stream, independent of any engine object.

    Attributes
    ----------
    req_id : str
        Request id given to vLLM.
    arrival_step : int
        Virtual step at which the request is handed to ``Scheduler.add_request``.
    prompt : numpy.ndarray
        int64 prompt token ids.
    output_len : int
        Tokens to generate; the request finishes (length-capped) after this many.
    """

    req_id: str
    arrival_step: int
    prompt: np.ndarray
    output_len: int


@dataclass
class Stream:
    """A request stream and how it was made.

    Attributes
    ----------
    specs : list of RequestSpec
        Requests in arrival order.
    info : dict
        Parameters and summary numbers, copied into the report.
    """

    specs: list[RequestSpec]
    info: dict = field(default_factory=dict)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer, elementwise on uint64 (wrapping arithmetic).

    Used to derive token ids from (hash id, position) so that equal trace hash ids give equal
    token blocks and different ones give different tokens, without keeping a table of blocks.
    """
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _block_tokens(block_id: int, n: int, vocab: int, salt: int) -> np.ndarray:
    """The first ``n`` token ids of the content block named ``block_id``."""
    pos = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = np.uint64((salt << 40) ^ (block_id << 16)) + pos
    # Token ids 0..99 are left out: they include special tokens of most vocabularies.
    return (_mix64(key) % np.uint64(vocab - 100)).astype(np.int64) + 100


def mooncake_stream(
    path: str,
    *,
    num_requests: int,
    offset: int,
    hash_block_tokens: int,
    ms_per_step: float,
    max_model_len: int,
    vocab: int,
) -> Stream:
    """Requests of the Mooncake trace with its lengths and prefix structure.

    Parameters
    ----------
    path : str
        ``mooncake_synthetic_trace.jsonl``.
    num_requests, offset : int
        Rows ``offset .. offset + num_requests - 1`` of the trace.
    hash_block_tokens : int
        Tokens each trace hash id stands for. 512 is the trace's own size; a smaller value
        shrinks every prompt by ``hash_block_tokens / 512`` (rounded up) and keeps the prefix
        structure exact in units of hash blocks.
    ms_per_step : float
        Trace milliseconds per scheduler step: arrivals are compressed to
        ``(timestamp - first) // ms_per_step``.
    max_model_len : int
        A prompt longer than ``max_model_len - output_len`` is cut to fit (keeping its prefix,
        so its sharing with other requests is unchanged up to the cut).
    vocab : int
        Vocabulary size of the model config.

    Returns
    -------
    Stream
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < offset:
                continue
            if len(rows) >= num_requests:
                break
            rows.append(json.loads(line))
    if not rows:
        raise SystemExit(f"no rows in {path} from offset {offset}")
    t0 = rows[0]["timestamp"]
    specs = []
    cut = 0
    block_cache: dict[int, np.ndarray] = {}
    for k, row in enumerate(rows):
        out_len = max(1, int(row["output_length"]))
        in_len = math.ceil(int(row["input_length"]) * hash_block_tokens / TRACE_HASH_BLOCK)
        ids = row["hash_ids"]
        if len(ids) != math.ceil(in_len / hash_block_tokens):
            raise SystemExit(f"trace row {offset + k}: hash_ids do not match input_length")
        limit = max_model_len - out_len
        if in_len > limit:
            in_len = max(1, limit)
            cut += 1
        parts = []
        need = in_len
        for h in ids:
            if need <= 0:
                break
            blk = block_cache.get(h)
            if blk is None:
                blk = block_cache[h] = _block_tokens(h, hash_block_tokens, vocab, salt=1)
            parts.append(blk[: min(need, hash_block_tokens)])
            need -= hash_block_tokens
        prompt = np.concatenate(parts)
        step = int((row["timestamp"] - t0) // ms_per_step)
        specs.append(RequestSpec(f"m{offset + k}", step, prompt, out_len))
    info = {
        "workload": "mooncake",
        "trace": path,
        "offset": offset,
        "num_requests": len(specs),
        "hash_block_tokens": hash_block_tokens,
        "ms_per_step": ms_per_step,
        "prompts_cut_to_max_model_len": cut,
        "trace_span_ms": rows[-1]["timestamp"] - t0,
    }
    info.update(_summary(specs))
    return Stream(specs, info)


def synthetic_stream(
    *,
    num_requests: int,
    rate: float,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    prefix_groups: int,
    prefix_len: int,
    max_model_len: int,
    vocab: int,
    seed: int,
) -> Stream:
    """A synthetic stream: uniform lengths, Poisson arrivals, optional shared prefixes.

    Parameters
    ----------
    num_requests : int
        Number of requests.
    rate : float
        Mean arrivals per scheduler step (Poisson).
    prompt_range, output_range : tuple of int
        Inclusive bounds of the uniform prompt and output lengths (W-decode's by default).
    prefix_groups, prefix_len : int
        With ``prefix_groups > 0`` each request draws a group and starts with that group's
        first ``min(prefix_len, prompt_len - 1)`` tokens (a shared system prompt); the rest of
        the prompt is its own.
    max_model_len, vocab, seed : int
        Length cap, vocabulary size, seed of ``numpy.random.default_rng``.

    Returns
    -------
    Stream
    """
    rng = np.random.default_rng(seed)
    specs = []
    step_f = 0.0
    for k in range(num_requests):
        step_f += rng.exponential(1.0 / rate) if rate > 0 else 0.0
        p = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
        o = int(rng.integers(output_range[0], output_range[1] + 1))
        o = min(o, max_model_len - 1)
        p = max(1, min(p, max_model_len - o))
        own = _block_tokens(1_000_000 + k, p, vocab, salt=2)
        if prefix_groups > 0:
            g = int(rng.integers(prefix_groups))
            n = min(prefix_len, p - 1)
            if n > 0:
                own[:n] = _block_tokens(g, n, vocab, salt=3)
        specs.append(RequestSpec(f"s{k}", int(step_f), own, o))
    info = {
        "workload": "synthetic",
        "num_requests": num_requests,
        "rate_per_step": rate,
        "prompt_range": list(prompt_range),
        "output_range": list(output_range),
        "prefix_groups": prefix_groups,
        "prefix_len": prefix_len,
        "seed": seed,
    }
    info.update(_summary(specs))
    return Stream(specs, info)


def _summary(specs: list[RequestSpec]) -> dict:
    """Length and arrival summary of a stream, for the report."""
    p = np.array([len(s.prompt) for s in specs])
    o = np.array([s.output_len for s in specs])
    return {
        "prompt_tokens_mean": round(float(p.mean()), 1),
        "prompt_tokens_max": int(p.max()),
        "output_tokens_mean": round(float(o.mean()), 1),
        "output_tokens_max": int(o.max()),
        "last_arrival_step": int(specs[-1].arrival_step),
    }


# --------------------------------------------------------------------------------------------
# Timing proxy of the KV cache manager
# --------------------------------------------------------------------------------------------


class Meter:
    """Time and calls spent in the KV cache manager, in total and per method.

    Attributes
    ----------
    ns : int
        Nanoseconds inside timed calls so far.
    calls : int
        Timed calls so far.
    per_method : dict
        ``"name" -> [calls, ns]``, names prefixed with the sub-object (``block_pool.x``).
    inside : bool
        A timed call is running (read by the garbage-collector callback).
    gc_ns, gc_in_kv_ns, gc_count : int
        Collector pauses so far: all of them, the part inside timed calls, how many.
    failed_call : str or None
        The last timed call that raised, with its arguments (:func:`describe_call`).
    """

    __slots__ = (
        "ns",
        "calls",
        "per_method",
        "inside",
        "gc_ns",
        "gc_in_kv_ns",
        "gc_count",
        "failed_call",
        "samples",
        "_t",
    )

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.per_method: dict[str, list[int]] = {}
        self.inside = False
        self.gc_ns = 0
        self.gc_in_kv_ns = 0
        self.gc_count = 0
        self.failed_call: str | None = None
        self.samples: dict[str, list[int]] = {name: [] for name in PER_CALL_METHODS}
        self._t = 0

    def gc_callback(self, phase: str, info: dict) -> None:
        """``gc.callbacks`` hook: add each collection's pause, and whether a KV call paid it.

        A collection runs when an allocation anywhere crosses the collector's threshold, so
        the code that pays for it is partly chance; the report shows it apart.
        """
        if phase == "start":
            self._t = time.perf_counter_ns()
            return
        dt = time.perf_counter_ns() - self._t
        self.gc_ns += dt
        self.gc_count += 1
        if self.inside:
            self.gc_in_kv_ns += dt

    def record(self, name: str) -> list[int]:
        """The ``[calls, ns]`` cell of one method (created empty)."""
        return self.per_method.setdefault(name, [0, 0])


def describe_call(name: str, args: tuple, kwargs: dict) -> str:
    """A one-line account of a manager call: requests by id and counters, the rest by repr."""

    def one(a) -> str:
        rid = getattr(a, "request_id", None)
        if isinstance(rid, str):
            return (
                f"Request({rid!r}, num_tokens={a.num_tokens}, num_prompt_tokens="
                f"{a.num_prompt_tokens}, num_computed_tokens={a.num_computed_tokens}, "
                f"num_output_tokens={a.num_output_tokens}, block_hashes="
                f"{len(a.block_hashes)}, num_preemptions={a.num_preemptions})"
            )
        text = repr(a)
        return text if len(text) <= 200 else text[:200] + "..."

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _timed(fn, meter: Meter, cell: list[int], name: str = "?", samples: list | None = None):
    """``fn`` wrapped to add its wall time and one call to ``meter`` and ``cell`` (and each
    call's time to ``samples``, when given)."""
    clock = time.perf_counter_ns
    keep = samples.append if samples is not None else None

    def timed(*args, **kwargs):
        meter.inside = True
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        except BaseException:
            # Kept for the failure report: which call, with what (costs nothing otherwise).
            meter.failed_call = describe_call(name, args, kwargs)
            raise
        finally:
            dt = clock() - t0
            meter.inside = False
            meter.ns += dt
            meter.calls += 1
            cell[0] += 1
            cell[1] += dt
            if keep is not None:
                keep(dt)

    return timed


class TimedProxy:
    """Stands in for an object the scheduler holds and times what it calls on it.

    Public methods are wrapped once and cached on the proxy; properties are timed on every
    access (they can compute, e.g. ``usage``); the sub-objects named in ``children`` are
    returned as proxies themselves; other attributes pass through untimed. Attribute writes go
    to the target. The target's own internal calls do not pass through the proxy.

    Parameters
    ----------
    target : object
        The real object (the KV cache manager).
    meter : Meter
        Where time and calls are added.
    prefix : str
        Name prefix of this object's methods in ``meter.per_method``.
    children : tuple of str
        Attributes to proxy as well (``block_pool``, ``coordinator``).
    """

    def __init__(self, target, meter: Meter, prefix: str = "", children=()) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_meter", meter)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_children", tuple(children))

    def __getattr__(self, name):
        target = object.__getattribute__(self, "_target")
        meter = object.__getattribute__(self, "_meter")
        prefix = object.__getattribute__(self, "_prefix")
        if name in object.__getattribute__(self, "_children"):
            child = TimedProxy(getattr(target, name), meter, f"{prefix}{name}.")
            object.__setattr__(self, name, child)
            return child
        static = inspect.getattr_static(target, name, None)
        if isinstance(static, property) and not name.startswith("_"):
            cell = meter.record(prefix + name)
            meter.inside = True
            t0 = time.perf_counter_ns()
            try:
                return getattr(target, name)
            finally:
                dt = time.perf_counter_ns() - t0
                meter.inside = False
                meter.ns += dt
                meter.calls += 1
                cell[0] += 1
                cell[1] += dt
        value = getattr(target, name)
        if callable(value) and inspect.ismethod(value) and not name.startswith("_"):
            wrapped = _timed(
                value,
                meter,
                meter.record(prefix + name),
                prefix + name,
                meter.samples.get(prefix + name),
            )
            # Cached on the proxy: later lookups skip __getattr__ entirely.
            object.__setattr__(self, name, wrapped)
            return wrapped
        return value

    def __setattr__(self, name, value) -> None:
        setattr(object.__getattribute__(self, "_target"), name, value)

    def __repr__(self) -> str:
        return f"TimedProxy({object.__getattribute__(self, '_target')!r})"


def wrapper_overhead_ns(n: int = 200_000) -> float:
    """Median cost in ns of one timed call of a no-op method, minus the bare call.

    Reported, not subtracted: it is paid equally by both managers for every call the scheduler
    makes, so it shifts both KV-manager times by (calls per step) x (this).
    """

    class _Noop:
        def f(self) -> None:
            return None

    meter = Meter()
    proxy = TimedProxy(_Noop(), meter)
    bare = _Noop().f
    timed = proxy.f
    res = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            timed()
        t1 = time.perf_counter_ns()
        for _ in range(n):
            bare()
        t2 = time.perf_counter_ns()
        res.append(((t1 - t0) - (t2 - t1)) / n)
    return statistics.median(res)


# --------------------------------------------------------------------------------------------
# Scheduler construction and the step loop
# --------------------------------------------------------------------------------------------


class Engine:
    """vLLM configuration shared by every run (building a ``ModelConfig`` takes seconds).

    Parameters
    ----------
    args : argparse.Namespace
        Command-line options (model, block size, pool size, scheduler limits).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from vllm.config import (
            CacheConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        self.args = args
        model_config = ModelConfig(
            model=args.model,
            dtype="float16",
            seed=0,
            max_model_len=args.max_model_len,
            skip_tokenizer_init=True,
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            # vLLM's tests use 0 so admission and preemption depend on the pool alone.
            watermark=0.0,
        )
        cache_config = CacheConfig(
            block_size=args.block_size,
            gpu_memory_utilization=0.9,
            cache_dtype="auto",
            enable_prefix_caching=not args.no_prefix_caching,
        )
        cache_config.num_gpu_blocks = args.num_blocks
        self.vllm_config = VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=ParallelConfig(),
        )
        # vLLM's CPU platform turns async scheduling off while it builds the config; a GPU engine
        # leaves it on, and this benchmark has no model runner to overlap with anyway.
        self.vllm_config.scheduler_config.async_scheduling = args.async_scheduling
        register_all_kvcache_specs(self.vllm_config)
        # The tests' spec: the pool is counted in blocks, the tensor shape does not matter here.
        self.kv_spec = FullAttentionSpec(
            block_size=args.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        self.vocab = model_config.get_vocab_size()
        hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(args.block_size, hash_fn)
        self.SamplingParams = SamplingParams

    def kv_cache_config(self):
        """A fresh ``KVCacheConfig`` of ``--num-blocks`` blocks: one full-attention group, and
        with ``--sliding-window W`` a sliding-window group beside it (a hybrid model, under
        vLLM's default retention interval 0)."""
        import torch
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

        groups = [KVCacheGroupSpec(["layer"], self.kv_spec)]
        window = self.args.sliding_window
        if window:
            spec = SlidingWindowSpec(
                block_size=self.args.block_size,
                num_kv_heads=1,
                head_size=1,
                dtype=torch.float32,
                sliding_window=window,
            )
            groups.append(KVCacheGroupSpec(["local"], spec))
        return KVCacheConfig(
            num_blocks=self.args.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=0 if window else None,
        )

    def scheduler(self, cls):
        """A new scheduler of class ``cls`` over a new pool."""
        from vllm.v1.structured_output import StructuredOutputManager

        return cls(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config(),
            block_size=self.args.block_size,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
        )

    def request(self, spec: RequestSpec):
        """A new vLLM ``Request`` for ``spec`` (block hashes are computed here, untimed)."""
        from vllm.v1.request import Request

        sp = self.SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
        return Request(
            request_id=spec.req_id,
            prompt_token_ids=spec.prompt.tolist(),
            sampling_params=sp,
            pooling_params=None,
            block_hasher=self.block_hasher,
        )


def scheduler_classes(async_scheduling: bool = False):
    """vLLM's scheduler class and kvnumba's ``KVNumbaScheduler`` (or the import error).

    Parameters
    ----------
    async_scheduling : bool
        vLLM's ``AsyncScheduler`` instead of its ``Scheduler``, as vLLM picks by the config;
        ``KVNumbaScheduler`` picks ``KVNumbaAsyncScheduler`` by the same flag itself.

    Returns
    -------
    tuple
        ``(vLLM's class, KVNumbaScheduler or None, error text or None)``.
    """
    if async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as Scheduler
    else:
        from vllm.v1.core.sched.scheduler import Scheduler

    try:
        import kvnumba

        # An editable install of another checkout in the shared venv registers an import hook
        # that serves submodules the checkout on PYTHONPATH lacks: refuse such a mixed kvnumba
        # before importing it (the integration rebinds names in vLLM's modules on import).
        root = Path(kvnumba.__file__).resolve().parent
        spec = importlib.util.find_spec("kvnumba.integrations")
        if spec is None or root not in Path(spec.origin).resolve().parents:
            where = spec.origin if spec is not None else "nowhere"
            return Scheduler, None, f"kvnumba.integrations is {where}, not in {root}"
        from kvnumba.integrations.vllm import KVNumbaScheduler
    except Exception as exc:  # any failure to import means: not ready, run native only
        return Scheduler, None, f"{type(exc).__name__}: {exc}"
    return Scheduler, KVNumbaScheduler, None


@dataclass
class RunResult:
    """Everything one run recorded.

    Attributes
    ----------
    label : str
        Manager label (``vllm``, ``kvnumba``, ``vllm-B``).
    steps : dict of str to list
        Per executed step: ``kv_ns``, ``kv_calls``, ``sched_ns``, ``update_ns``, ``tokens``,
        ``running``, ``waiting``, ``preempted``, ``queries``, ``hits``, ``preempted_queries``,
        ``preempted_hits``, ``finished``.
    scheduled : list of tuple
        Per step, the sorted ``(req_id, tokens)`` pairs scheduled.
    new_blocks : list of tuple
        Per step, the sorted ``(req_id, blocks)`` pairs of block ids handed to the model runner
        (all of a new or resumed request's, the new ones of a running request). The ids
        themselves may differ between managers; how many may not.
    cached_tokens : dict
        ``req_id -> (local cached tokens, cache-creation tokens)`` of the request's prefill,
        from the ``PrefillStats`` vLLM attaches to the request's first output.
    per_method : dict
        ``name -> [calls, ns]`` over the measured steps.
    call_samples : dict
        ``name -> [ns of each call]`` of the ``PER_CALL_METHODS``.
    add_kv_ns : int
        KV-manager time inside ``add_request`` (not part of any step).
    wall_s : float
        Wall time of the run.
    error : dict or None
        Where and how the run failed (step, requests of that step, traceback).
    manager_class : str
        Class of the manager the scheduler built.
    checked : bool
        The manager's ``check()`` passed after the run drained.
    """

    label: str
    steps: dict = field(default_factory=dict)
    scheduled: list = field(default_factory=list)
    new_blocks: list = field(default_factory=list)
    cached_tokens: dict = field(default_factory=dict)
    per_method: dict = field(default_factory=dict)
    call_samples: dict = field(default_factory=dict)
    add_kv_ns: int = 0
    wall_s: float = 0.0
    error: dict | None = None
    manager_class: str = ""
    checked: bool = False


STEP_FIELDS = (
    "kv_ns",
    "kv_calls",
    "sched_ns",
    "update_ns",
    "tokens",
    "running",
    "waiting",
    "preempted",
    "queries",
    "hits",
    "preempted_queries",
    "preempted_hits",
    "finished",
    "gc_ns",
    "gc_kv_ns",
    "step_cpu_ns",
)


def new_block_counts(so) -> tuple:
    """Sorted ``(req_id, number of block ids)`` the step hands to the model runner."""
    out = [(r.req_id, sum(len(g) for g in r.block_ids)) for r in so.scheduled_new_reqs]
    cached = so.scheduled_cached_reqs
    for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
        if ids is not None:
            out.append((rid, sum(len(g) for g in ids)))
    return tuple(sorted(out))


def fake_output(scheduler, so, token_seed: dict[str, int]):
    """The ``ModelRunnerOutput`` a model runner would return for ``so``.

    One sampled token for each scheduled request that is past its prefill (a chunk that ends
    before the prompt's end samples nothing, as vLLM's runners discard it). The token id depends
    on the request's index in the stream (``token_seed``) and its output length only, so every
    run, in this process or another, generates the same tokens.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    requests = scheduler.requests
    for rid in req_ids:
        req = requests[rid]
        if req.is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append([1000 + (token_seed[rid] * 104_729 + req.num_output_tokens) % 50_000])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def run_stream(
    engine: Engine,
    cls,
    label: str,
    stream: Stream,
    *,
    max_steps: int,
    expect_kvnumba: bool = False,
    gc_mode: str = "freeze",
    check_every: int = 0,
) -> RunResult:
    """Drive one new scheduler of class ``cls`` through ``stream`` until every request ends.

    Parameters
    ----------
    engine : Engine
        Shared configuration.
    cls : type
        ``Scheduler`` or ``KVNumbaScheduler``.
    label : str
        Name of the run in the report.
    stream : Stream
        Requests; fresh ``Request`` objects are built for this run before the clock starts.
    max_steps : int
        Safety stop (a run that does not drain in this many steps is reported as an error).
    expect_kvnumba : bool
        The scheduler must have built kvnumba's manager; if it fell back to vLLM's, the run is
        not made and reported as failed.
    gc_mode : {"freeze", "on", "off"}
        ``freeze``: ``gc.freeze()`` once the scheduler exists, as vLLM's ``EngineCore`` does;
        ``on``: the collector as Python sets it; ``off``: disabled during the run (the
        managers' own cost, without collector pauses).
    check_every : int
        If the manager has a ``check()`` (kvnumba's verifies its invariants and the adapter's
        records, O(pool)), call it after every ``check_every`` steps (0: never during the run)
        and once the run drained, outside every timed window. A violation fails the run.

    Returns
    -------
    RunResult
    """
    res = RunResult(label)
    steps = {k: [] for k in STEP_FIELDS}
    res.steps = steps
    # Objects a previous run froze can go now.
    gc.unfreeze()
    gc.collect()
    scheduler = engine.scheduler(cls)
    real_mgr = scheduler.kv_cache_manager
    res.manager_class = f"{type(real_mgr).__module__}.{type(real_mgr).__qualname__}"
    if expect_kvnumba and "kvnumba" not in res.manager_class.lower():
        # KVNumbaScheduler keeps vLLM's manager (with a log warning) for what it does not
        # serve; a silent fallback would make this a vLLM-vs-vLLM run under kvnumba's name.
        res.error = {
            "step": 0,
            "virtual_step": 0,
            "phase": "construction",
            "requests_added": 0,
            "scheduled_this_step": None,
            "exception": f"KVNumbaScheduler built {res.manager_class}, not kvnumba's manager",
            "traceback": "",
        }
        return res
    meter = Meter()
    children = [c for c in ("block_pool", "coordinator") if hasattr(real_mgr, c)]
    scheduler.kv_cache_manager = TimedProxy(real_mgr, meter, children=children)
    gc.collect()
    if gc_mode == "freeze":
        # As vLLM's EngineCore does once the scheduler and KV cache exist (freeze_gc_heap):
        # what is alive now is never scanned again, so collections during the run see only
        # what the run allocates, and one run's leftovers do not slow the next one down.
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    gc.callbacks.append(meter.gc_callback)
    # Requests are made after the freeze, as in an engine where they arrive later; building them
    # (and their block hashes) is outside the timed calls.
    requests = [engine.request(s) for s in stream.specs]
    arrivals = [s.arrival_step for s in stream.specs]
    token_seed = {s.req_id: i for i, s in enumerate(stream.specs)}
    checker = getattr(real_mgr, "check", None)
    clock = time.perf_counter_ns
    cpu = time.thread_time_ns
    nxt = 0
    vstep = 0
    n_steps = 0
    so = None
    # Async scheduling: a step's output is processed after the next step is scheduled, as an
    # async engine does (one step in flight); the step's window is schedule() of one step and
    # update_from_output() of the one before.
    in_flight = engine.args.async_scheduling
    pending = None
    phase = "add_request"
    t_start = time.perf_counter()
    try:
        while nxt < len(requests) or scheduler.has_unfinished_requests() or pending is not None:
            if (
                pending is None
                and not scheduler.has_unfinished_requests()
                and arrivals[nxt] > vstep
            ):
                # Idle engine: jump to the next arrival instead of scheduling empty steps.
                vstep = arrivals[nxt]
            phase = "add_request"
            m0 = meter.ns
            while nxt < len(requests) and arrivals[nxt] <= vstep:
                scheduler.add_request(requests[nxt])
                nxt += 1
            res.add_kv_ns += meter.ns - m0
            phase = "schedule"
            so = None
            m0, c0 = meter.ns, meter.calls
            g0, gk0 = meter.gc_ns, meter.gc_in_kv_ns
            # CPU time of the thread (the cores are shared: wall time includes time the process
            # was not running); read outside the wall-clock windows, so that its own cost does
            # not count in them.
            u0 = cpu()
            t0 = clock()
            so = scheduler.schedule()
            t1 = clock()
            u1 = cpu()
            phase = "update_from_output"
            mro = fake_output(scheduler, so, token_seed)
            if in_flight:
                done, pending = pending, (so, mro) if so.total_num_scheduled_tokens else None
            else:
                done = (so, mro)
            u2 = cpu()
            t2 = clock()
            outs = scheduler.update_from_output(*done) if done is not None else {}
            t3 = clock()
            u3 = cpu()
            steps["step_cpu_ns"].append((u1 - u0) + (u3 - u2))
            steps["kv_ns"].append(meter.ns - m0)
            steps["kv_calls"].append(meter.calls - c0)
            steps["gc_ns"].append(meter.gc_ns - g0)
            steps["gc_kv_ns"].append(meter.gc_in_kv_ns - gk0)
            steps["sched_ns"].append(t1 - t0)
            steps["update_ns"].append(t3 - t2)
            steps["tokens"].append(so.total_num_scheduled_tokens)
            res.scheduled.append(tuple(sorted(so.num_scheduled_tokens.items())))
            res.new_blocks.append(new_block_counts(so))
            steps["preempted"].append(len(so.preempted_req_ids or ()))
            stats = next(
                (o.scheduler_stats for o in outs.values() if o.scheduler_stats is not None), None
            )
            pcs = stats.prefix_cache_stats if stats is not None else None
            steps["running"].append(stats.num_running_reqs if stats else -1)
            steps["waiting"].append(stats.num_waiting_reqs if stats else -1)
            steps["queries"].append(pcs.queries if pcs else 0)
            steps["hits"].append(pcs.hits if pcs else 0)
            steps["preempted_queries"].append(pcs.preempted_queries if pcs else 0)
            steps["preempted_hits"].append(pcs.preempted_hits if pcs else 0)
            steps["finished"].append(sum(len(o.finished_requests or ()) for o in outs.values()))
            for o in outs.values():
                for eco in o.outputs:
                    ps = eco.prefill_stats
                    if ps is not None:
                        res.cached_tokens[eco.request_id] = (
                            ps.num_local_cached_tokens,
                            ps.num_cache_creation_tokens,
                        )
            n_steps += 1
            vstep += 1
            if checker is not None and check_every > 0 and n_steps % check_every == 0:
                phase = "check"
                checker()
            if n_steps >= max_steps:
                raise RuntimeError(f"run did not drain in {max_steps} steps")
        if checker is not None:
            phase = "check"
            checker()
            res.checked = True
    except Exception as exc:
        res.error = {
            "step": n_steps,
            "virtual_step": vstep,
            "phase": phase,
            "requests_added": nxt,
            "scheduled_this_step": dict(so.num_scheduled_tokens) if so is not None else None,
            # Which requests the scheduler held when it failed (the first 64 of each queue).
            "running": [r.request_id for r in scheduler.running][:64],
            "waiting": [r.request_id for r in list(scheduler.waiting)[:64]],
            "exception": f"{type(exc).__name__}: {exc}",
            "manager_call": meter.failed_call,
            "traceback": traceback.format_exc(),
        }
    res.wall_s = time.perf_counter() - t_start
    gc.callbacks.remove(meter.gc_callback)
    gc.enable()
    gc.unfreeze()
    res.per_method = {k: list(v) for k, v in meter.per_method.items()}
    res.call_samples = {k: list(v) for k, v in meter.samples.items()}
    return res


# --------------------------------------------------------------------------------------------
# Comparison and report
# --------------------------------------------------------------------------------------------


def compare(ref: RunResult, other: RunResult, limit: int = 5) -> dict:
    """Where ``other`` scheduled differently from ``ref``.

    Returns
    -------
    dict
        ``identical`` (bool) and, per check, the number of differing steps or requests and the
        first few examples: step count, tokens per step, requests and tokens per step,
        prefix-cache queries and hits per step, preemptions per step, cached tokens per request.
    """
    out: dict = {"steps": [len(ref.scheduled), len(other.scheduled)]}
    n = min(len(ref.scheduled), len(other.scheduled))
    for key in ("tokens", "queries", "hits", "preempted_queries", "preempted_hits", "preempted"):
        a, b = ref.steps[key], other.steps[key]
        diff = [i for i in range(n) if a[i] != b[i]]
        out[key] = {"differing_steps": len(diff), "first": [(i, a[i], b[i]) for i in diff[:limit]]}
    diff = [i for i in range(n) if ref.scheduled[i] != other.scheduled[i]]
    out["per_request_tokens"] = {
        "differing_steps": len(diff),
        "first_step": diff[0] if diff else None,
    }
    diff_b = [i for i in range(n) if ref.new_blocks[i] != other.new_blocks[i]]
    out["new_blocks_per_request"] = {
        "differing_steps": len(diff_b),
        "first": [(i, ref.new_blocks[i], other.new_blocks[i]) for i in diff_b[:2]],
    }
    if ref.error or other.error:
        # A failed run stops early: compare what both got to, and say so.
        out["stopped_early"] = True
        keys = set(ref.cached_tokens) & set(other.cached_tokens)
    else:
        keys = set(ref.cached_tokens) | set(other.cached_tokens)
    dc = sorted(k for k in keys if ref.cached_tokens.get(k) != other.cached_tokens.get(k))
    out["cached_tokens"] = {
        "differing_requests": len(dc),
        "first": [(k, ref.cached_tokens.get(k), other.cached_tokens.get(k)) for k in dc[:limit]],
        "total": [_cached_total(ref), _cached_total(other)],
    }
    same_prefix = (
        not diff
        and not diff_b
        and not dc
        and all(out[k]["differing_steps"] == 0 for k in ("tokens", "queries", "hits", "preempted"))
    )
    out["same_up_to_common_steps"] = same_prefix
    out["identical"] = len(ref.scheduled) == len(other.scheduled) and same_prefix
    return out


def _cached_total(res: RunResult) -> int:
    """Prefix-cache hit tokens summed over the requests' prefills."""
    return sum(v[0] for v in res.cached_tokens.values())


def _stats(values, skip: int) -> dict:
    """Median, mean, p90 and count of ``values[skip:]``."""
    v = np.asarray(values[skip:], dtype=np.float64)
    if v.size == 0:
        return {"median": float("nan"), "mean": float("nan"), "p90": float("nan"), "n": 0}
    return {
        "median": float(np.median(v)),
        "mean": float(v.mean()),
        "p90": float(np.percentile(v, 90)),
        "n": int(v.size),
    }


def summarize(res: RunResult, skip: int, overhead_ns: float) -> dict:
    """Per-step statistics of one run (steps before ``skip`` left out).

    ``kv_net_mean_us`` is the mean KV-manager time less ``overhead_ns`` per timed call: an
    estimate of the managers' own time without the proxy's cost.
    """
    s = res.steps
    step_ns = [a + b for a, b in zip(s["sched_ns"], s["update_ns"], strict=True)]
    return {
        "label": res.label,
        "manager_class": res.manager_class,
        "steps": len(s["kv_ns"]),
        "kv_us": {k: v / 1e3 if k != "n" else v for k, v in _stats(s["kv_ns"], skip).items()},
        "step_us": {k: v / 1e3 if k != "n" else v for k, v in _stats(step_ns, skip).items()},
        "step_cpu_us": {
            k: v / 1e3 if k != "n" else v for k, v in _stats(s["step_cpu_ns"], skip).items()
        },
        "schedule_us": _stats(s["sched_ns"], skip)["median"] / 1e3,
        "update_us": _stats(s["update_ns"], skip)["median"] / 1e3,
        "kv_calls": _stats(s["kv_calls"], skip),
        "kv_less_gc_us": {
            k: v / 1e3 if k != "n" else v
            for k, v in _stats(
                [a - b for a, b in zip(s["kv_ns"], s["gc_kv_ns"], strict=True)], skip
            ).items()
        },
        "gc_us_mean": _stats(s["gc_ns"], skip)["mean"] / 1e3,
        "gc_in_kv_us_mean": _stats(s["gc_kv_ns"], skip)["mean"] / 1e3,
        "kv_net_mean_us": (
            _stats(s["kv_ns"], skip)["mean"] - _stats(s["kv_calls"], skip)["mean"] * overhead_ns
        )
        / 1e3,
        "kv_share_of_step": float(np.sum(s["kv_ns"][skip:]) / max(1, np.sum(step_ns[skip:]))),
        "running": _stats(s["running"], skip),
        "tokens_per_step": _stats(s["tokens"], skip)["mean"],
        "preemptions": int(np.sum(s["preempted"])),
        "prefix_queries": int(np.sum(s["queries"])),
        "prefix_hits": int(np.sum(s["hits"])),
        "cached_tokens": _cached_total(res),
        "add_request_kv_us": res.add_kv_ns / 1e3,
        "wall_s": round(res.wall_s, 2),
        "checked": res.checked,
        "error": res.error,
    }


def add_floors(summaries: list[dict], results: list[RunResult], skip: int) -> None:
    """Add ``kv_floor_us`` and ``step_floor_us`` to every summary of one manager.

    Each step's time is taken as its minimum over the repetitions. Every repetition schedules
    the same steps (checked), so this pairs equal work, and a step slowed by another process
    on the shared cores in one repetition is read from another. Without at least two complete
    repetitions of equal length the floors are NaN.
    """
    ok = [r for r in results if r.error is None]
    lengths = {len(r.steps["kv_ns"]) for r in ok}
    nan = {"median": float("nan"), "mean": float("nan"), "p90": float("nan"), "n": 0}
    if len(ok) < 2 or len(lengths) != 1:
        floors = {"kv_floor_us": nan, "step_floor_us": nan}
    else:
        kv = np.min([r.steps["kv_ns"] for r in ok], axis=0)
        step = np.min([np.add(r.steps["sched_ns"], r.steps["update_ns"]) for r in ok], axis=0)
        floors = {
            "kv_floor_us": {
                k: v / 1e3 if k != "n" else v for k, v in _stats(kv.tolist(), skip).items()
            },
            "step_floor_us": {
                k: v / 1e3 if k != "n" else v for k, v in _stats(step.tolist(), skip).items()
            },
        }
    for s in summaries:
        s.update(floors)


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def markdown_table(groups: dict[str, list[dict]], base: str, other: str) -> str:
    """The README-ready table: one column per manager, medians over repetitions.

    Parameters
    ----------
    groups : dict
        ``label -> [summary of each repetition]``.
    base, other : str
        Labels of the denominator (vLLM's manager) and the numerator of the ratios.
    """

    def med(label, path):
        vals = []
        for s in groups[label]:
            v = s
            for p in path:
                v = v[p]
            vals.append(v)
        return statistics.median(vals)

    def ratio(path):
        # Ratio per repetition (same process, adjacent runs), then the median of the ratios,
        # with their range when there are several (the spread the shared cores cause).
        rs = []
        for a, b in zip(groups[base], groups[other], strict=False):
            va, vb = a, b
            for p in path:
                va, vb = va[p], vb[p]
            rs.append(vb / va if va else float("nan"))
        if not rs:
            return "-"
        text = _fmt(statistics.median(rs), 2)
        if len(rs) > 1 and min(rs) != max(rs):
            text += f" ({_fmt(min(rs), 2)}-{_fmt(max(rs), 2)})"
        return text

    rows = [
        ("KV-manager time per step, median (us)", ("kv_us", "median"), 1),
        ("KV-manager time per step, mean (us)", ("kv_us", "mean"), 1),
        ("KV-manager time per step, p90 (us)", ("kv_us", "p90"), 1),
        ("KV-manager time per step, mean, less timing cost (us)", ("kv_net_mean_us",), 1),
        (
            "KV-manager time per step, per-step minimum over repetitions, median (us)",
            ("kv_floor_us", "median"),
            1,
        ),
        (
            "KV-manager time per step, per-step minimum over repetitions, mean (us)",
            ("kv_floor_us", "mean"),
            1,
        ),
        (
            "KV-manager time per step, per-step minimum over repetitions, p90 (us)",
            ("kv_floor_us", "p90"),
            1,
        ),
        ("GC pauses inside KV-manager calls per step, mean (us)", ("gc_in_kv_us_mean",), 1),
        ("schedule() + update_from_output() per step, median (us)", ("step_us", "median"), 1),
        ("schedule() + update_from_output() per step, mean (us)", ("step_us", "mean"), 1),
        ("same, per-step minimum over repetitions, mean (us)", ("step_floor_us", "mean"), 1),
        ("same, thread CPU time, median (us)", ("step_cpu_us", "median"), 1),
        ("same, thread CPU time, mean (us)", ("step_cpu_us", "mean"), 1),
        ("KV-manager calls per step, mean", ("kv_calls", "mean"), 1),
        ("KV-manager calls per step, median", ("kv_calls", "median"), 0),
        ("KV-manager share of step time", ("kv_share_of_step",), 3),
    ]
    lines = [
        f"| per scheduler step | {base} | {other} | {other} / {base} (range) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, path, d in rows:
        lines.append(
            f"| {name} | {_fmt(med(base, path), d)} | {_fmt(med(other, path), d)} | {ratio(path)} |"
        )
    for name, key in (
        ("steps", "steps"),
        ("running requests per step, mean", ("running", "mean")),
        ("preemptions (total)", "preemptions"),
        ("prefix-cache hit tokens (total)", "prefix_hits"),
    ):
        path = key if isinstance(key, tuple) else (key,)
        lines.append(f"| {name} | {_fmt(med(base, path), 0)} | {_fmt(med(other, path), 0)} | |")
    return "\n".join(lines)


def _spread(values: list[float], digits: int) -> str:
    """Median of ``values``, with their range when there are several that differ."""
    text = _fmt(statistics.median(values), digits)
    if len(values) > 1 and min(values) != max(values):
        text += f" ({_fmt(min(values), digits)}-{_fmt(max(values), digits)})"
    return text


def per_call_table(
    groups: dict[str, list[dict]], runs: dict[str, list[RunResult]], base: str, other: str
) -> str:
    """Microseconds per call of the scheduler's per-request calls, and the per-step ratio.

    Parameters
    ----------
    groups : dict
        ``label -> [summary of each repetition]``.
    runs : dict
        ``label -> [RunResult of each repetition]``.
    base, other : str
        Labels of the denominator (vLLM's manager) and the numerator of the ratios.

    Returns
    -------
    str
        A markdown table: calls per run, then per manager the mean (total time / calls) and the
        median us per call, each the median over repetitions with their range, and the medians
        of the per-repetition ratios; last, the KV-manager time per step (median).
    """
    lines = [
        f"| call | calls per run | {base} mean | {other} mean | {other} / {base}, mean | "
        f"{base} median | {other} median | {other} / {base}, median |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in PER_CALL_METHODS:
        mean, median = {}, {}
        for lab in (base, other):
            cells = [r.per_method.get(name, [0, 0]) for r in runs[lab]]
            mean[lab] = [ns / c / 1e3 for c, ns in cells if c]
            samples = [r.call_samples.get(name) for r in runs[lab]]
            median[lab] = [statistics.median(v) / 1e3 for v in samples if v]
        calls = statistics.median(r.per_method.get(name, [0, 0])[0] for r in runs[base])
        cells = [f"`{name}`", f"{calls:,.0f}"]
        for per in (mean, median):
            if per[base] and per[other]:
                ratios = [b / a for a, b in zip(per[base], per[other], strict=False) if a]
                cells += [_spread(per[base], 1), _spread(per[other], 1), _spread(ratios, 2)]
            else:
                cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    step = {lab: [s["kv_us"]["median"] for s in groups[lab]] for lab in (base, other)}
    ratios = [b / a for a, b in zip(step[base], step[other], strict=False) if a]
    lines.append(
        f"| KV-manager time per step, median (us) | | {_spread(step[base], 1)} | "
        f"{_spread(step[other], 1)} | {_spread(ratios, 2) if ratios else '-'} | | | |"
    )
    return "\n".join(lines)


def method_table(groups: dict[str, list[dict]], runs: dict[str, list[RunResult]]) -> str:
    """Calls per run and ns per call of each manager method, medians over the repetitions."""
    labels = list(runs)
    names = sorted({n for lab in labels for r in runs[lab] for n in r.per_method})
    head = "| method | " + " | ".join(f"{lab} calls | {lab} ns/call" for lab in labels) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(labels)]
    for n in names:
        cells = []
        for lab in labels:
            cells_n = [r.per_method.get(n, [0, 0]) for r in runs[lab]]
            calls = statistics.median(c for c, _ in cells_n)
            per = [ns / c for c, ns in cells_n if c]
            cells.append(f"{calls:,.0f} | {_fmt(statistics.median(per), 0) if per else '-'}")
        lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def default_trace() -> str:
    """Path of the Mooncake trace shipped in the kvnumba package (its ``data`` folder)."""
    from importlib import resources

    return str(resources.files("kvnumba") / "data" / "mooncake_synthetic_trace.jsonl")


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("mooncake", "synthetic"), default="mooncake")
    w.add_argument(
        "--trace",
        default=None,
        help="Mooncake-format JSONL trace (default: the trace shipped in the kvnumba package, "
        "kvnumba/data/mooncake_synthetic_trace.jsonl)",
    )
    w.add_argument("--num-requests", type=int, default=1000)
    w.add_argument(
        "--offset",
        type=int,
        default=2400,
        help="first trace row (mooncake; the trace's prefix reuse grows along it: rows "
        "2400-3399 reuse 0.53 of their hash blocks among themselves, rows 0-999 0.17)",
    )
    w.add_argument(
        "--hash-block-tokens",
        type=int,
        default=128,
        help="tokens per trace hash id (512 = the trace's lengths; 128 shrinks prompts 4x "
        "and keeps the prefix structure)",
    )
    w.add_argument(
        "--ms-per-step",
        type=float,
        default=500.0,
        help="trace milliseconds per scheduler step (arrival compression, mooncake)",
    )
    w.add_argument("--rate", type=float, default=1.0, help="arrivals per step (synthetic)")
    w.add_argument("--prompt-range", type=int, nargs=2, default=(128, 2048))
    w.add_argument("--output-range", type=int, nargs=2, default=(32, 512))
    w.add_argument("--prefix-groups", type=int, default=8, help="shared prefixes (synthetic)")
    w.add_argument("--prefix-len", type=int, default=512, help="shared prefix tokens (synthetic)")
    w.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine")
    e.add_argument("--model", default="Qwen/Qwen3-0.6B")
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument(
        "--num-blocks",
        type=int,
        default=12288,
        help="KV pool blocks (12288 x 16 tokens hold about 40 mean Mooncake prompts at 128 "
        "tokens per hash id: admission waits on the pool and there is some preemption)",
    )
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument("--max-num-batched-tokens", type=int, default=8192)
    e.add_argument("--max-model-len", type=int, default=32768)
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        metavar="W",
        help="a hybrid model: a sliding-window group of W tokens beside the full-attention one "
        "(kvnumba's KVNumbaGroupsKVCacheManager)",
    )
    e.add_argument(
        "--async-scheduling",
        action="store_true",
        help="vLLM's AsyncScheduler (and KVNumbaAsyncScheduler) instead of the sync Scheduler",
    )
    r = p.add_argument_group("runs")
    r.add_argument(
        "--managers",
        default="vllm,kvnumba",
        help="comma-separated runs: vllm, kvnumba (kvnumba falls back to a second vllm run, "
        "labelled vllm-B, when the integration cannot be imported)",
    )
    r.add_argument("--repeat", type=int, default=3, help="repetitions of every run (alternating)")
    r.add_argument("--warmup-requests", type=int, default=24, help="requests of the warm-up run")
    r.add_argument(
        "--gc",
        choices=("freeze", "on", "off"),
        default="freeze",
        help="garbage collector during runs: freeze what exists once the scheduler is built "
        "(vLLM's EngineCore does), plain, or disabled",
    )
    r.add_argument(
        "--check-every",
        type=int,
        default=0,
        metavar="N",
        help="call the manager's check() (kvnumba's has one) every N steps, outside the timed "
        "windows; it is always called once a run drained",
    )
    r.add_argument("--skip-steps", type=int, default=0, help="leading steps left out of stats")
    r.add_argument("--max-steps", type=int, default=200_000)
    r.add_argument("--json", metavar="PATH", help="write summaries, checks and per-step data")
    r.add_argument("--markdown", metavar="PATH", help="write the markdown report")
    args = p.parse_args(argv)
    if args.workload == "mooncake" and args.trace is None:
        args.trace = default_trace()
    return args


def build_stream(args, vocab: int, num_requests: int | None = None) -> Stream:
    """The stream the options describe (``num_requests`` overrides ``--num-requests``)."""
    n = num_requests or args.num_requests
    if args.workload == "mooncake":
        return mooncake_stream(
            args.trace,
            num_requests=n,
            offset=args.offset,
            hash_block_tokens=args.hash_block_tokens,
            ms_per_step=args.ms_per_step,
            max_model_len=args.max_model_len,
            vocab=vocab,
        )
    return synthetic_stream(
        num_requests=n,
        rate=args.rate,
        prompt_range=tuple(args.prompt_range),
        output_range=tuple(args.output_range),
        prefix_groups=args.prefix_groups,
        prefix_len=args.prefix_len,
        max_model_len=args.max_model_len,
        vocab=vocab,
        seed=args.seed,
    )


def main(argv=None) -> int:
    """Run the benchmark; exit status 1 if a run failed or scheduled differently."""
    args = parse_args(argv)
    if args.num_blocks * args.block_size < args.max_model_len:
        raise SystemExit("--num-blocks x --block-size must hold one --max-model-len request")
    log = lambda msg: print(f"[vllm_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    t0 = time.perf_counter()
    engine = Engine(args)
    log(f"vLLM config ready in {time.perf_counter() - t0:.1f} s")
    native_cls, kvn_cls, kvn_error = scheduler_classes(args.async_scheduling)
    wanted = [m.strip() for m in args.managers.split(",") if m.strip()]
    plan: list[tuple[str, type]] = []
    notes = []
    for m in wanted:
        if m == "vllm":
            plan.append(("vllm", native_cls))
        elif m == "kvnumba" and kvn_cls is not None:
            plan.append(("kvnumba", kvn_cls))
        elif m == "kvnumba":
            notes.append(f"kvnumba integration not importable ({kvn_error}); ran vLLM twice")
            plan.append(("vllm-B", native_cls))
        else:
            raise SystemExit(f"unknown manager {m!r}")
    for n in notes:
        log(n)
    stream = build_stream(args, engine.vocab)
    log(f"stream: {stream.info}")
    warm = build_stream(args, engine.vocab, num_requests=args.warmup_requests)
    warmed = set()
    for label, cls in plan:
        if cls in warmed:
            continue
        warmed.add(cls)
        t = time.perf_counter()
        w = run_stream(
            engine,
            cls,
            f"warmup-{label}",
            warm,
            max_steps=args.max_steps,
            expect_kvnumba=label == "kvnumba",
            gc_mode=args.gc,
            check_every=args.check_every,
        )
        log(f"warm-up {label}: {len(w.scheduled)} steps in {time.perf_counter() - t:.1f} s")
        if w.error:
            log(f"warm-up {label} failed: {w.error['exception']}")
    runs: dict[str, list[RunResult]] = {label: [] for label, _ in plan}
    for rep in range(args.repeat):
        order = plan if rep % 2 == 0 else plan[::-1]
        for label, cls in order:
            res = run_stream(
                engine,
                cls,
                label,
                stream,
                max_steps=args.max_steps,
                expect_kvnumba=label == "kvnumba",
                gc_mode=args.gc,
                check_every=args.check_every,
            )
            runs[label].append(res)
            log(
                f"rep {rep} {label}: {len(res.scheduled)} steps, {res.wall_s:.1f} s"
                + (
                    f", FAILED at step {res.error['step']}: {res.error['exception']}"
                    if res.error
                    else ""
                )
            )
    overhead = wrapper_overhead_ns()
    labels = [label for label, _ in plan]
    ref = runs[labels[0]][0]
    checks = {}
    for lab in labels:
        for i, r in enumerate(runs[lab]):
            if r is not ref:
                checks[f"{lab}#{i}"] = compare(ref, r)
    groups = {lab: [summarize(r, args.skip_steps, overhead) for r in runs[lab]] for lab in labels}
    for lab in labels:
        add_floors(groups[lab], runs[lab], args.skip_steps)
    report = render(args, stream, groups, runs, checks, labels, overhead, notes)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n", encoding="utf-8")
    if args.json:
        payload = {
            "args": vars(args),
            "stream": stream.info,
            "notes": notes,
            "wrapper_overhead_ns_per_call": overhead,
            "summaries": groups,
            "checks": checks,
            "per_method": {lab: [r.per_method for r in runs[lab]] for lab in labels},
            "per_call_median_ns": {
                lab: [
                    {k: statistics.median(v) for k, v in r.call_samples.items() if v}
                    for r in runs[lab]
                ]
                for lab in labels
            },
            "per_step": {lab: [r.steps for r in runs[lab]] for lab in labels},
            "env": env_info(),
        }
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
        log(f"wrote {args.json}")
    failed = any(r.error for lab in labels for r in runs[lab])
    differs = any(not c["identical"] for c in checks.values())
    return 1 if failed or differs else 0


def env_info() -> dict:
    """Versions and machine, for the report."""
    import numba
    import vllm

    info = {
        "python": platform.python_version(),
        "numba": numba.__version__,
        "numpy": np.__version__,
        "vllm_path": os.path.dirname(vllm.__file__),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    try:
        import kvnumba

        info["kvnumba_path"] = os.path.dirname(kvnumba.__file__)
    except Exception as exc:  # reported, not fatal: the native runs do not need kvnumba
        info["kvnumba_path"] = f"not importable: {exc}"
    return info


def render(args, stream, groups, runs, checks, labels, overhead, notes) -> str:
    """The markdown report: setup, main table, checks, per-method table, failures."""
    base = labels[0]
    other = labels[1] if len(labels) > 1 else labels[0]
    s0 = groups[base][0]
    kind = "AsyncScheduler" if args.async_scheduling else "Scheduler"
    lines = [
        f"## vLLM {__import__('vllm').__version__} {kind}: {base} vs {other} KV cache manager",
        "",
        f"- workload: {json.dumps(stream.info)}",
        f"- engine: model config {args.model}, block_size {args.block_size}, "
        f"num_blocks {args.num_blocks} ({args.num_blocks * args.block_size:,} token slots), "
        f"prefix caching {'off' if args.no_prefix_caching else 'on'}, max_num_seqs "
        f"{args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens} (chunked "
        f"prefill), max_model_len {args.max_model_len}",
        f"- runs: {args.repeat} repetitions of each, alternating order, after a "
        f"{args.warmup_requests}-request warm-up run of each; garbage collector: {args.gc}; "
        f"{args.skip_steps} leading steps "
        "skipped; numbers are medians over repetitions (ratios: median of per-repetition ratios)",
        f"- timing wrapper cost: about {overhead:.0f} ns per timed call, included in both KV "
        "columns (subtracted only in the 'less timing cost' row)",
        "- manager classes: "
        + ", ".join(f"{lab} = `{groups[lab][0]['manager_class']}`" for lab in labels),
        f"- kvnumba imported from `{env_info()['kvnumba_path']}`",
        f"- host: {os.cpu_count()} CPUs (shared), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}",
    ]
    lines += [f"- NOTE: {n}" for n in notes]
    lines += ["", markdown_table(groups, base, other), ""]
    lines += [
        "### Per call (us per call: median over repetitions, range in brackets)",
        "",
        per_call_table(groups, runs, base, other),
        "",
    ]
    lines.append(
        f"Steps {s0['steps']}; scheduled tokens per step (mean) {s0['tokens_per_step']:.0f}; "
        f"prefix-cache queries {s0['prefix_queries']:,} tokens, hits {s0['prefix_hits']:,}; "
        f"KV time inside add_request: {s0['add_request_kv_us']:.0f} us in total."
    )
    checked = [f"{lab}#{i}" for lab in labels for i, r in enumerate(runs[lab]) if r.checked]
    if checked:
        every = f"every {args.check_every} steps and " if args.check_every > 0 else ""
        lines.append(
            f"The manager's own `check()` passed {every}after the run drained in: "
            + ", ".join(checked)
            + "."
        )
    lines += ["", "### Same schedule?", ""]
    for name, c in checks.items():
        if c.get("stopped_early") and c["same_up_to_common_steps"]:
            lines.append(
                f"- {name} vs {base}#0: a run failed (see Failures); the schedules agree in "
                f"every check over the {min(c['steps'])} steps both ran"
            )
        elif c["identical"]:
            lines.append(
                f"- {name} vs {base}#0: identical (steps, tokens and new blocks per request per "
                "step, preemptions, prefix-cache queries/hits per step, cached tokens per "
                "request)"
            )
        else:
            lines.append(f"- {name} vs {base}#0: DIFFERENT: {json.dumps(c, default=str)}")
    failures = [(lab, i, r.error) for lab in labels for i, r in enumerate(runs[lab]) if r.error]
    if failures:
        lines += ["", "### Failures", ""]
        for lab, i, err in failures:
            lines += [
                f"- {lab}#{i}: step {err['step']}, in {err['phase']} (virtual step {err['virtual_step']}, "
                f"{err['requests_added']} requests added): `{err['exception']}`",
                f"  failing KV-manager call: `{err.get('manager_call')}`",
                f"  scheduled in that step: {err['scheduled_this_step']}",
                f"  running: {err.get('running')}",
                f"  waiting (head): {err.get('waiting')}",
                "",
                "```",
                err["traceback"].rstrip(),
                "```",
            ]
    lines += [
        "",
        "### Calls per KV-manager method (per run; ns per call: median over repetitions)",
        "",
        method_table(groups, runs),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
