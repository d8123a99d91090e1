"""Continuous-batching replay of a request trace through a block manager.

The engine model, per decode step ``t`` (one step lasts ``step_ms`` of trace time, so a
request arriving at ``arrival_ms`` joins the waiting queue at step ``floor(arrival_ms /
step_ms)``):

1. arrivals join the tail of the waiting queue; a request whose prompt plus output exceeds
   ``max_seq_len`` or the whole pool can never run and is rejected;
2. decode: every running sequence with output left appends one generated token, in one batched
   ``append(..., atomic=False)``; if some appends fail for lack of blocks, the newest running
   sequence is preempted (released and put back at the *front* of the queue, to be recomputed
   from its prompt plus the tokens it had generated) and the failed appends are retried;
3. finished sequences are released in one batched ``release``;
4. admission: the head of the queue (at most ``max_batch`` running sequences, optionally a
   prefill token budget) is offered to a batched ``admit(..., atomic=False)``; prompts that
   did not fit stay queued in order. Prompts known not to fit yet are left out of the call
   (:mod:`kvnumba.sim.offers`), which changes no outcome: the rows are those of one call over
   the whole head.

Idle stretches (nothing running, nothing waiting) are skipped, not simulated. Only the calls
that an engine would make on its critical path (``admit``, ``append``, ``release``) are timed;
``stats()``, used here for bookkeeping, is not.

The eviction policy (``SimConfig.eviction``) is any of
:data:`kvnumba.eviction.SIMULATOR_POLICIES`. For ``oracle`` the simulator tells the manager,
after each admission, when each full prompt block's content is next used in the trace
(:mod:`kvnumba.sim.hindsight`). For every policy, on a trace with ``hash_ids`` and a manager
whose blocks it can read, it counts about every 1% of the requests the cached blocks that no
prompt can hit any more (:mod:`kvnumba.sim.unreachable`). Neither is timed.

Prompt tokens are counted apart for first admissions and for recomputes (a preempted request
re-admitted with its prompt plus what it had generated): a recompute mostly hits the blocks it
released a moment before, which says nothing about prefix sharing between requests, so a hit
rate that mixed both would rise as the pool shrinks.

What a hit is worth: per step, the simulator records the prompt tokens it computed (admitted
minus served from the cache, recomputes included) and the tokens it decoded, and per request
the steps of its first admission and of its release; :meth:`SimResult.latency` applies the
config's :class:`kvnumba.sim.cost.CostModel` to them (a modeled duration per step, a modeled
clock, TTFT and TPOT per request) without changing the schedule.

A windowed config (``SimConfig.sliding_window`` or ``attention_chunk_size``, see
``docs/windows.md``) builds a windowed manager: blocks leave a sequence as it decodes past them
(their table entries become ``NULL_BLOCK``) and a prompt's hit needs only its last window or
chunk. Blocks used and cached are the manager's ``stats()``, so they count what the window
released. A request must still fit the whole pool (prompt plus output), as under full attention:
the simulator prefills a prompt, and recomputes a preempted request, in one ``admit``, which
claims a block for every position it computes. The census of unreachable cached blocks is not
taken for a windowed manager: a windowed hit skips blocks below the window, so a cached block
whose parent is gone can still be hit. :func:`compare_window` replays a trace with and without
the window.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvnumba.eviction import needs_future, policy_code, policy_name
from kvnumba.sim.cost import (
    DEFAULT_COST,
    LATENCY_FIELDS,
    CostModel,
    Latency,
    model_latency,
    step_starts,
)
from kvnumba.sim.hindsight import Hints
from kvnumba.sim.ideal import BlockKeys, block_keys
from kvnumba.sim.offers import OfferGate
from kvnumba.sim.traces import Request, output_tokens
from kvnumba.sim.unreachable import SAMPLE_EVERY, Census, block_census

#: Default pool geometry: 512Ki token slots, so the longest Mooncake request (191,386 tokens
#: with its output) fits with room for the cache; and 192Ki tokens per sequence.
DEFAULT_POOL_TOKENS = 1 << 19
DEFAULT_MAX_SEQ_LEN = 196_608
DEFAULT_STEP_MS = 30.0


def policy_arguments(eviction) -> dict:
    """The manager keyword arguments that select eviction policy ``eviction``.

    Parameters
    ----------
    eviction : str or PriorityPolicy
        A name of :data:`kvnumba.eviction.SIMULATOR_POLICIES`, a priority policy, or
        ``"module:attribute"`` naming one.

    Returns
    -------
    dict
        Empty for ``lru``, every manager's default (so a run under LRU builds exactly the
        manager it always did); ``{"eviction": eviction}`` otherwise, with ``_hindsight=True``
        for a policy that needs the future of the trace (``oracle``, a priority policy made
        with ``hindsight=True``).
    """
    if eviction == "lru":
        return {}
    if needs_future(eviction):
        return {"eviction": eviction, "_hindsight": True}
    return {"eviction": eviction}


def window_arguments(config: SimConfig) -> dict:
    """The manager keyword arguments that select the attention kind of ``config``.

    Parameters
    ----------
    config : SimConfig

    Returns
    -------
    dict
        Empty for full attention (so a full-attention run builds exactly the manager it always
        did); ``{"sliding_window": W}`` or ``{"attention_chunk_size": C}`` otherwise (both
        when both are set: the manager then refuses the pair with ``InvalidGeometry``).
    """
    out = {}
    if config.sliding_window is not None:
        out["sliding_window"] = config.sliding_window
    if config.attention_chunk_size is not None:
        out["attention_chunk_size"] = config.attention_chunk_size
    return out


def full_attention(config: SimConfig) -> SimConfig:
    """``config`` without its window: the same simulation under full attention."""
    return dataclasses.replace(config, sliding_window=None, attention_chunk_size=None)


def default_manager_factory(num_blocks: int, block_size: int, **kwargs):
    """Build a :class:`kvnumba.BlockManager` (imported lazily: it loads numba).

    The keyword arguments go to the manager as they are, the policy's among them
    (:func:`policy_arguments`: ``eviction``, and ``_hindsight`` for ``oracle``) and the
    attention kind's (:func:`window_arguments`: ``sliding_window``, ``attention_chunk_size``).
    """
    from kvnumba import BlockManager

    return BlockManager(num_blocks, block_size, **kwargs)


def reference_manager_factory(num_blocks: int, block_size: int, **kwargs):
    """Build the pure-Python :class:`kvnumba.reference.ReferenceBlockManager` (slow).

    Takes the arguments of :func:`default_manager_factory`.
    """
    from kvnumba.reference import ReferenceBlockManager

    return ReferenceBlockManager(num_blocks, block_size, **kwargs)


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulation.

    Attributes
    ----------
    num_blocks : int
        Blocks in the pool; default ``DEFAULT_POOL_TOKENS // block_size``.
    block_size : int
        Tokens per block.
    max_batch : int
        Most running sequences at once (also the manager's ``max_seqs``).
    max_seq_len : int
        The manager's ``max_seq_len``; longer requests are rejected.
    prefix_caching : bool
        Passed to the manager.
    step_ms : float
        Trace milliseconds per decode step.
    max_prefill_tokens : int or None
        Cap on the prompt tokens offered to one ``admit`` call (the first queued prompt is
        always offered); ``None`` for no cap.
    eviction : str
        The eviction policy, a name of :data:`kvnumba.eviction.SIMULATOR_POLICIES`;
        ``oracle`` needs a trace with ``hash_ids``.
    sliding_window : int or None
        Sliding-window attention of this many tokens (``docs/windows.md``); ``None`` for none.
    attention_chunk_size : int or None
        Chunked local attention, chunks of this many tokens (a multiple of ``block_size``);
        ``None`` for none. At most one of the two is set (the manager refuses both).
    cost : CostModel
        The cost model that times the replay's steps (:mod:`kvnumba.sim.cost`); it changes no
        decision of the replay, only the modeled TTFT and TPOT. Default
        :data:`kvnumba.sim.cost.DEFAULT_COST`, an assumed profile.
    """

    num_blocks: int | None = None
    block_size: int = 16
    max_batch: int = 256
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    prefix_caching: bool = True
    step_ms: float = DEFAULT_STEP_MS
    max_prefill_tokens: int | None = None
    eviction: str = "lru"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    cost: CostModel = DEFAULT_COST

    @property
    def windowed(self) -> bool:
        """Whether the config sets a sliding window or chunked local attention."""
        return self.sliding_window is not None or self.attention_chunk_size is not None

    @property
    def blocks(self) -> int:
        """The pool size actually used (resolves the ``None`` default)."""
        if self.num_blocks is not None:
            return self.num_blocks
        return max(1, DEFAULT_POOL_TOKENS // self.block_size)


@dataclass
class SimResult:
    """Outcome of :meth:`Simulator.run`.

    Per-request arrays are indexed by :attr:`Request.index`; per-step arrays have one entry per
    simulated step (idle stretches are skipped, ``steps`` holds the step numbers).

    What the cost model needs (:meth:`latency`) is recorded per step and per request:
    ``prefill_computed`` (per step: prompt tokens admitted minus those served from the cache,
    recomputes included), ``decoded`` (per step: sequences that decoded a token),
    ``first_admit_index`` and ``finish_index`` (per request: the index into the per-step arrays
    of the step of its first admission and of the step that released it after its last output
    token; -1 if none), ``arrival_ms`` and ``output_len`` (per request, from the trace) and
    ``cost`` (the config's :class:`kvnumba.sim.cost.CostModel`).
    """

    requests: int
    served_count: np.ndarray  # int64 per request: 1 if served (must never exceed 1)
    rejected: np.ndarray  # bool per request
    preempted_count: np.ndarray  # int64 per request
    admitted_tokens: int  # prompt tokens offered by successful admits (recomputes included)
    cached_tokens: int  # of which served from the prefix cache
    first_admit_tokens: int  # prompt tokens of first admissions (each request at most once)
    first_admit_cached: int  # of which served from the prefix cache
    admit_order: np.ndarray  # request indices in the order of their first admission
    cow_copies: int
    evictions: int
    steps: np.ndarray = field(repr=False)
    used: np.ndarray = field(repr=False)
    cached: np.ndarray = field(repr=False)
    running: np.ndarray = field(repr=False)
    waiting: np.ndarray = field(repr=False)
    alloc_ns: np.ndarray = field(repr=False)
    replay_s: float = 0.0
    step_ms: float = DEFAULT_STEP_MS
    eviction: str = "lru"
    # Unreachable cached blocks and all cached blocks at each census sample (the last one
    # after the run); None when not counted (a trace without hash_ids, or a manager whose
    # blocks cannot be read).
    unreachable: np.ndarray | None = field(default=None, repr=False)
    unreachable_cached: np.ndarray | None = field(default=None, repr=False)
    prefill_computed: np.ndarray | None = field(default=None, repr=False)  # int64 per step
    decoded: np.ndarray | None = field(default=None, repr=False)  # int64 per step
    first_admit_index: np.ndarray | None = field(default=None, repr=False)  # int64 per request
    finish_index: np.ndarray | None = field(default=None, repr=False)  # int64 per request
    arrival_ms: np.ndarray | None = field(default=None, repr=False)  # float64 per request
    output_len: np.ndarray | None = field(default=None, repr=False)  # int64 per request
    cost: CostModel = DEFAULT_COST

    @property
    def time_s(self) -> np.ndarray:
        """Trace time of each simulated step in seconds (float64, one per entry of :attr:`steps`)."""
        return self.steps * (self.step_ms / 1000.0)

    @property
    def recompute_tokens(self) -> int:
        """Tokens re-admitted after a preemption (prompt plus what had been generated)."""
        return self.admitted_tokens - self.first_admit_tokens

    @property
    def recompute_cached(self) -> int:
        """Of :attr:`recompute_tokens`, those served from the prefix cache."""
        return self.cached_tokens - self.first_admit_cached

    @property
    def served(self) -> int:
        """Requests that ran to completion."""
        return int((self.served_count > 0).sum())

    @property
    def preemptions(self) -> int:
        """Preemptions (a request can be preempted several times)."""
        return int(self.preempted_count.sum())

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens of first admissions served from the prefix cache (recomputes excluded)."""
        if not self.first_admit_tokens:
            return 0.0
        return self.first_admit_cached / self.first_admit_tokens

    @property
    def prefix_hit_rate_incl_recompute(self) -> float:
        """Admitted tokens served from the prefix cache, recomputes included (the old figure)."""
        return self.cached_tokens / self.admitted_tokens if self.admitted_tokens else 0.0

    def latency(self, cost: CostModel | None = None) -> Latency | None:
        """The modeled clock, TTFT and TPOT of this run (:mod:`kvnumba.sim.cost`).

        Parameters
        ----------
        cost : CostModel, optional
            The profile; default :attr:`cost`, the run's config's. Another profile re-times
            the same schedule without replaying it.

        Returns
        -------
        kvnumba.sim.cost.Latency or None
            ``None`` for a result without the per-step records.
        """
        if (
            self.prefill_computed is None
            or self.decoded is None
            or self.arrival_ms is None
            or self.output_len is None  # the per-request records come with the per-step ones
            or self.first_admit_index is None
            or self.finish_index is None
        ):
            return None
        return model_latency(
            self.cost if cost is None else cost,
            step_start_ms=step_starts(self.steps, self.step_ms, self.arrival_ms, ~self.rejected),
            prefill_tokens=self.prefill_computed,
            decoded=self.decoded,
            arrival_ms=self.arrival_ms,
            output_len=self.output_len,
            first_admit_index=self.first_admit_index,
            finish_index=self.finish_index,
        )

    def unreachable_fields(self) -> dict:
        """The census of unreachable cached blocks (see :mod:`kvnumba.sim.unreachable`).

        Returns
        -------
        dict
            ``unreachable_cached_mean`` and ``unreachable_cached_final``: unreachable cached
            blocks, mean over the samples and after the run; ``unreachable_fraction_mean``
            (their share of the cached blocks over all samples) and
            ``unreachable_fraction_final``. All ``None`` when nothing was counted; a fraction
            is also ``None`` when no block was cached.
        """
        u, c = self.unreachable, self.unreachable_cached
        if u is None or c is None or not u.size:
            return dict.fromkeys(
                (
                    "unreachable_cached_mean",
                    "unreachable_cached_final",
                    "unreachable_fraction_mean",
                    "unreachable_fraction_final",
                )
            )
        total = int(c.sum())
        return {
            "unreachable_cached_mean": round(float(u.mean()), 1),
            "unreachable_cached_final": int(u[-1]),
            "unreachable_fraction_mean": round(int(u.sum()) / total, 4) if total else None,
            "unreachable_fraction_final": round(int(u[-1]) / int(c[-1]), 4) if c[-1] else None,
        }

    def summary(self) -> dict:
        """The headline numbers as a flat, JSON-ready dict.

        ``eviction`` names the policy. ``prefix_hit_rate`` counts first admissions only;
        ``recompute_tokens`` and ``recompute_cached_tokens`` are the re-admissions of preempted
        requests, and ``prefix_hit_rate_incl_recompute`` is the hit rate over both.
        ``prefill_tokens_computed`` (prompt tokens not served from the cache, recomputes
        included) and the modeled ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms`` and
        ``tpot_p99_ms`` follow: :meth:`kvnumba.sim.cost.Latency.fields` of :meth:`latency`
        (``None`` without the per-step records). The ``unreachable_*`` fields are
        :meth:`unreachable_fields`. ``replay_s`` is the replay loop's wall time only.
        """
        us = self.alloc_ns / 1000.0 if self.alloc_ns.size else np.zeros(1)

        def stat(a: np.ndarray, f) -> float:
            return float(f(a)) if a.size else 0.0

        latency = self.latency()
        modeled = dict.fromkeys(LATENCY_FIELDS) if latency is None else latency.fields()

        return {
            "eviction": self.eviction,
            "requests": self.requests,
            "served": self.served,
            "rejected": int(self.rejected.sum()),
            "prefix_hit_rate": round(self.prefix_hit_rate, 4),
            "first_admit_prompt_tokens": self.first_admit_tokens,
            "first_admit_cached_tokens": self.first_admit_cached,
            "recompute_tokens": self.recompute_tokens,
            "recompute_cached_tokens": self.recompute_cached,
            "prefix_hit_rate_incl_recompute": round(self.prefix_hit_rate_incl_recompute, 4),
            **modeled,
            "steps": int(self.steps.size),
            "peak_blocks_used": int(stat(self.used, np.max)),
            "mean_blocks_used": round(stat(self.used, np.mean), 1),
            "peak_blocks_cached": int(stat(self.cached, np.max)),
            "mean_blocks_cached": round(stat(self.cached, np.mean), 1),
            **self.unreachable_fields(),
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "cow_copies": self.cow_copies,
            "alloc_us_per_step_median": round(float(np.median(us)), 2),
            "alloc_us_per_step_mean": round(float(np.mean(us)), 2),
            "replay_s": round(self.replay_s, 2),
        }


class Simulator:
    """Replay ``requests`` through a freshly built manager (see the module docstring).

    Parameters
    ----------
    requests : sequence of Request
        The trace; ``requests[i].index`` must be ``i``. Replayed in arrival order (stable).
    config : SimConfig, optional
    manager_factory : callable, optional
        ``factory(num_blocks, block_size, *, max_seqs, max_seq_len, prefix_caching)`` returning
        an object with the batched BlockManager API; default :class:`kvnumba.BlockManager`.
        For a policy other than ``lru`` it is also given the :func:`policy_arguments`
        (``eviction=NAME``, and ``_hindsight=True`` for ``oracle``, whose manager must also
        offer ``set_next_use``), and for a windowed config the :func:`window_arguments`.
    progress : callable, optional
        Called with the number of requests newly finished (served or rejected).
    keys : BlockKeys, optional
        :func:`kvnumba.sim.ideal.block_keys` of ``requests`` at the config's block size, when
        the caller already has them; computed here otherwise.

    Attributes
    ----------
    manager
        The manager the run used (inspect it after :meth:`run`).
    keys : BlockKeys or None
        The trace's block keys (``None`` for a trace without ``hash_ids``).

    Raises
    ------
    ValueError
        An invalid config: an unknown eviction policy, or ``oracle`` on a trace without
        ``hash_ids``; or a manager whose ``eviction``, ``sliding_window`` or
        ``attention_chunk_size`` is not the config's (``InvalidGeometry``, a ``ValueError``,
        for a window the manager refuses).
    """

    def __init__(
        self,
        requests: Sequence[Request],
        config: SimConfig | None = None,
        manager_factory: Callable | None = None,
        progress: Callable[[int], object] | None = None,
        keys: BlockKeys | None = None,
    ):
        self.requests = list(requests)
        if any(r.index != i for i, r in enumerate(self.requests)):
            raise ValueError("requests[i].index must equal i")
        self.config = config or SimConfig()
        cfg = self.config
        if (
            cfg.max_batch < 1
            or cfg.block_size < 1
            or cfg.blocks < 1
            or not (math.isfinite(cfg.step_ms) and cfg.step_ms > 0)
            or not isinstance(cfg.cost, CostModel)
        ):
            raise ValueError(f"invalid simulation config {cfg}")
        policy_code(cfg.eviction, hindsight=True)  # ValueError naming the known policies
        self.keys = keys if keys is not None else block_keys(self.requests, cfg.block_size)
        hindsight = needs_future(cfg.eviction)
        if hindsight and self.keys is None:
            raise ValueError(
                f"eviction {cfg.eviction!r} needs to know when each block is used again: a "
                "trace with hash_ids (Mooncake format); this trace has none"
            )
        factory = manager_factory or default_manager_factory
        policy = policy_arguments(cfg.eviction)
        window = window_arguments(cfg)
        _warm_up(factory, cfg.block_size, {**policy, **window})
        self.manager = factory(
            cfg.blocks,
            cfg.block_size,
            max_seqs=cfg.max_batch,
            max_seq_len=cfg.max_seq_len,
            prefix_caching=cfg.prefix_caching,
            **policy,
            **window,
        )
        name = policy_name(cfg.eviction)
        built = getattr(self.manager, "eviction", name)
        if built != name:  # a factory that dropped the policy would mislabel the run
            raise ValueError(
                f"the manager factory built a manager with eviction {built!r}, not {cfg.eviction!r}"
            )
        for name in ("sliding_window", "attention_chunk_size"):
            built = getattr(self.manager, name, getattr(cfg, name))
            if built != getattr(cfg, name):  # nor one that dropped the window
                raise ValueError(
                    f"the manager factory built a manager with {name}={built!r}, not "
                    f"{getattr(cfg, name)!r}"
                )
        self.progress = progress
        self._hints = Hints(self.keys) if hindsight and self.keys is not None else None
        # Under a window a cached block whose parent is gone can still be hit: no census.
        keys = self.keys
        countable = not cfg.windowed and block_census(self.manager) is not None
        self._census = Census(keys, cfg.blocks) if keys is not None and countable else None

    def run(self) -> SimResult:
        """Replay the whole trace until every request is served or rejected.

        Returns
        -------
        SimResult

        Raises
        ------
        RuntimeError
            If the queue can make no progress (a bug: requests that cannot fit are rejected
            up front, and an empty pool always fits the queue head).
        """
        t_start = time.perf_counter()
        cfg, mgr, reqs = self.config, self.manager, self.requests
        n, bs = len(reqs), cfg.block_size
        prompt = np.fromiter((r.prompt_len for r in reqs), np.int64, n)
        output = np.fromiter((r.output_len for r in reqs), np.int64, n)
        arrival = np.fromiter((r.arrival_ms for r in reqs), np.float64, n)
        order = np.argsort(arrival, kind="stable")
        arrival_step = np.floor(arrival[order] / cfg.step_ms).astype(np.int64)
        total = prompt + output
        # Requests that could never run: too long for a sequence, or bigger than the whole pool.
        never = (total > cfg.max_seq_len) | (-(-total // bs) > cfg.blocks)

        generated = np.zeros(n, np.int64)  # output tokens a queued request already produced
        admitted_once = np.zeros(n, bool)
        admit_order: list[int] = []
        served = np.zeros(n, np.int64)
        preempted = np.zeros(n, np.int64)
        rejected = np.zeros(n, bool)
        # For the cost model: per request, the index (into the per-step lists) of the step of
        # its first admission and of the step that released it after its last token.
        first_admit_at = np.full(n, -1, np.int64)
        finish_at = np.full(n, -1, np.int64)
        queue: deque[int] = deque()
        token_cache: dict[int, np.ndarray] = {}  # materialized prompts of queued requests

        # Running sequences, oldest admission first (parallel arrays).
        r_id = np.zeros(0, np.int64)
        r_req = np.zeros(0, np.int64)
        r_len = np.zeros(0, np.int64)
        r_left = np.zeros(0, np.int64)

        steps: list[int] = []
        used, cached, running, waiting, alloc = [], [], [], [], []
        computed, decoded = [], []  # per step: prompt tokens computed, tokens decoded
        admitted_tokens = cached_tokens = first_tokens = first_cached = cow = 0
        # Waiting prompts that cannot fit yet are not offered (kvnumba.sim.offers).
        gate = OfferGate(mgr, n, bs, self.keys, cfg.windowed)

        def prompt_tokens(i: int, length: int) -> np.ndarray:
            toks = token_cache.get(i)
            if toks is None or toks.size != length:
                toks = token_cache[i] = reqs[i].tokens(length)
            return toks

        p, step = 0, 0
        ones = np.ones(cfg.max_batch, np.int64)
        hints, census = self._hints, self._census
        sample_every = max(1, math.ceil(n * SAMPLE_EVERY))
        next_sample = sample_every

        def timed(fn, *args, **kwargs):
            nonlocal step_ns
            t0 = time.perf_counter_ns()
            out = fn(*args, **kwargs)
            step_ns += time.perf_counter_ns() - t0
            return out

        while p < n or queue or r_id.size:
            if not queue and not r_id.size:
                step = max(step, int(arrival_step[p]))  # skip the idle stretch
            step_ns = 0
            finished_now = 0
            computed_now = decoded_now = 0

            # 1. arrivals
            q = int(np.searchsorted(arrival_step, step, side="right"))
            if q > p:
                new = order[p:q]
                bad = new[never[new]]
                rejected[bad] = True
                finished_now += bad.size
                queue.extend(new[~never[new]].tolist())
                p = q

            # 2. decode one token per running sequence, preempting the newest on exhaustion
            need = r_left > 0
            while need.any():
                pos = np.flatnonzero(need)
                res = timed(
                    mgr.append,
                    r_id[pos],
                    ones[: pos.size],
                    output_tokens(r_req[pos], r_len[pos]),
                    atomic=False,
                )
                good = pos[res.ok]
                decoded_now += good.size
                r_len[good] += 1
                r_left[good] -= 1
                need[good] = False
                cow += len(res.cow_src)
                if good.size == pos.size:
                    break
                v = r_id.size - 1  # newest
                timed(mgr.release, r_id[v : v + 1])
                i = int(r_req[v])
                if r_left[v] == 0:  # it just produced its last token: finished, not preempted
                    served[i] += 1
                    finish_at[i] = len(steps)
                    finished_now += 1
                else:
                    generated[i] = r_len[v] - prompt[i]
                    preempted[i] += 1
                    queue.appendleft(i)
                r_id, r_req, r_len, r_left, need = (
                    r_id[:v],
                    r_req[:v],
                    r_len[:v],
                    r_left[:v],
                    need[:v],
                )

            # 3. release finished sequences
            done = r_left == 0
            if done.any():
                timed(mgr.release, r_id[done])
                served[r_req[done]] += 1
                finish_at[r_req[done]] = len(steps)
                finished_now += int(done.sum())
                keep = ~done
                r_id, r_req, r_len, r_left = r_id[keep], r_req[keep], r_len[keep], r_left[keep]

            # 4. admit from the head of the queue: the runs of prompts that may fit, in order
            slots = cfg.max_batch - r_id.size
            if slots > 0 and queue:
                window = self._window(queue, slots, prompt, generated)
                waiting_now = set(window)
                for i in [i for i in token_cache if i not in waiting_now]:
                    del token_cache[i]  # keep only the prompts still being offered
                win = np.asarray(window, np.int64)
                lengths = prompt[win] + generated[win]
                ok = np.zeros(win.size, bool)
                hits = np.zeros(win.size, np.int64)
                ids = np.full(win.size, -1, np.int64)
                k = 0
                while k < win.size:
                    st = mgr.stats()
                    fits = gate.may_fit(win[k:], lengths[k:], st.free + st.cached)
                    if not fits.any():
                        break
                    a = k + int(np.argmax(fits))
                    rest = fits[a - k :]  # the run ends at the next prompt that cannot fit
                    b = a + (rest.size if rest.all() else int(np.argmin(rest)))
                    run = slice(a, b)
                    tokens = np.concatenate(
                        [
                            prompt_tokens(i, n)
                            for i, n in zip(win[run].tolist(), lengths[run].tolist(), strict=True)
                        ]
                    )
                    res = timed(mgr.admit, tokens, lengths[run], atomic=False)
                    ok[run] = np.asarray(res.ok, bool)
                    hits[run] = np.asarray(res.num_cached_tokens)
                    ids[run] = np.asarray(res.ids, np.int64)
                    gate.admitted(win[run][ok[run]])
                    failed = np.flatnonzero(~ok[run]) + a
                    if failed.size and not (cfg.windowed and ok[run].any()):
                        st = mgr.stats()
                        gate.failed(
                            win[failed],
                            lengths[failed],
                            np.concatenate([token_cache[i] for i in win[failed].tolist()]),
                            st.free + st.cached,
                        )
                    k = b
                adm = win[ok]
                admitted_now, cached_now = int(lengths[ok].sum()), int(hits[ok].sum())
                admitted_tokens += admitted_now
                cached_tokens += cached_now
                computed_now += admitted_now - cached_now
                first = ok & ~admitted_once[win]
                first_tokens += int(lengths[first].sum())
                first_cached += int(hits[first].sum())
                admit_order += win[first].tolist()  # in window order, as admit served them
                admitted_once[win[first]] = True
                first_admit_at[win[first]] = len(steps)
                for _ in window:
                    queue.popleft()
                queue.extendleft(reversed(win[~ok].tolist()))  # failed ones keep their place
                for i in adm.tolist():
                    token_cache.pop(i, None)
                new_ids = ids[ok]
                if adm.size and (hints is not None or census is not None):
                    tables = mgr.block_tables(new_ids)
                    if hints is not None:
                        hints.after_admit(mgr, adm, tables)
                    if census is not None:
                        census.after_admit(mgr, adm, tables)
                r_id = np.concatenate([r_id, new_ids])
                r_req = np.concatenate([r_req, adm])
                r_len = np.concatenate([r_len, lengths[ok]])
                r_left = np.concatenate([r_left, output[adm] - generated[adm]])
                if not r_id.size and queue:
                    raise RuntimeError(
                        f"scheduler stalled at step {step}: request {queue[0]} does not fit an "
                        "idle pool"
                    )

            if census is not None and len(admit_order) >= next_sample:
                census.sample(mgr)
                next_sample = (len(admit_order) // sample_every + 1) * sample_every
            st = mgr.stats()
            steps.append(step)
            used.append(st.used)
            cached.append(st.cached)
            running.append(r_id.size)
            waiting.append(len(queue))
            alloc.append(step_ns)
            computed.append(computed_now)
            decoded.append(decoded_now)
            if finished_now and self.progress is not None:
                self.progress(finished_now)
            step += 1

        final = mgr.stats()
        if census is not None:
            census.sample(mgr)
        return SimResult(
            requests=n,
            served_count=served,
            rejected=rejected,
            preempted_count=preempted,
            admitted_tokens=admitted_tokens,
            cached_tokens=cached_tokens,
            first_admit_tokens=first_tokens,
            first_admit_cached=first_cached,
            admit_order=np.asarray(admit_order, np.int64),
            cow_copies=max(cow, int(final.cow_copies)),
            evictions=int(final.evictions),
            steps=np.asarray(steps, np.int64),
            used=np.asarray(used, np.int64),
            cached=np.asarray(cached, np.int64),
            running=np.asarray(running, np.int64),
            waiting=np.asarray(waiting, np.int64),
            alloc_ns=np.asarray(alloc, np.int64),
            replay_s=time.perf_counter() - t_start,
            step_ms=cfg.step_ms,
            eviction=policy_name(cfg.eviction),
            unreachable=None if census is None else np.asarray(census.unreachable, np.int64),
            unreachable_cached=None if census is None else np.asarray(census.cached, np.int64),
            prefill_computed=np.asarray(computed, np.int64),
            decoded=np.asarray(decoded, np.int64),
            first_admit_index=first_admit_at,
            finish_index=finish_at,
            arrival_ms=arrival,
            output_len=output,
            cost=cfg.cost,
        )

    def _window(self, queue: deque, slots: int, prompt: np.ndarray, generated: np.ndarray) -> list:
        """Queue head offered to one ``admit``: ``slots`` requests, within the prefill budget."""
        head = list(itertools.islice(queue, slots))
        budget = self.config.max_prefill_tokens
        if budget is None:
            return head
        sizes = np.cumsum(prompt[head] + generated[head])
        return head[: max(1, int(np.searchsorted(sizes, budget, side="right")))]


def _warm_up(factory: Callable, block_size: int, arguments: dict) -> None:
    """Run each timed call once on a throwaway manager with the run's eviction policy and
    attention kind (``arguments``: :func:`policy_arguments` and :func:`window_arguments`).

    With a cold numba cache the first call of each kernel compiles it (seconds); that must not
    be billed to the first simulated steps' allocator time.
    """
    mgr = factory(
        4, block_size, max_seqs=2, max_seq_len=4 * block_size, prefix_caching=True, **arguments
    )
    # One full block and one partial one: a full prompt block is what hints are given for.
    lengths = np.array([block_size, 1], np.int64)
    res = mgr.admit(np.zeros(block_size + 1, np.int64), lengths, atomic=False)
    if arguments.get("_hindsight"):
        mgr.set_next_use(
            mgr.block_tables(res.ids[:1])[0, :1].astype(np.int64), np.ones(1, np.int64)
        )
    mgr.append(res.ids, np.ones(2, np.int64), np.zeros(2, np.int64), atomic=False)
    mgr.release(res.ids)
    mgr.stats()


def simulate(
    requests: Sequence[Request],
    config: SimConfig | None = None,
    manager_factory: Callable | None = None,
    progress: Callable[[int], object] | None = None,
    keys: BlockKeys | None = None,
) -> SimResult:
    """Build a :class:`Simulator` and run it; see there for the parameters."""
    return Simulator(requests, config, manager_factory, progress, keys).run()


def compare_window(
    config: SimConfig,
    requests: Sequence[Request],
    manager_factory: Callable | None = None,
    progress: Callable[[int], object] | None = None,
    keys: BlockKeys | None = None,
) -> tuple[SimResult, SimResult]:
    """Replay ``requests`` under a windowed ``config``, then under the same config without the
    window (:func:`full_attention`): what the window saves, on the same trace.

    Parameters
    ----------
    config : SimConfig
        A windowed config (``sliding_window`` or ``attention_chunk_size`` set).
    requests, manager_factory, progress, keys
        As for :class:`Simulator`; ``progress`` counts both runs' requests.

    Returns
    -------
    (SimResult, SimResult)
        The windowed run and the full-attention run.

    Raises
    ------
    ValueError
        ``config`` has no window, or is invalid (see :class:`Simulator`). Both simulators are
        built before either runs, so an invalid config raises before any replay.
    """
    if not config.windowed:
        raise ValueError(
            "compare_window needs a config with sliding_window or attention_chunk_size"
        )
    windowed = Simulator(requests, config, manager_factory, progress, keys)
    full = Simulator(requests, full_attention(config), manager_factory, progress, windowed.keys)
    return windowed.run(), full.run()
