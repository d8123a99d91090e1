"""Shared parameters, manager construction and warm-up of the asv suite.

Conventions of every class in this suite:

- ``params`` over the batch size (sequences per call) and the pool size (blocks); a combination
  whose state does not fit in the pool raises ``NotImplementedError`` in ``setup`` (asv shows it
  as skipped).
- Managers are built once per benchmark process (in ``setup``) and kept in :data:`_MANAGERS`;
  :func:`exercise` calls every operation on a new manager before it is used, so neither
  construction nor compilation (nor numba cache loading) is ever timed.
- The timed body makes exactly one call. asv re-runs ``teardown`` and ``setup`` around every
  timed call (``number = 1``, no warm-up loop), and ``teardown`` undoes what the call did, so
  every call finds the state ``setup`` prepared (classes implement ``prepare``; the shared
  ``setup`` also makes one untimed warm-up call of the body per process).

``KVNUMBA_BENCH_IMPL=reference`` runs the suite on the pure-Python reference instead (to test
the suite itself; the reference has no ``state`` and is far slower).
"""

from __future__ import annotations

import os

import numpy as np

BATCHES = (1, 16, 256, 4096)
POOLS = (1_024, 65_536, 1_048_576)
BLOCK_SIZE = 16

# Sequence capacity of the managers: the largest batch plus a few (block tables are
# max_seqs x max_seq_len / block_size int32, 1 MB here; the token payload of a 1M-block pool is
# 128 MB, so a manager is built once per process and reused).
MAX_SEQS = max(BATCHES) + 8
MAX_SEQ_LEN = 1024

_MANAGERS: dict[tuple, object] = {}
_next_token = 0


def manager_class():
    """The implementation under test: ``kvnumba.BlockManager`` unless overridden."""
    if os.environ.get("KVNUMBA_BENCH_IMPL") == "reference":
        from kvnumba.reference import ReferenceBlockManager

        return ReferenceBlockManager
    from kvnumba import BlockManager

    return BlockManager


def fresh_tokens(count: int) -> np.ndarray:
    """``count`` token ids never used before in this process (prompts that miss the cache)."""
    global _next_token
    start, _next_token = _next_token, _next_token + count
    return np.arange(start, start + count, dtype=np.int64)


def exercise(mgr) -> None:
    """Call every batched operation once, then release everything.

    On a small manager this compiles the kernels (or loads them from the numba cache); on a
    benchmark's own manager it brings the scratch buffers and the first pages of every array
    into use, so that the first timed call is not a cold one. Leaves at most two cached blocks
    (of a prompt no benchmark uses) and no live sequence.
    """
    ids = mgr.new_sequences(2)
    mgr.can_append(ids, [1, 1])
    mgr.append(ids, [17, 1])
    mgr.append(ids, [1, 1], fresh_tokens(2), atomic=False)
    kids = mgr.fork(ids, n=1)
    mgr.append(ids, [1, 1])  # copy-on-write
    mgr.block_tables(ids)
    mgr.seq_lens(ids)
    prompt = fresh_tokens(33)
    admitted = mgr.admit(prompt, [33]).ids
    mgr.release(np.concatenate([ids, kids.ravel(), admitted]))
    mgr.release(mgr.admit(prompt, [33], atomic=False).ids)  # a prefix hit
    mgr.stats()
    mgr.check()


def fits(blocks: int, num_blocks: int) -> None:
    """Skip (``NotImplementedError``) a combination whose state needs more than the pool."""
    if blocks > num_blocks:
        raise NotImplementedError(f"needs {blocks} blocks, the pool has {num_blocks}")


def manager(
    key, num_blocks: int, *, max_seqs: int = MAX_SEQS, fresh: bool = False, init=None, **options
):
    """The manager of one benchmark and parameter combination, built once per process.

    Parameters
    ----------
    key : hashable
        Names the benchmark state (benchmarks never share a manager).
    num_blocks : int
        Pool size.
    max_seqs : int
        Sequence slots.
    fresh : bool
        Build a new manager even if one is cached.
    init : callable, optional
        ``init(mgr) -> payload`` prepares the base state of a newly built manager.
    **options
        Further constructor arguments (``block_keys=True``, ...).

    Returns
    -------
    mgr : BlockManager
    payload : object
        What ``init`` returned when the manager was built (``None`` without ``init``).
    """
    entry = None if fresh else _MANAGERS.get(key)
    if entry is None:
        _MANAGERS.pop(key, None)  # drop the old one first: two 1M-block pools never coexist
        mgr = manager_class()(
            num_blocks, BLOCK_SIZE, max_seqs=max_seqs, max_seq_len=MAX_SEQ_LEN, **options
        )
        exercise(mgr)
        entry = _MANAGERS[key] = (mgr, init(mgr) if init is not None else None)
    return entry


def fill_cache(mgr, blocks: int) -> None:
    """Turn ``blocks`` free blocks into cached ones: admit prompts of fresh full blocks, release.

    Prompts of 64 full blocks (and one shorter remainder) so that every block is registered and
    goes to the LRU list on release; at most 1024 prompts per call to bound the token arrays.
    """
    per_prompt = MAX_SEQ_LEN // BLOCK_SIZE
    lengths = np.full(blocks // per_prompt, MAX_SEQ_LEN, dtype=np.int64)
    if blocks % per_prompt:
        lengths = np.append(lengths, blocks % per_prompt * BLOCK_SIZE)
    for lo in range(0, len(lengths), 1024):
        chunk = lengths[lo : lo + 1024]
        mgr.release(mgr.admit(fresh_tokens(int(chunk.sum())), chunk).ids)


def sequences(mgr, count: int, tokens: int) -> np.ndarray:
    """``count`` new sequences holding ``tokens`` tokens each (appended without ids)."""
    ids = mgr.new_sequences(count)
    if tokens:
        mgr.append(ids, np.full(count, tokens, dtype=np.int64))
    return ids


_WARMED: set[tuple] = set()


class _Operation:
    """Common ``setup`` of the suite: ``prepare`` the state, and the first time in this process
    also run the timed body once (then ``teardown`` and ``prepare`` again), so that a first call's
    one-time costs (numba dispatch of new argument types, first touch of result buffers) are
    never in a sample, not even in ``asv run --quick``'s single one."""

    params = (BATCHES, POOLS)
    param_names = ("batch", "num_blocks")

    def prepare(self, *params):
        raise NotImplementedError

    def setup(self, *params):
        self.prepare(*params)
        key = (type(self).__name__, params)
        if key not in _WARMED:
            _WARMED.add(key)
            body = next(getattr(self, n) for n in dir(type(self)) if n.startswith("time_"))
            body(*params)
            self.teardown(*params)
            self.prepare(*params)

    def teardown(self, *params):
        pass


class Fresh(_Operation):
    """Base of benchmarks whose timed call changes the state: one call per setup/teardown.

    ``prepare`` (or the timed call) puts the sequences to drop in ``self.to_release``;
    ``teardown`` releases them, which returns the pool to its base state.
    """

    number = 1  # every timed call must find the state setup prepared
    warmup_time = 0.0  # a warm-up loop would call the body without teardown in between
    repeat = (10, 50, 5.0)

    def teardown(self, *params):
        ids = self.__dict__.pop("to_release", None)
        if ids is not None and len(ids):
            self.mgr.release(ids)


class ReadOnly(_Operation):
    """Base of benchmarks whose timed call does not change the state."""
