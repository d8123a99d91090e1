"""Shared test configuration: the hypothesis profile, kernel warm-up and state comparison helpers."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import kvnumba
from kvnumba._kernels import ensure_fresh_cache

# Tests call some workers directly: the stale-cache guard runs before any kernel is loaded.
ensure_fresh_cache()

# Kernels are compiled (or loaded from NUMBA_CACHE_DIR) on first use; never let that count
# against a hypothesis deadline.
settings.register_profile(
    "kvnumba",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "kvnumba-long",
    deadline=None,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "kvnumba"))

#: Scale of the stateful machines' example counts, ``KVNUMBA_EXAMPLE_SCALE`` (default 1): a run
#: that repeats the machines in a slower mode (CI's bounds check) takes a fraction.
EXAMPLE_SCALE = float(os.environ.get("KVNUMBA_EXAMPLE_SCALE", "1"))


def examples(count: int) -> int:
    """A machine's example count, scaled by :data:`EXAMPLE_SCALE` (at least 1)."""
    return max(1, round(count * EXAMPLE_SCALE))


def _warm_kernels() -> None:
    """Run every public call once (success and failure paths) so every kernel is compiled."""
    evicted = []
    mgr = kvnumba.BlockManager(
        8, 2, max_seqs=8, max_seq_len=16, on_evict=lambda *a: evicted.append(a)
    )
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [3, 2], [1, 2, 3, 4, 5])
    mgr.append([a], [1])
    mgr.append(np.array([b], dtype=np.int64), np.array([1]), atomic=False)
    mgr.can_append([a, b], [1, 1])
    (child,) = mgr.fork([a], 1)[0]
    mgr.append([child], [1], [7])  # full tail: new block
    mgr.block_tables([a, b, child])
    mgr.seq_lens([a, b, child])
    mgr.release([child, a, b])
    mgr.admit([1, 2, 3, 4, 5], [5])
    mgr.admit([1, 2, 3, 9, 9, 1, 2, 3], [5, 3], salts=[0, 1], atomic=False)
    try:
        mgr.admit(list(range(40)), [10, 10, 10, 10])
    except kvnumba.PoolExhausted:
        pass
    try:
        mgr.append([a], [1])
    except kvnumba.InvalidSequence:
        pass
    seq = mgr.sequence()
    seq.append([1])
    seq.append(count=1)
    seq.fork().release()
    seq.token_at(0)
    seq.block_for(1)
    _ = seq.table, seq.tokens, len(seq), seq.released
    seq.release()
    mgr.check()
    mgr.stats()
    mgr.snapshot()
    mgr.ref_count(0)
    nocache = kvnumba.BlockManager(4, 2, prefix_caching=False, _hash_bits=0)
    nocache.admit([1, 2, 3], [3])
    nocache.check()


@pytest.fixture(scope="session", autouse=True)
def warm_kernels():
    """Compile (or load) every kernel once per session, before any test is timed."""
    _warm_kernels()


def state_diff(before, after) -> list[str]:
    """Names of the state fields whose dtype, shape or bytes differ."""
    changed = []
    for name in before._fields:
        x, y = getattr(before, name), getattr(after, name)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            changed.append(name)
    return changed


def _assert_unchanged(mgr, fn, exc=Exception):
    """Call ``fn``, which must raise ``exc``; the state must be byte-identical afterwards.

    Returns the exception so the caller can assert its type and fields.
    """
    before = mgr.snapshot()
    with pytest.raises(exc) as info:
        fn()
    after = mgr.snapshot()
    changed = state_diff(before, after)
    assert not changed, f"{info.value!r} changed state fields {changed}"
    mgr.check()
    return info.value


@pytest.fixture
def assert_unchanged():
    """The helper ``assert_unchanged(mgr, fn, exc=Exception) -> exception``."""
    return _assert_unchanged


@pytest.fixture
def same_state():
    """The helper ``same_state(before, after)``: assert two snapshots are byte-identical."""

    def check(before, after):
        changed = state_diff(before, after)
        assert not changed, f"state fields changed: {changed}"

    return check
