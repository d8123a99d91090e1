"""Scheduler invariants: every request served once or rejected, preemption, hit rate by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvnumba.sim import scheduler
from kvnumba.sim.offers import OfferGate
from kvnumba.sim.scheduler import (
    SimConfig,
    Simulator,
    default_manager_factory,
    reference_manager_factory,
    simulate,
)
from kvnumba.sim.traces import Request, default_trace_path, load_trace

FACTORIES = {"kernels": default_manager_factory, "reference": reference_manager_factory}
TIMING = {"alloc_us_per_step_median", "alloc_us_per_step_mean", "replay_s"}


class Recorder:
    """Wraps a manager; records ids admitted and released and the calls per kind."""

    def __init__(self, mgr):
        self.mgr, self.admitted, self.released = mgr, [], []
        self.calls = {"admit": 0, "append": 0, "release": 0}
        self.offered = 0  # prompts offered to admit, over all calls

    def admit(self, tokens, lengths, **kw):
        self.calls["admit"] += 1
        self.offered += len(lengths)
        res = self.mgr.admit(tokens, lengths, **kw)
        self.admitted += res.ids[res.ok].tolist()
        return res

    def append(self, *args, **kw):
        self.calls["append"] += 1
        return self.mgr.append(*args, **kw)

    def release(self, ids):
        self.calls["release"] += 1
        self.released += np.asarray(ids).tolist()
        return self.mgr.release(ids)

    def __getattr__(self, name):
        return getattr(self.mgr, name)


def recording(factory):
    return lambda *a, **kw: Recorder(factory(*a, **kw))


def azure(limit):
    return load_trace(
        default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"), limit=limit
    )


def assert_clean_run(sim, res):
    """The invariants every run must satisfy."""
    # Nobody lost, nobody served twice; rejected requests were never served.
    assert np.all(res.served_count + res.rejected == 1)
    # Every sequence admitted was released exactly once, and nothing else was released.
    rec = sim.manager
    assert sorted(rec.admitted) == sorted(rec.released)
    assert len(set(rec.released)) == len(rec.released)
    # Each step offers at most max_batch prompts, over all its admit calls.
    assert rec.offered <= res.steps.size * sim.config.max_batch
    sim.manager.check()
    st = sim.manager.stats()
    assert st.used == 0 and st.used + st.cached + st.free == sim.config.blocks
    assert np.all(res.used + res.cached <= sim.config.blocks)
    assert np.all(np.diff(res.steps) > 0)


@pytest.mark.parametrize("kind", FACTORIES)
def test_preemption_under_pressure_serves_everything_once(kind):
    cfg = SimConfig(num_blocks=500, max_batch=32, step_ms=100)
    sim = Simulator(azure(200), cfg, recording(FACTORIES[kind]))
    res = sim.run()
    assert_clean_run(sim, res)
    assert res.served == 200 and res.preemptions > 50  # the pool really was too small
    assert res.preempted_count.max() >= 2
    # Recompute re-admits prompt + generated tokens: they hit the blocks just released. That
    # is not prefix sharing (Azure prompts share nothing), so first admissions hit nothing.
    assert res.prefix_hit_rate_incl_recompute > 0.05
    assert res.prefix_hit_rate == 0.0 and res.first_admit_cached == 0
    assert res.recompute_cached == res.cached_tokens > 0
    assert res.used.max() <= cfg.blocks and res.running.max() <= cfg.max_batch


def test_kernels_and_reference_agree_step_for_step():
    reqs = load_trace(limit=60)
    cfg = SimConfig(num_blocks=2500, max_batch=32, step_ms=300)
    a = simulate(reqs, cfg, default_manager_factory)
    b = simulate(reqs, cfg, reference_manager_factory)
    sa, sb = a.summary(), b.summary()
    assert {k: v for k, v in sa.items() if k not in TIMING} == {
        k: v for k, v in sb.items() if k not in TIMING
    }
    assert np.array_equal(a.used, b.used) and np.array_equal(a.cached, b.cached)
    assert sa["rejected"] > 0 and sa["preemptions"] > 0 and sa["evictions"] > 0


def test_two_sequences_preempt_and_resume():
    # Each needs 19 blocks in the end (100 + 200 tokens); together they do not fit in 30.
    reqs = [Request(0, 0.0, 100, 200), Request(1, 0.0, 100, 200)]
    sim = Simulator(reqs, SimConfig(num_blocks=30, max_batch=4), recording(default_manager_factory))
    res = sim.run()
    assert_clean_run(sim, res)
    # The newer one (1) is preempted, the older one finishes, then 1 resumes and finishes.
    assert res.preempted_count.tolist() == [0, 1]
    assert res.served_count.tolist() == [1, 1]
    # Its recompute re-admitted prompt + generated tokens (more than the 100-token prompt).
    assert res.admitted_tokens > 200


def test_too_long_or_too_big_requests_are_rejected():
    reqs = [
        Request(0, 0.0, 50, 10),
        Request(1, 0.0, 90, 20),  # 110 tokens > max_seq_len
        Request(2, 5.0, 60, 5),
        Request(3, 9.0, 20, 0),  # no output: admitted, then released
    ]
    sim = Simulator(
        reqs,
        SimConfig(num_blocks=64, max_seq_len=100, max_batch=2),
        recording(default_manager_factory),
    )
    res = sim.run()
    assert_clean_run(sim, res)
    assert res.rejected.tolist() == [False, True, False, False]
    assert res.served == 3
    # Bigger than the whole pool (5 blocks of 16 = 80 tokens < 90): rejected, not stalled.
    sim = Simulator(
        [Request(0, 0.0, 60, 30), Request(1, 0.0, 10, 3)],
        SimConfig(num_blocks=5),
        recording(default_manager_factory),
    )
    res = sim.run()
    assert_clean_run(sim, res)
    assert res.rejected.tolist() == [True, False]


def mooncake_rows(tmp_path, rows):
    import json

    path = tmp_path / "hand.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                dict(
                    zip(("timestamp", "input_length", "output_length", "hash_ids"), r, strict=True)
                )
            )
            + "\n"
            for r in rows
        )
    )
    return load_trace(path)


@pytest.mark.parametrize("arrivals", [(0, 1000, 2000), (0, 0, 0)])
@pytest.mark.parametrize("kind", FACTORIES)
def test_prefix_hit_rate_on_a_hand_made_trace(tmp_path, arrivals, kind):
    # Block size 16, so one 512-token hash block is 32 manager blocks.
    #   A: hash ids [1, 2], 1024 tokens -> nothing cached yet:                         0
    #   B: hash ids [1, 3],  600 tokens -> shares hash block 1 with A: 32 blocks     512
    #   C: hash ids [1, 2], 1000 tokens -> shares all of A's prefix, but a hit must leave
    #      one prompt token uncached: (1000 - 1) // 16 = 62 blocks                    992
    # Hit rate = (0 + 512 + 992) / (1024 + 600 + 1000) = 1504 / 2624, whether the three
    # arrive apart (A finished and cached) or in one admit call (later prompts reuse blocks
    # filled by earlier ones of the same call).
    reqs = mooncake_rows(
        tmp_path,
        [
            (arrivals[0], 1024, 3, [1, 2]),
            (arrivals[1], 600, 2, [1, 3]),
            (arrivals[2], 1000, 4, [1, 2]),
        ],
    )
    sim = Simulator(reqs, SimConfig(num_blocks=1024), recording(FACTORIES[kind]))
    res = sim.run()
    assert_clean_run(sim, res)
    assert (res.cached_tokens, res.admitted_tokens) == (1504, 2624)
    assert res.prefix_hit_rate == pytest.approx(1504 / 2624)
    assert res.evictions == 0 and res.preemptions == 0 and res.cow_copies == 0

    off = simulate(reqs, SimConfig(num_blocks=1024, prefix_caching=False), FACTORIES[kind])
    assert off.prefix_hit_rate == 0.0 and off.served == 3


def test_no_sharing_on_azure_without_pressure():
    res = simulate(azure(100), SimConfig(num_blocks=20_000))
    assert res.served == 100 and res.preemptions == 0 and res.cached_tokens == 0


def test_progress_reports_every_request_once():
    seen = []
    res = simulate(azure(50), SimConfig(num_blocks=300, max_batch=8), progress=seen.append)
    assert sum(seen) == 50 == res.served


def test_invalid_config():
    with pytest.raises(ValueError):
        Simulator([], SimConfig(max_batch=0))
    with pytest.raises(ValueError, match="index"):
        Simulator([Request(1, 0.0, 5, 5)], SimConfig(num_blocks=8))


class OfferEverything(OfferGate):
    """No gate: every waiting prompt is offered at every step, in one admit call."""

    def may_fit(self, requests, lengths, available):
        return np.ones(requests.size, bool)


class NeverForget(OfferGate):
    """A planted bug: bounds survive the admissions that lower them."""

    def admitted(self, requests):
        self._length[requests] = -1  # only the admitted requests' own bounds


def run_with_gate(monkeypatch, gate, reqs, cfg):
    monkeypatch.setattr(scheduler, "OfferGate", gate)
    sim = Simulator(reqs, cfg, recording(default_manager_factory))
    return sim, sim.run()


def rows(res):
    """Everything a replay reports but its timings."""
    out = {k: v for k, v in res.summary().items() if k not in TIMING}
    for name in ("steps", "used", "cached", "running", "waiting", "admit_order", "decoded"):
        out[name] = getattr(res, name).tolist()
    for name in ("preempted_count", "prefill_computed", "first_admit_index", "finish_index"):
        out[name] = getattr(res, name).tolist()
    return out


SKIP_CASES = {
    "lru": ("mooncake", SimConfig(num_blocks=1500, max_batch=64, step_ms=2)),
    "leaf-lru": (
        "mooncake",
        SimConfig(num_blocks=1500, max_batch=64, step_ms=2, eviction="leaf-lru"),
    ),
    "oracle": ("mooncake", SimConfig(num_blocks=1500, max_batch=64, step_ms=2, eviction="oracle")),
    "prefill budget": (
        "mooncake",
        SimConfig(num_blocks=1500, max_batch=64, step_ms=2, max_prefill_tokens=20_000),
    ),
    "sliding window": (
        "mooncake",
        SimConfig(num_blocks=1500, max_batch=64, step_ms=200, sliding_window=512),
    ),
    "no hash_ids": ("azure", SimConfig(num_blocks=500, max_batch=32, step_ms=100)),
}


@pytest.mark.parametrize("case", SKIP_CASES)
def test_skipped_offers_change_no_row(monkeypatch, case):
    # Many requests at once into a tight pool: prompts wait, and the gate leaves out of each
    # admit call the prompts that cannot fit yet. The replay must not change at all.
    trace, cfg = SKIP_CASES[case]
    reqs = load_trace(limit=300) if trace == "mooncake" else azure(200)
    every, b = run_with_gate(monkeypatch, OfferEverything, reqs, cfg)
    gated, a = run_with_gate(monkeypatch, OfferGate, reqs, cfg)
    assert rows(a) == rows(b)
    assert b.waiting.max() > 0
    assert_clean_run(gated, a)
    # Far fewer prompts offered, for the same rows.
    assert gated.manager.offered * 4 < every.manager.offered


def test_a_gate_that_keeps_stale_bounds_changes_the_rows(monkeypatch, tmp_path):
    # The test above can fail. Blocks of 512 tokens, a pool of 10. A and D take 3 blocks each;
    # B (5 blocks, the first 3 shared with C) then lacks 5 of the 4 available: bound 5. C
    # arrives, fits (4 blocks) and runs long, holding the shared blocks: B now lacks 2. When D
    # finishes, 3 blocks are available and B runs beside A, unless its bound of 5, kept past
    # C's admission, holds it back until A is done.
    rows_in = [
        {"timestamp": 0, "input_length": 1400, "output_length": 40, "hash_ids": [100, 101, 102]},
        {"timestamp": 0, "input_length": 1400, "output_length": 5, "hash_ids": [200, 201, 202]},
        {"timestamp": 0, "input_length": 2560, "output_length": 1, "hash_ids": [1, 2, 3, 10, 11]},
        {"timestamp": 60, "input_length": 1546, "output_length": 100, "hash_ids": [1, 2, 3, 4]},
    ]
    path = tmp_path / "stale.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    reqs = load_trace(path)
    cfg = SimConfig(num_blocks=10, block_size=512, max_batch=8, step_ms=30)
    _, good = run_with_gate(monkeypatch, OfferEverything, reqs, cfg)
    _, gated = run_with_gate(monkeypatch, OfferGate, reqs, cfg)
    _, bad = run_with_gate(monkeypatch, NeverForget, reqs, cfg)
    assert rows(gated) == rows(good)
    a, b = 0, 2
    assert 0 < good.first_admit_index[b] < good.finish_index[a]  # B ran beside A
    assert bad.first_admit_index[b] >= bad.finish_index[a]  # the stale bound held B back
    assert rows(bad) != rows(good)
