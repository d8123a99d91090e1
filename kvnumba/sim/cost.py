"""What a hit is worth: a cost model that times the simulator's replay steps.

The schedule of a replay (which request is admitted, decodes, is preempted or finishes in which
step) does not depend on this model. The model only gives each replay step a duration, from the
work the step did, and from the durations a modeled clock:

* a step that computes ``P`` prompt tokens (tokens admitted minus tokens served from the prefix
  cache, re-admissions after a preemption included) and decodes one token for each of ``D``
  sequences runs ``passes = ceil(P / prefill_tokens_per_step)`` forward passes (at least one
  when ``D > 0``; none when ``P = D = 0``; exactly one when there is no prefill token limit), and
  lasts::

      duration = passes * step_overhead_us + P * prefill_us_per_token + D * decode_us_per_token

  (the decode tokens ride in the first pass; a limit only adds the overhead of the extra
  passes, the work per token is the same);
* step ``i`` starts at the latest of: the end of step ``i - 1``, its trace time
  ``steps[i] * step_ms``, and the arrival of the last request that joined the queue in it (the
  simulator takes a request arriving during ``[t * step_ms, (t + 1) * step_ms)`` in at step
  ``t``; it cannot be computed before it arrives). It ends ``duration`` later. So an idle
  stretch jumps to the next arrival, and when the modeled work takes longer than the trace
  allows the clock runs behind the trace (queueing);
* per request: **TTFT** is the end of the step of its first admission (its prefill) minus its
  arrival; **TPOT**, for a request with at least two output tokens, is the end of the step that
  decoded its last output token minus the end of its first admission, divided by its output
  tokens minus one. A preempted request keeps the TTFT of its first admission; its recompute
  counts as prompt tokens computed in the step that re-admits it.

The simulator decodes every output token in a step after the prefill step (the prefill step
itself produces none), so its TPOT covers one decode step more than an engine that samples the
first token in the prefill pass: short outputs read a little slow. And the clock never runs
ahead of the trace, so when the modeled steps are shorter than ``step_ms`` the decode pace is
``step_ms``: TPOT then reads ``step_ms``, the simulator's own assumption (``--step-ms``).

:data:`DEFAULT_COST` is an **assumption**, not a measurement: a dense 8B model (Llama-3-8B
class: 32 layers, 8 KV heads of 128 dimensions, bf16) on one H100 SXM 80 GB:

* ``prefill_us_per_token = 40``: about 16 GFLOP per prompt token (two per weight) at about
  400 TFLOP/s, some 40% of the bf16 dense peak: 25,000 prompt tokens per second;
* ``decode_us_per_token = 80`` per sequence in a decode step: the same 40 us of weight
  matmuls per token once the batch is large, plus about 40 us to read a 1,000-token context's
  KV cache (128 KiB per token) at about 3.3 TB/s;
* ``step_overhead_us = 5000`` per forward pass: reading the 16 GB of weights once at about
  3.3 TB/s, whatever the batch (a batch of one decodes in about 5 ms);
* ``prefill_tokens_per_step = 8192``: a common chunked-prefill budget per pass for such a
  model on an 80 GB GPU.

The model has no context-length term: attention over long contexts (the Mooncake traces'
prompts average about 15,000 tokens) costs more than the default charges; raise
``decode_us_per_token`` (and ``prefill_us_per_token``) for such traces, or scale all four
numbers to another model or GPU. Override it with ``SimConfig(cost=CostModel(...))`` or the
``--prefill-us-per-token``, ``--decode-us-per-token``, ``--step-overhead-us`` and
``--prefill-tokens-per-step`` options of ``kvnumba simulate`` and ``kvnumba sweep``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """How long a replay step takes, from the work it does (see the module docstring).

    Attributes
    ----------
    prefill_us_per_token : float
        Microseconds per prompt token computed (not served from the cache), >= 0.
    decode_us_per_token : float
        Microseconds per token decoded, one per running sequence in a decode step, >= 0.
    step_overhead_us : float
        Microseconds per forward pass whatever its size, >= 0.
    prefill_tokens_per_step : int or None
        Most prompt tokens one forward pass computes (>= 1): a step with more runs
        ``ceil(tokens / prefill_tokens_per_step)`` passes. ``None``: one pass, any size.

    Raises
    ------
    ValueError
        A cost that is negative or not finite, or a token limit below 1.
    """

    prefill_us_per_token: float = 40.0
    decode_us_per_token: float = 80.0
    step_overhead_us: float = 5000.0
    prefill_tokens_per_step: int | None = 8192

    def __post_init__(self):
        for name in ("prefill_us_per_token", "decode_us_per_token", "step_overhead_us"):
            value = getattr(self, name)
            real = isinstance(value, (int, float, np.integer, np.floating))
            if isinstance(value, bool) or not real or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        limit = self.prefill_tokens_per_step
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
                raise ValueError(
                    f"prefill_tokens_per_step must be an integer >= 1 or None, got {limit!r}"
                )
            object.__setattr__(self, "prefill_tokens_per_step", int(limit))

    def fields(self) -> dict:
        """The profile as a flat dict, JSON-ready.

        Returns
        -------
        dict
            One entry per name of :data:`COST_FIELDS` (as in ``--json``'s config and in a
            sweep row).
        """
        return {name: getattr(self, name) for name in COST_FIELDS}

    def passes(self, prefill_tokens: np.ndarray, decoded: np.ndarray) -> np.ndarray:
        """Forward passes of each step.

        Parameters
        ----------
        prefill_tokens : numpy.ndarray
            Prompt tokens computed per step (int).
        decoded : numpy.ndarray
            Tokens decoded per step (int).

        Returns
        -------
        numpy.ndarray
            int64 per step: ``ceil(prefill_tokens / prefill_tokens_per_step)``, at least 1 when
            the step decodes, 0 for a step that computes nothing; without a limit 1 for every
            step that computes anything.
        """
        p = np.asarray(prefill_tokens, np.int64)
        busy = ((p > 0) | (np.asarray(decoded, np.int64) > 0)).astype(np.int64)
        limit = self.prefill_tokens_per_step
        if limit is None:
            return busy
        return np.maximum(-(-p // limit), busy)

    def step_duration_ms(self, prefill_tokens: np.ndarray, decoded: np.ndarray) -> np.ndarray:
        """Modeled duration of each step in milliseconds.

        Parameters
        ----------
        prefill_tokens, decoded : numpy.ndarray
            As for :meth:`passes`.

        Returns
        -------
        numpy.ndarray
            float64 per step: ``passes * step_overhead_us + prefill_tokens *
            prefill_us_per_token + decoded * decode_us_per_token``, over 1,000.
        """
        us = (
            self.passes(prefill_tokens, decoded) * self.step_overhead_us
            + np.asarray(prefill_tokens, np.float64) * self.prefill_us_per_token
            + np.asarray(decoded, np.float64) * self.decode_us_per_token
        )
        return us / 1000.0


#: The fields of :class:`CostModel`, as they appear in ``--json``'s config and sweep rows.
COST_FIELDS = tuple(f.name for f in fields(CostModel))

#: The default profile: an assumption (a dense 8B model on one H100), see the module docstring.
DEFAULT_COST = CostModel()


def step_starts(
    steps: np.ndarray, step_ms: float, arrival_ms: np.ndarray, joined: np.ndarray | None = None
) -> np.ndarray:
    """The earliest modeled start of each step: its trace time, or the last arrival it takes in.

    Parameters
    ----------
    steps : numpy.ndarray
        Step numbers of the replay's steps (increasing int).
    step_ms : float
        Trace milliseconds per step.
    arrival_ms : numpy.ndarray
        Arrival time of each request (float, any order).
    joined : numpy.ndarray, optional
        Bool per request: which requests joined the queue (rejected ones did not); all when
        ``None``.

    Returns
    -------
    numpy.ndarray
        float64 per step: ``max(steps * step_ms, latest arrival of a request that joined at
        that step)``. A request joins at step ``floor(arrival_ms / step_ms)``.
    """
    steps = np.asarray(steps, np.int64)
    start = steps * float(step_ms)
    arrival = np.asarray(arrival_ms, np.float64)
    if joined is not None:
        arrival = arrival[np.asarray(joined, bool)]
    if not arrival.size or not steps.size:
        return start
    arrival = np.sort(arrival)
    at_step = np.floor(arrival / step_ms).astype(np.int64)
    last = np.searchsorted(at_step, steps, side="right") - 1  # last arrival joined by then
    latest = np.where(last >= 0, arrival[np.maximum(last, 0)], -np.inf)
    return np.maximum(start, latest)


def modeled_clock(start_ms: np.ndarray, duration_ms: np.ndarray) -> np.ndarray:
    """End of each step on the modeled clock.

    Parameters
    ----------
    start_ms : numpy.ndarray
        Earliest start of each step (:func:`step_starts`).
    duration_ms : numpy.ndarray
        Modeled duration of each step (:meth:`CostModel.step_duration_ms`).

    Returns
    -------
    numpy.ndarray
        float64 per step: ``end[i] = max(end[i - 1], start[i]) + duration[i]``, computed
        without a loop as ``C[i] + max(start[j] - C[j - 1] for j <= i)`` with ``C`` the
        cumulative durations.
    """
    d = np.asarray(duration_ms, np.float64)
    c = np.cumsum(d)
    return c + np.maximum.accumulate(np.asarray(start_ms, np.float64) - (c - d))


def _percentile(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values.size else None


@dataclass(frozen=True, eq=False)
class Latency:
    """Modeled times of one replay (:func:`model_latency`).

    Attributes
    ----------
    step_end_ms : numpy.ndarray
        float64 per step: the end of each step on the modeled clock.
    ttft_ms : numpy.ndarray
        float64 per request: time to first token; NaN for a request never admitted.
    tpot_ms : numpy.ndarray
        float64 per request: time per output token after the first; NaN for a request with
        fewer than two output tokens or never served.
    prefill_tokens_computed : int
        Prompt tokens computed over the run, recomputes included (admitted minus cached).
    """

    step_end_ms: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    prefill_tokens_computed: int

    def fields(self) -> dict:
        """The summary fields, JSON-ready.

        Returns
        -------
        dict
            ``prefill_tokens_computed``; ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms`` and
            ``tpot_p99_ms`` (percentiles over the requests that have the value, linear
            interpolation, rounded to the microsecond; ``None`` when no request has it).
        """
        ttft = self.ttft_ms[~np.isnan(self.ttft_ms)]
        tpot = self.tpot_ms[~np.isnan(self.tpot_ms)]
        return {
            "prefill_tokens_computed": self.prefill_tokens_computed,
            "ttft_p50_ms": _percentile(ttft, 50),
            "ttft_p99_ms": _percentile(ttft, 99),
            "tpot_p50_ms": _percentile(tpot, 50),
            "tpot_p99_ms": _percentile(tpot, 99),
        }


#: The keys of :meth:`Latency.fields`, in order.
LATENCY_FIELDS = (
    "prefill_tokens_computed",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
)


def model_latency(
    cost: CostModel,
    *,
    step_start_ms: np.ndarray,
    prefill_tokens: np.ndarray,
    decoded: np.ndarray,
    arrival_ms: np.ndarray,
    output_len: np.ndarray,
    first_admit_index: np.ndarray,
    finish_index: np.ndarray,
) -> Latency:
    """Apply a cost model to a replay's steps (vectorized: no loop over steps or tokens).

    Parameters
    ----------
    cost : CostModel
        The profile.
    step_start_ms : numpy.ndarray
        Earliest start of each step (:func:`step_starts`).
    prefill_tokens : numpy.ndarray
        Prompt tokens computed per step.
    decoded : numpy.ndarray
        Tokens decoded per step.
    arrival_ms : numpy.ndarray
        Arrival time per request.
    output_len : numpy.ndarray
        Output tokens per request.
    first_admit_index : numpy.ndarray
        Per request, the index (into the per-step arrays) of the step of its first admission;
        -1 for a request never admitted.
    finish_index : numpy.ndarray
        Per request, the index of the step that decoded its last output token and released it;
        -1 for a request never served.

    Returns
    -------
    Latency
    """
    end = modeled_clock(step_start_ms, cost.step_duration_ms(prefill_tokens, decoded))
    first = np.asarray(first_admit_index, np.int64)
    finish = np.asarray(finish_index, np.int64)
    out = np.asarray(output_len, np.int64)
    nan = np.full(first.shape, np.nan)
    first_end = np.where(first >= 0, end[np.maximum(first, 0)] if end.size else nan, np.nan)
    ttft = first_end - np.asarray(arrival_ms, np.float64)
    timed = (finish >= 0) & (first >= 0) & (out >= 2)
    finish_end = np.where(timed, end[np.maximum(finish, 0)] if end.size else nan, np.nan)
    tpot = np.where(timed, (finish_end - first_end) / np.maximum(out - 1, 1), np.nan)
    return Latency(
        step_end_ms=end,
        ttft_ms=ttft,
        tpot_ms=tpot,
        prefill_tokens_computed=int(np.asarray(prefill_tokens, np.int64).sum()),
    )
