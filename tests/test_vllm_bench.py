"""benchmarks/vllm_bench.py without vLLM: the request streams and the timing proxy."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_bench.py"
_spec = importlib.util.spec_from_file_location("vllm_bench", _PATH)
vb = importlib.util.module_from_spec(_spec)
# Its dataclasses look their module up in sys.modules while the module runs.
sys.modules.setdefault("vllm_bench", vb)
_spec.loader.exec_module(vb)


def _trace(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 700, "input_length": 600, "output_length": 7, "hash_ids": [1, 4]},
    {"timestamp": 1500, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
]


@pytest.mark.parametrize("block", [512, 128, 16])
def test_mooncake_equal_hash_ids_give_equal_token_blocks(tmp_path, block):
    stream = vb.mooncake_stream(
        _trace(tmp_path, ROWS),
        num_requests=3,
        offset=0,
        hash_block_tokens=block,
        ms_per_step=500,
        max_model_len=100_000,
        vocab=50_000,
    )
    a, b, c = (s.prompt for s in stream.specs)
    # Lengths scale by block / 512, rounded up, so each keeps its number of hash blocks.
    assert [len(a), len(b), len(c)] == [math.ceil(n * block / 512) for n in (1100, 600, 1024)]
    assert np.array_equal(a[:block], b[:block])  # shared id 1
    assert not np.array_equal(a[block : 2 * block], b[block : 2 * block])  # 2 vs 4
    assert np.array_equal(a[: 2 * block], c)  # ids 1, 2: c is a's first two blocks
    assert all(p.min() >= 100 and p.max() < 50_000 for p in (a, b, c))
    assert [s.arrival_step for s in stream.specs] == [0, 1, 3]
    assert [s.output_len for s in stream.specs] == [5, 7, 1]


def test_mooncake_cuts_prompts_to_max_model_len(tmp_path):
    stream = vb.mooncake_stream(
        _trace(tmp_path, ROWS),
        num_requests=3,
        offset=1,
        hash_block_tokens=512,
        ms_per_step=100,
        max_model_len=600,
        vocab=1000,
    )
    assert [len(s.prompt) for s in stream.specs] == [593, 599]
    assert stream.info["prompts_cut_to_max_model_len"] == 2
    assert [s.req_id for s in stream.specs] == ["m1", "m2"]
    assert [s.arrival_step for s in stream.specs] == [0, 8]


def test_default_trace_is_the_one_shipped_in_the_package():
    import kvnumba

    args = vb.parse_args([])
    shipped = Path(kvnumba.__file__).resolve().parent / "data" / "mooncake_synthetic_trace.jsonl"
    assert shipped.is_file() and Path(args.trace).resolve() == shipped
    # The default arguments read the default rows of it.
    stream = vb.mooncake_stream(
        args.trace,
        num_requests=3,
        offset=args.offset,
        hash_block_tokens=args.hash_block_tokens,
        ms_per_step=args.ms_per_step,
        max_model_len=args.max_model_len,
        vocab=50_000,
    )
    assert [s.req_id for s in stream.specs] == [f"m{args.offset + k}" for k in range(3)]
    # A synthetic run names no trace.
    assert vb.parse_args(["--workload", "synthetic"]).trace is None


def test_synthetic_prefix_groups_share_their_prefix():
    stream = vb.synthetic_stream(
        num_requests=40,
        rate=2.0,
        prompt_range=(100, 300),
        output_range=(4, 8),
        prefix_groups=2,
        prefix_len=64,
        max_model_len=4096,
        vocab=1000,
        seed=0,
    )
    heads = {tuple(s.prompt[:64]) for s in stream.specs}
    assert len(heads) == 2
    tails = {tuple(s.prompt[64:80]) for s in stream.specs}
    assert len(tails) == 40
    steps = [s.arrival_step for s in stream.specs]
    assert steps == sorted(steps)


class _Pool:
    def __init__(self):
        self.freed = []

    def free_blocks(self, blocks):
        self.freed.extend(blocks)


class _Manager:
    def __init__(self):
        self.block_pool = _Pool()
        self.counter = 0

    @property
    def usage(self):
        return 0.5

    def allocate(self, n):
        # An internal call to a part: it must not be timed or counted a second time.
        self.block_pool.free_blocks([n])
        self._private()
        return n + 1

    def _private(self):
        self.counter += 1


def test_proxy_times_public_calls_properties_and_children_once():
    mgr = _Manager()
    meter = vb.Meter()
    proxy = vb.TimedProxy(mgr, meter, children=("block_pool",))
    assert proxy.allocate(3) == 4
    assert proxy.allocate(5) == 6
    assert proxy.usage == 0.5
    proxy.block_pool.free_blocks([9])
    assert mgr.block_pool.freed == [3, 5, 9]
    assert meter.calls == 4
    assert meter.per_method["allocate"][0] == 2
    assert meter.per_method["usage"][0] == 1
    assert meter.per_method["block_pool.free_blocks"][0] == 1
    assert "_private" not in meter.per_method
    assert meter.ns == sum(ns for _, ns in meter.per_method.values()) > 0
    # Plain attributes pass through untimed; writes reach the target.
    assert proxy.counter == 2
    proxy.counter = 7
    assert mgr.counter == 7 and meter.calls == 4


def test_proxy_times_a_call_that_raises():
    class Bad:
        def boom(self):
            raise KeyError("x")

    meter = vb.Meter()
    proxy = vb.TimedProxy(Bad(), meter)
    with pytest.raises(KeyError):
        proxy.boom()
    assert meter.calls == 1 and not meter.inside


def test_floors_take_each_steps_minimum_over_repetitions():
    def run(kv):
        r = vb.RunResult("x")
        r.steps = {"kv_ns": kv, "sched_ns": [1000] * len(kv), "update_ns": [0] * len(kv)}
        return r

    summaries = [{}, {}]
    vb.add_floors(summaries, [run([1000, 9000, 3000]), run([5000, 2000, 3000])], skip=0)
    assert summaries[0]["kv_floor_us"]["mean"] == pytest.approx(2.0)
    assert summaries[1]["kv_floor_us"]["median"] == pytest.approx(2.0)
    one = [{}]
    vb.add_floors(one, [run([1000])], skip=0)
    assert math.isnan(one[0]["kv_floor_us"]["mean"])
