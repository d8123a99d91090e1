"""The standard workloads of ``docs/workloads.md`` as batched operations.

Every workload draws its lengths from ``numpy.random.default_rng(0)`` in the order the
description lists them, so it is the same sequence of sequences as the reference operation trace
of each workload (``tests/test_bench.py`` checks that, step by step, against digests of those
traces). Where the trace interleaves single operations, a :class:`Workload` groups one step's
operations by kind into batched calls, in this order per step:

- W-decode and W-fork: ``decode`` (1 token for every active sequence), ``release`` (those that
  reached their output length), then ``prefill`` (and ``fork``) of the replacements;
- W-churn: ``admit`` (prompts while the pool can hold them), ``decode``, ``release``;
- W-micro: ``prefill`` of one sequence with ``k`` blocks, ``release`` of it.

Sequences are named by *local ids* ``0, 1, 2, ...`` in admission order (the trace's ids); the
replay maps them onto the ids a manager hands out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

# Operation kinds; each is one batched call (``prefill`` is two: ``new_sequences`` + ``append``).
OP_PREFILL = 0  # new_sequences(len(ids)) then append(ids, vals): prompts without token ids
OP_ADMIT = 1  # admit(tokens, lengths=vals): prompts with unique token ids (see Workload.ops)
OP_FORK = 2  # fork(ids, n=fork_n); the children of ids[i] are vals[i], vals[i] + 1, ...
OP_DECODE = 3  # append(ids, vals) with vals == 1, tokens=None
OP_RELEASE = 4  # release(ids)

BLOCK_SIZE = 16


@dataclass(frozen=True, eq=False)
class Workload:
    """One standard workload as arrays of batched operations.

    Operation ``k`` has kind ``op_kind[k]`` and acts on the local ids
    ``ids[op_ptr[k]:op_ptr[k + 1]]`` with the per-id values ``vals[...]`` of the same slice.
    Step ``t`` is operations ``step_ptr[t]:step_ptr[t + 1]``; operations before ``step_ptr[0]``
    are the prologue (the initial admissions, before the first step mark of the trace).

    Attributes
    ----------
    name : str
        Workload name (``decode``, ``fork``, ``fork-nofork``, ``churn``, ``micro-K``).
    num_blocks, block_size : int
        Pool geometry the workload is specified for.
    max_seqs, max_seq_len : int
        Most sequences alive at once and longest sequence (tokens) in the workload.
    fork_n : int
        Children per parent of every ``fork`` operation (0 when there is none).
    atomic : bool
        Mode of the ``decode`` appends: ``False`` where the pool can run out (W-churn), so that
        failed sequences are reported per sequence and counted.
    prompt_len, out_len : numpy.ndarray of int64, shape (num_seqs,)
        Per local id: prompt tokens (the parent's for a fork child) and decode steps.
    op_kind : numpy.ndarray of int8, shape (num_ops,)
    op_ptr : numpy.ndarray of int64, shape (num_ops + 1,)
    step_ptr : numpy.ndarray of int64, shape (num_steps + 1,)
    ids, vals : numpy.ndarray of int64, shape (op_ptr[-1],)
    sliding_window : int or None
        The managers' sliding window in tokens (``decode-window``); None: full attention.
    kv_cache_groups : tuple of (int, int)
        The managers' KV cache groups as ``(window, chunk)`` pairs (``decode-hybrid``: every
        sequence is one per group, grown alike); empty: one group.
    """

    name: str
    num_blocks: int
    block_size: int
    max_seqs: int
    max_seq_len: int
    fork_n: int
    atomic: bool
    prompt_len: np.ndarray
    out_len: np.ndarray
    op_kind: np.ndarray
    op_ptr: np.ndarray
    step_ptr: np.ndarray
    ids: np.ndarray
    vals: np.ndarray
    sliding_window: int | None = None
    kv_cache_groups: tuple = ()

    @property
    def num_steps(self) -> int:
        """Number of steps (the trace's ``S`` marks)."""
        return len(self.step_ptr) - 1

    @property
    def num_seqs(self) -> int:
        """Number of sequences the workload creates."""
        return len(self.prompt_len)

    def ops(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Iterate over the batched operations in order.

        Yields
        ------
        kind : int
            One of the ``OP_*`` constants.
        ids, vals : numpy.ndarray of int64
            Local ids and per-id values of the operation (views).
        tokens : numpy.ndarray of int64 or None
            For ``admit`` the flat prompt tokens: consecutive integers continuing from the
            previous ``admit``, so that no two prompts share a block (every full prompt block is
            registered, then cached on release, then reclaimed by LRU eviction). ``None`` for
            the other kinds, whose tokens are appended without ids as in the trace.
        """
        next_token = 0
        kinds, ptr = self.op_kind, self.op_ptr
        for k in range(len(kinds)):
            lo, hi = ptr[k], ptr[k + 1]
            vals = self.vals[lo:hi]
            tokens = None
            if kinds[k] == OP_ADMIT:
                total = int(vals.sum())
                tokens = np.arange(next_token, next_token + total, dtype=np.int64)
                next_token += total
            yield int(kinds[k]), self.ids[lo:hi], vals, tokens

    def to_trace(self) -> list[str]:
        """Expand into the operation trace format (``S``, ``N``, ``A``, ``F``, ``R``; one a line).

        Within a step the lines come grouped by operation kind, not interleaved as the reference
        trace writes them; per step the two are the same multiset of lines.

        Returns
        -------
        list of str
            One operation a line.
        """
        lines_of_op = []
        for kind, ids, vals, _ in self.ops():
            lines = []
            for i, v in zip(ids.tolist(), vals.tolist(), strict=True):
                if kind in (OP_PREFILL, OP_ADMIT):
                    lines += [f"N {i}", f"A {i} {v}"]
                elif kind == OP_FORK:
                    lines += [f"F {i} {v + j}" for j in range(self.fork_n)]
                elif kind == OP_DECODE:
                    lines.append(f"A {i} {v}")
                else:
                    lines.append(f"R {i}")
            lines_of_op.append(lines)
        sp = self.step_ptr.tolist()
        out = [line for lines in lines_of_op[: sp[0]] for line in lines]
        for t in range(self.num_steps):
            out.append("S")
            out += [line for lines in lines_of_op[sp[t] : sp[t + 1]] for line in lines]
        return out


class _Builder:
    """Accumulates batched operations and the live-sequence bookkeeping of a generator."""

    def __init__(self) -> None:
        self.kinds: list[int] = []
        self.ptr: list[int] = [0]
        self.steps: list[int] = []
        self.ids: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.prompt_len: list[int] = []
        self.out_len: list[int] = []
        self.fork_n = 0
        self.live = 0
        self.peak_live = 0

    def new_seq(self, prompt: int, out: int) -> int:
        self.prompt_len.append(prompt)
        self.out_len.append(out)
        return len(self.prompt_len) - 1

    def step(self) -> None:
        self.steps.append(len(self.kinds))

    def op(self, kind: int, ids, vals) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return  # no empty calls: an engine skips them too
        vals = np.broadcast_to(np.asarray(vals, dtype=np.int64), ids.shape)
        self.kinds.append(kind)
        self.ptr.append(self.ptr[-1] + len(ids))
        self.ids.append(ids)
        self.vals.append(vals)
        if kind == OP_RELEASE:
            self.live -= len(ids)
        elif kind == OP_FORK:
            self.live += len(ids) * self.fork_n
        elif kind != OP_DECODE:
            self.live += len(ids)
        self.peak_live = max(self.peak_live, self.live)

    def build(self, name: str, num_blocks: int, *, atomic: bool = True) -> Workload:
        prompt = np.asarray(self.prompt_len, dtype=np.int64)
        out = np.asarray(self.out_len, dtype=np.int64)
        cat = np.concatenate
        return Workload(
            name=name,
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_seqs=max(self.peak_live, 1),
            max_seq_len=int((prompt + out).max()),
            fork_n=self.fork_n,
            atomic=atomic,
            prompt_len=prompt,
            out_len=out,
            op_kind=np.asarray(self.kinds, dtype=np.int8),
            op_ptr=np.asarray(self.ptr, dtype=np.int64),
            step_ptr=np.asarray([*self.steps, len(self.kinds)], dtype=np.int64),
            ids=cat(self.ids) if self.ids else np.empty(0, np.int64),
            vals=cat(self.vals) if self.vals else np.empty(0, np.int64),
        )


def _decode_step(b: _Builder, active: np.ndarray, left: np.ndarray):
    """One decode step for every active sequence; returns (finished, active, left)."""
    b.op(OP_DECODE, active, 1)
    left = left - 1
    done = left == 0
    finished = active[done]
    b.op(OP_RELEASE, finished, 0)
    return finished, active[~done], left[~done]


def decode(
    steps: int = 2000,
    batch: int = 256,
    *,
    num_blocks: int = 65536,
    sliding_window: int | None = None,
    kv_cache_groups: tuple = (),
) -> Workload:
    """W-decode: continuous-batching decode with ``batch`` concurrent sequences.

    Parameters
    ----------
    steps : int
        Decode steps (2000 in docs/workloads.md).
    batch : int
        Concurrent sequences (256).
    num_blocks : int
        Pool size the workload is run with (65536).
    sliding_window : int, optional
        Run it on managers with this sliding window (``decode-window``: the same operations,
        while blocks leave each sequence's window as it grows).
    kv_cache_groups : tuple of (int, int), optional
        Run it on managers with these KV cache groups (``decode-hybrid``: every operation acts
        on one sequence per group), on a pool of ``num_blocks`` per group.

    Returns
    -------
    Workload
        Prologue: prefill of ``batch`` prompts (prompt_len ~ U[128, 2048], out_len ~
        U[32, 512], drawn in that order per sequence). Each step: decode all, release the
        finished, prefill one replacement per finished sequence (next draws).
    """
    rng = np.random.default_rng(0)
    b = _Builder()

    def admit(k: int) -> tuple[np.ndarray, np.ndarray]:
        ids, outs, prompts = [], [], []
        for _ in range(k):
            p = int(rng.integers(128, 2049))
            o = int(rng.integers(32, 513))
            ids.append(b.new_seq(p, o))
            outs.append(o)
            prompts.append(p)
        b.op(OP_PREFILL, ids, prompts)
        return np.asarray(ids, np.int64), np.asarray(outs, np.int64)

    active, left = admit(batch)
    for _ in range(steps):
        b.step()
        finished, active, left = _decode_step(b, active, left)
        new, outs = admit(len(finished))
        active, left = np.concatenate([active, new]), np.concatenate([left, outs])
    wl = b.build("decode", num_blocks)
    if kv_cache_groups:
        groups = tuple(kv_cache_groups)
        return dataclasses.replace(
            wl,
            name="decode-hybrid",
            num_blocks=num_blocks * len(groups),
            max_seqs=wl.max_seqs * len(groups),
            kv_cache_groups=groups,
        )
    if sliding_window is None:
        return wl
    return dataclasses.replace(wl, name="decode-window", sliding_window=sliding_window)


def fork(
    steps: int = 2000, groups: int = 32, n: int = 8, *, share: bool = True, num_blocks: int = 65536
) -> Workload:
    """W-fork: parallel sampling, ``groups`` groups of ``n`` samples sharing a prompt.

    Parameters
    ----------
    steps : int
        Decode steps (2000).
    groups : int
        Concurrent groups (32).
    n : int
        Samples per group (8): the prompt sequence plus ``n - 1`` forks.
    share : bool
        ``True`` for W-fork (``fork`` the prompt); ``False`` for the no-fork baseline, where
        every sample prefills the prompt itself.
    num_blocks : int
        Pool size (65536).

    Returns
    -------
    Workload
        Per group: prompt_len ~ U[128, 2048], then ``n`` out_len ~ U[32, 512]. Each step:
        decode all, release the finished, admit one new group per finished group.
    """
    rng = np.random.default_rng(0)
    b = _Builder()
    b.fork_n = n - 1 if share else 0
    group_of: dict[int, int] = {}
    live_in_group: dict[int, int] = {}

    def admit(k: int) -> tuple[np.ndarray, np.ndarray]:
        roots, prompts, members, outs = [], [], [], []
        for _ in range(k):
            p = int(rng.integers(128, 2049))
            o = [int(rng.integers(32, 513)) for _ in range(n)]
            ids = [b.new_seq(p, oi) for oi in o]
            gid = ids[0]  # the root's local id names the group
            live_in_group[gid] = n
            group_of.update(dict.fromkeys(ids, gid))
            roots.append(ids[0])
            prompts.append(p)
            members += ids
            outs += o
        if share:
            b.op(OP_PREFILL, roots, prompts)
            b.op(OP_FORK, roots, np.asarray(roots, np.int64) + 1)
        else:
            b.op(OP_PREFILL, members, np.repeat(prompts, n))
        return np.asarray(members, np.int64), np.asarray(outs, np.int64)

    active, left = admit(groups)
    for _ in range(steps):
        b.step()
        finished, active, left = _decode_step(b, active, left)
        completed = 0
        for sid in finished.tolist():
            g = group_of.pop(sid)
            live_in_group[g] -= 1
            if live_in_group[g] == 0:
                del live_in_group[g]
                completed += 1
        new, outs = admit(completed)
        active, left = np.concatenate([active, new]), np.concatenate([left, outs])
    return b.build("fork" if share else "fork-nofork", num_blocks)


def churn(steps: int = 5000, *, num_blocks: int = 4096) -> Workload:
    """W-churn: pool pressure, cached blocks reclaimed least recently used first.

    Parameters
    ----------
    steps : int
        Steps (5000).
    num_blocks : int
        Pool size (4096).

    Returns
    -------
    Workload
        Each step: ``admit`` the next prompts (prompt_len ~ U[256, 4096], out_len ~ U[16, 256])
        while the blocks of the live sequences, plus the prompt, plus one growth block per live
        sequence and one more fit in the pool (a prompt that does not fit waits for a later
        step); decode all (non-atomic: a sequence whose block cannot be had fails for that step
        and is counted); release the finished.
    """
    rng = np.random.default_rng(0)
    b = _Builder()
    bs = BLOCK_SIZE
    active = np.empty(0, np.int64)
    left = np.empty(0, np.int64)
    length = np.empty(0, np.int64)
    pending = None
    for _ in range(steps):
        b.step()
        used = int(((length + bs - 1) // bs).sum())
        new: list[int] = []
        prompts, outs = [], []
        while True:
            if pending is None:
                pending = (int(rng.integers(256, 4097)), int(rng.integers(16, 257)))
            p, o = pending
            need = (p + bs - 1) // bs
            if used + need + len(active) + len(new) + 1 > num_blocks:
                break
            pending = None
            used += need
            new.append(b.new_seq(p, o))
            prompts.append(p)
            outs.append(o)
        b.op(OP_ADMIT, new, prompts)
        active = np.concatenate([active, np.asarray(new, np.int64)])
        left = np.concatenate([left, np.asarray(outs, np.int64)])
        length = np.concatenate([length, np.asarray(prompts, np.int64)]) + 1
        done = left == 1
        b.op(OP_DECODE, active, 1)
        b.op(OP_RELEASE, active[done], 0)
        active, left, length = active[~done], left[~done] - 1, length[~done]
    return b.build("churn", num_blocks, atomic=False)


def micro(k: int, reps: int = 50, *, num_blocks: int = 65536) -> Workload:
    """W-micro: allocate ``k`` blocks in one call, then free them, ``reps`` times.

    Parameters
    ----------
    k : int
        Blocks per call (1, 16, 256 or 4096 in docs/workloads.md).
    reps : int
        Repetitions (50, as the reference trace).
    num_blocks : int
        Pool size (65536).

    Returns
    -------
    Workload
        Each step: ``prefill`` of one new sequence with ``k * block_size`` tokens (the
        allocation is its ``append``), ``release`` of it.
    """
    b = _Builder()
    for _ in range(reps):
        b.step()
        sid = b.new_seq(k * BLOCK_SIZE, 0)
        b.op(OP_PREFILL, [sid], k * BLOCK_SIZE)
        b.op(OP_RELEASE, [sid], 0)
    return b.build(f"micro-{k}", num_blocks)


MICRO_KS = (1, 16, 256, 4096)
#: The sliding window of ``decode-window`` (tokens): Gemma 3's local layers use 1024.
DECODE_WINDOW = 1024
#: The KV cache groups of ``decode-hybrid``: a full-attention group and a sliding-window one,
#: as a model that alternates full and local layers (gpt-oss, Gemma 2) has.
HYBRID_GROUPS = ((0, 0), (DECODE_WINDOW, 0))

# Step counts of ``--quick`` runs (CI smoke): long enough for every operation kind, copy-on-write,
# evictions and at least one allocation failure of W-churn to show up.
QUICK_STEPS = {"decode": 100, "fork": 100, "churn": 800, "micro": 5}


def standard(quick: bool = False) -> dict[str, Callable[[], Workload]]:
    """The standard workloads by name, as zero-argument factories.

    Parameters
    ----------
    quick : bool
        Use the short step counts of :data:`QUICK_STEPS` instead of docs/workloads.md's.

    Returns
    -------
    dict of str to callable
        ``decode``, ``decode-window``, ``decode-hybrid``, ``fork``, ``fork-nofork``, ``churn``, ``micro-1`` ...
        ``micro-4096``.
    """
    q = QUICK_STEPS if quick else {"decode": 2000, "fork": 2000, "churn": 5000, "micro": 50}
    out: dict[str, Callable[[], Workload]] = {
        "decode": lambda: decode(q["decode"]),
        "decode-window": lambda: decode(q["decode"], sliding_window=DECODE_WINDOW),
        "decode-hybrid": lambda: decode(q["decode"], kv_cache_groups=HYBRID_GROUPS),
        "fork": lambda: fork(q["fork"]),
        "fork-nofork": lambda: fork(q["fork"], share=False),
        "churn": lambda: churn(q["churn"]),
    }
    for k in MICRO_KS:
        out[f"micro-{k}"] = functools.partial(micro, k, q["micro"])
    return out
