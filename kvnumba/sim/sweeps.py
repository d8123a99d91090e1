"""Parameter sweeps of the simulator on Dask: one simulation per task, one table row per task.

A sweep is the grid traces x pool sizes x block sizes x prefix caching x eviction policies x
sliding windows x attention chunk sizes x max batch x step length (:func:`make_grid`); every
point is one :func:`run_point` task on a Dask ``distributed`` cluster: by default a :class:`distributed.LocalCluster` with one single-threaded worker process
per core (a simulation is single-threaded, CPU-bound Python and numba code, so processes, not
threads, run them in parallel), or any running cluster by its scheduler's address.

Each finished task appends one row to ``results.jsonl`` and ``results.csv`` in the output
folder at once, so an interrupted sweep loses only the simulations that were running: run it
again and the points whose key is already in ``results.jsonl`` are skipped, not re-run. A row
holds the config columns, every field of ``kvnumba simulate --json`` and the point's ``key``.

The cost model's profile (:mod:`kvnumba.sim.cost`: ``prefill_us_per_token``,
``decode_us_per_token``, ``step_overhead_us``, ``prefill_tokens_per_step``) is a fixed setting
of a sweep, not a grid dimension; it is part of every point (and of its key), so a sweep run
again with another profile re-runs its points.

Kernels are compiled (or loaded from the numba cache) in the client before any task is
submitted (:func:`warm_kernels`), so workers that share its file system and ``NUMBA_CACHE_DIR``
only load them; a worker on another machine compiles once, on its first task.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import itertools
import json
import math
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from kvnumba.eviction import SIMULATOR_POLICIES, is_valid_policy, needs_future
from kvnumba.sim._progress import progress_bar
from kvnumba.sim.cost import DEFAULT_COST, CostModel
from kvnumba.sim.ideal import BlockKeys, block_keys
from kvnumba.sim.report import result_fields
from kvnumba.sim.scheduler import (
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_POOL_TOKENS,
    DEFAULT_STEP_MS,
    SimConfig,
    simulate,
)
from kvnumba.sim.traces import TRACE_FORMATS, Request, default_trace_path, load_trace

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+
    from typing_extensions import Unpack

#: Short names for the traces shipped in ``kvnumba/data``; a worker resolves them in its own
#: installation, so they work on a cluster without a shared file system.
EMBEDDED_TRACES = {
    "mooncake": "mooncake_synthetic_trace.jsonl",
    "azure": "AzureLLMInferenceTrace_conv.csv",
}

#: Row fields that measure time and so differ between two runs of the same simulation.
TIMING_COLUMNS = ("alloc_us_per_step_median", "alloc_us_per_step_mean", "replay_s", "wall_s")

#: Dask settings of the local cluster's workers. A simulation is one long Python and numba call
#: that holds the GIL; a worker's housekeeping (the event loop's tick, the system monitor, the
#: statistical profiler) takes the GIL from it on timers. Slower timers and no profiler leave a
#: simulation in a worker nearly as fast as outside Dask.
QUIET_WORKERS = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "10s",
    "distributed.worker.profile.enabled": False,
}

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"


# A field's metadata key: the value at which the field is left out of the resume key.
_KEY_OMITS = "key_omits"


class GridError(ValueError):
    """A sweep grid that cannot run: empty, unknown trace, bad value or unreadable trace."""


class GridOptions(TypedDict, total=False):
    """The keywords of a grid that :func:`sweep` passes on to :func:`make_grid` (whose
    signature gives their defaults and whose docstring their meaning): the grid dimensions, the
    replay's fixed settings, the cost profile and the trace files' format. A test keeps the two
    equal."""

    blocks: int | Sequence[int | None] | None
    block_sizes: int | Sequence[int]
    prefix_caching: bool | Sequence[bool]
    eviction: str | Sequence[str]
    max_batch: int | Sequence[int]
    step_ms: float | Sequence[float]
    limit: int | None
    max_seq_len: int
    max_prefill_tokens: int | None
    sliding_window: int | None | Sequence[int | None]
    attention_chunk_size: int | None | Sequence[int | None]
    prefill_us_per_token: float
    decode_us_per_token: float
    step_overhead_us: float
    prefill_tokens_per_step: int | None
    trace_format: str


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: a trace and one value of every grid dimension.

    Attributes
    ----------
    trace : str
        An embedded trace name (``mooncake``, ``azure``) or an absolute file path.
    limit : int or None
        Replay only the first ``limit`` requests.
    blocks : int
        Pool size in blocks (resolved: never ``None``).
    block_size : int
        Tokens per block.
    prefix_caching : bool
        Prefix caching on or off.
    eviction : str
        The eviction policy (a name of :data:`kvnumba.eviction.SIMULATOR_POLICIES`).
    max_batch : int
        Most running sequences at once.
    step_ms : float
        Trace milliseconds per decode step.
    max_seq_len : int
        Longest sequence; longer requests are rejected.
    max_prefill_tokens : int or None
        Prompt tokens offered to one ``admit`` call.
    sliding_window : int or None
        Sliding-window attention of this many tokens; ``None`` for none (``docs/windows.md``).
    attention_chunk_size : int or None
        Chunked local attention, chunks of this many tokens; ``None`` for none. At most one of
        the two is set.
    prefill_us_per_token, decode_us_per_token, step_overhead_us : float
        The cost model's profile (:class:`kvnumba.sim.cost.CostModel`); default
        :data:`kvnumba.sim.cost.DEFAULT_COST`'s.
    prefill_tokens_per_step : int or None
        The cost model's prompt tokens per forward pass; ``None`` for no limit.
    trace_format : str
        The trace file's format (:data:`kvnumba.sim.traces.TRACE_FORMATS`); ``"auto"`` reads it
        from the file's first line.
    """

    trace: str
    limit: int | None
    blocks: int
    block_size: int
    prefix_caching: bool
    eviction: str
    max_batch: int
    step_ms: float
    max_seq_len: int
    max_prefill_tokens: int | None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    prefill_us_per_token: float = DEFAULT_COST.prefill_us_per_token
    decode_us_per_token: float = DEFAULT_COST.decode_us_per_token
    step_overhead_us: float = DEFAULT_COST.step_overhead_us
    prefill_tokens_per_step: int | None = DEFAULT_COST.prefill_tokens_per_step
    trace_format: str = field(default="auto", metadata={_KEY_OMITS: "auto"})

    @property
    def key(self) -> str:
        """The resume key: every field, as canonical JSON.

        Built from the dataclass's fields, not from a list kept beside them, so that a field
        added to the point (a new grid dimension) is part of the key without anyone
        remembering to add it: two points that differ in any field never share a key. A field
        added with a value that means "as before" declares it (``metadata``) and is left out
        at that value, so that rows written before the field existed keep their key.
        """
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if _KEY_OMITS not in f.metadata or getattr(self, f.name) != f.metadata[_KEY_OMITS]
        }
        return json.dumps(values, sort_keys=True, separators=(",", ":"))

    def sim_config(self) -> SimConfig:
        """The :class:`SimConfig` of this point."""
        return SimConfig(
            num_blocks=self.blocks,
            block_size=self.block_size,
            max_batch=self.max_batch,
            max_seq_len=self.max_seq_len,
            prefix_caching=self.prefix_caching,
            step_ms=self.step_ms,
            max_prefill_tokens=self.max_prefill_tokens,
            eviction=self.eviction,
            sliding_window=self.sliding_window,
            attention_chunk_size=self.attention_chunk_size,
            cost=self.cost,
        )

    @property
    def cost(self) -> CostModel:
        """The :class:`kvnumba.sim.cost.CostModel` of this point."""
        return CostModel(
            prefill_us_per_token=self.prefill_us_per_token,
            decode_us_per_token=self.decode_us_per_token,
            step_overhead_us=self.step_overhead_us,
            prefill_tokens_per_step=self.prefill_tokens_per_step,
        )


#: Fields that identify a simulation (the resume key) and lead every row, in this order: the
#: fields of :class:`SweepPoint`.
CONFIG_COLUMNS = tuple(f.name for f in fields(SweepPoint))


def resolve_trace(trace: str | os.PathLike) -> Path:
    """The file of a trace given by embedded name or path.

    Parameters
    ----------
    trace : str or path-like
        ``mooncake``, ``azure``, or a ``.jsonl`` / ``.csv`` file.

    Returns
    -------
    pathlib.Path
    """
    name = EMBEDDED_TRACES.get(str(trace))
    if name is not None:
        return default_trace_path().with_name(name)
    return Path(trace)


def _is_int(value) -> bool:
    # numpy integers count (a pool-size range is often built with numpy); bool is an int
    # subclass, but TOML's true is not a pool size.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _plain(value):
    """A Python int/float/bool for a numpy scalar, so that rows and keys serialize as JSON."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _values(name: str, values, check: Callable[[object], bool], what: str) -> list:
    """The distinct values of one grid dimension, in order; GridError if empty or invalid."""
    if isinstance(values, (str, bytes, os.PathLike)) or not isinstance(values, Iterable):
        values = [values]
    values = list(values)
    for v in values:
        if not check(v):
            raise GridError(f"{name} must be {what}, got {v!r}")
    values = list(dict.fromkeys(_plain(v) for v in values))  # a repeat: one simulation twice
    if not values:
        raise GridError(f"empty grid: no value for {name}")
    return values


def _positive_int(v) -> bool:
    return _is_int(v) and v >= 1


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or check(v)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _finite_positive(v) -> bool:
    real = isinstance(v, numbers.Real) and not isinstance(v, bool)
    return real and math.isfinite(v) and v > 0


def make_grid(
    traces: str | Sequence[str],
    *,
    blocks: int | Sequence[int | None] | None = None,
    block_sizes: int | Sequence[int] = 16,
    prefix_caching: bool | Sequence[bool] = True,
    eviction: str | Sequence[str] = "lru",
    max_batch: int | Sequence[int] = 256,
    step_ms: float | Sequence[float] = DEFAULT_STEP_MS,
    limit: int | None = None,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    max_prefill_tokens: int | None = None,
    sliding_window: int | None | Sequence[int | None] = None,
    attention_chunk_size: int | None | Sequence[int | None] = None,
    prefill_us_per_token: float = DEFAULT_COST.prefill_us_per_token,
    decode_us_per_token: float = DEFAULT_COST.decode_us_per_token,
    step_overhead_us: float = DEFAULT_COST.step_overhead_us,
    prefill_tokens_per_step: int | None = DEFAULT_COST.prefill_tokens_per_step,
    trace_format: str = "auto",
) -> list[SweepPoint]:
    """Validate a grid and list its points (trace-major, pool sizes innermost).

    Parameters
    ----------
    traces : str or sequence of str
        Embedded trace names (``mooncake``, ``azure``) or paths of trace files, whatever their
        suffix.
    blocks : int or sequence of int, optional
        Pool sizes in blocks; ``None`` (or a ``None`` entry) is the default pool of
        ``kvnumba simulate``, ``2**19`` tokens / block size.
    block_sizes, prefix_caching, eviction, max_batch, step_ms : scalar or sequence
        The other grid dimensions; a scalar is a one-value dimension. ``eviction`` takes names
        of :data:`kvnumba.eviction.SIMULATOR_POLICIES`.
    limit : int, optional
        Replay only the first ``limit`` requests of each trace.
    max_seq_len : int
        Longest sequence (not a grid dimension).
    max_prefill_tokens : int, optional
        Prompt tokens offered to one ``admit`` call (not a grid dimension).
    sliding_window, attention_chunk_size : int or None, or a sequence of them
        Grid dimensions of the attention kind (``docs/windows.md``): ``None`` (or a ``None``
        entry) is full attention. A manager serves one kind, so a combination of a sliding
        window with a chunk size is no point of the grid (``[None, 1024]`` x ``[None, 8192]``
        is three points: full, sliding, chunked).
    prefill_us_per_token, decode_us_per_token, step_overhead_us : float
        The cost model's profile (:class:`kvnumba.sim.cost.CostModel`, finite and >= 0; not
        grid dimensions): what the modeled TTFT and TPOT of every row assume.
    prefill_tokens_per_step : int or None
        The cost model's prompt tokens per forward pass (>= 1; ``None`` for no limit).
    trace_format : str
        The format of the trace files given by path (one of
        :data:`kvnumba.sim.traces.TRACE_FORMATS`, not a grid dimension); ``"auto"`` (the
        default) reads each file's format from its first line. Embedded traces are always
        read in their own format.

    Returns
    -------
    list of SweepPoint
        Distinct points; duplicate values of a dimension are dropped.

    Raises
    ------
    GridError
        A ``ValueError``: on an empty dimension, an unknown trace (not embedded and no such
        file), an unknown trace format, or a bad value (block size 0,
        non-finite step, unknown eviction policy, a chunk size that is not a multiple of a
        block size, ...). The message names the dimension and the value.
    """
    names = _values("traces", traces, lambda v: isinstance(v, (str, os.PathLike)), "names")
    if trace_format not in TRACE_FORMATS:
        raise GridError(
            f"trace_format must be one of {', '.join(TRACE_FORMATS)}, got {trace_format!r}"
        )
    trace_ids = []  # (trace, its format)
    for t in names:
        path = resolve_trace(t)
        if str(t) in EMBEDDED_TRACES:
            trace_ids.append((str(t), "auto"))
            continue
        if not path.is_file():
            raise GridError(
                f"unknown trace {str(t)!r}: not an embedded trace "
                f"({', '.join(EMBEDDED_TRACES)}) and no such file"
            )
        trace_ids.append((str(path.resolve()), trace_format))
    sizes = _values("block_size", block_sizes, _positive_int, "an integer >= 1")
    pools = _values("blocks", blocks, _optional(_positive_int), "an integer >= 1")
    caching = _values(
        "prefix_caching", prefix_caching, lambda v: isinstance(v, (bool, np.bool_)), "a bool"
    )
    policies = _values(
        "eviction",
        eviction,
        lambda v: isinstance(v, str) and is_valid_policy(v),
        f"one of {', '.join(SIMULATOR_POLICIES)} or 'module:attribute' naming a PriorityPolicy",
    )
    windows = _values(
        "sliding_window", sliding_window, _optional(_positive_int), "an integer >= 1 or None"
    )
    chunks = _values(
        "attention_chunk_size",
        attention_chunk_size,
        _optional(_positive_int),
        "an integer >= 1 or None",
    )
    for bs in sizes:
        for c in chunks:
            if c is not None and c % bs:
                raise GridError(
                    f"attention_chunk_size must be a multiple of the block size, got {c} with "
                    f"block_size {bs}"
                )
    kinds = [(w, c) for w in windows for c in chunks if w is None or c is None]
    if not kinds:
        raise GridError(
            "empty grid: every point sets both sliding_window and attention_chunk_size (a "
            "manager serves one attention kind; give None among the values of one of them)"
        )
    batches = _values("max_batch", max_batch, _positive_int, "an integer >= 1")
    steps = _values("step_ms", step_ms, _finite_positive, "a finite number > 0")
    scalars = {}
    for name, value, check in (
        ("limit", limit, _optional(_positive_int)),
        ("max_seq_len", max_seq_len, _positive_int),
        ("max_prefill_tokens", max_prefill_tokens, _optional(_positive_int)),
    ):
        if not check(value):
            raise GridError(f"{name} must be an integer >= 1, got {value!r}")
        scalars[name] = _plain(value)
    for name, number in (
        ("prefill_us_per_token", prefill_us_per_token),
        ("decode_us_per_token", decode_us_per_token),
        ("step_overhead_us", step_overhead_us),
    ):
        if not (_is_real(number) and math.isfinite(number) and number >= 0):
            raise GridError(f"{name} must be a finite number >= 0, got {number!r}")
        scalars[name] = float(number)
    if not _optional(_positive_int)(prefill_tokens_per_step):
        raise GridError(
            f"prefill_tokens_per_step must be an integer >= 1 or None, got "
            f"{prefill_tokens_per_step!r}"
        )
    scalars["prefill_tokens_per_step"] = _plain(prefill_tokens_per_step)
    points: dict[str, SweepPoint] = {}
    for (trace, fmt), bs, pc, mb, st, ev, (sw, ch), nb in itertools.product(
        trace_ids, sizes, caching, batches, steps, policies, kinds, pools
    ):
        p = SweepPoint(
            trace=trace,
            trace_format=fmt,
            blocks=nb if nb is not None else max(1, DEFAULT_POOL_TOKENS // bs),
            block_size=bs,
            prefix_caching=pc,
            eviction=ev,
            max_batch=mb,
            step_ms=float(st),
            sliding_window=sw,
            attention_chunk_size=ch,
            **scalars,
        )
        points.setdefault(p.key, p)  # None and the default pool are one point
    return list(points.values())


def check_traces(points: Sequence[SweepPoint]) -> None:
    """Parse every trace of a grid once, in this process, before any task starts.

    Parameters
    ----------
    points : sequence of SweepPoint

    Raises
    ------
    GridError
        A ``ValueError``: a trace cannot be read, is malformed (the message names the file and
        line), holds no requests, or has no ``hash_ids`` while the grid runs it under a policy
        that needs them (``oracle``).
    """
    hindsight = {(p.trace, p.limit) for p in points if needs_future(p.eviction)}
    for trace, limit, fmt in dict.fromkeys((p.trace, p.limit, p.trace_format) for p in points):
        try:
            requests = _load(trace, limit, fmt)
        except (OSError, ValueError) as exc:  # a malformed line's message names file and line
            raise GridError(f"cannot read trace {trace!r}: {exc}") from None
        if not requests:
            raise GridError(f"trace {trace!r} holds no requests")
        if (trace, limit) in hindsight and any(r.hash_ids is None for r in requests):
            policies = sorted({p.eviction for p in points if needs_future(p.eviction)})
            raise GridError(
                f"eviction {', '.join(policies)} needs a trace with hash_ids (Mooncake .jsonl) "
                f"to know when each block is used again; trace {trace!r} has none"
            )


def warm_kernels(policy: bool = False) -> None:
    """Compile every kernel in this process, or load it from the numba cache.

    Called in the client before a sweep submits any task, so that workers sharing the cache
    directory load the kernels instead of each compiling them at once on a busy machine.

    Parameters
    ----------
    policy : bool
        Also the kernels' extended versions (a grid with a policy other than LRU, or a
        window).
    """
    from kvnumba.kernels import LRU, POLICY, prepare

    prepare(LRU, stream=sys.stderr)  # says so on stderr if it must compile
    if policy:
        prepare(POLICY, stream=sys.stderr, policy=True)


# Per worker process: the first task that needs a trace (or its block keys) parses it, the
# later tasks of that worker reuse it. Small caches: a sweep touches few traces at a time.
@functools.lru_cache(maxsize=4)
def _load(trace: str, limit: int | None, fmt: str) -> list[Request]:
    return load_trace(resolve_trace(trace), limit=limit, fmt=fmt)


@functools.lru_cache(maxsize=4)
def _keys(trace: str, limit: int | None, fmt: str, block_size: int) -> BlockKeys | None:
    return block_keys(_load(trace, limit, fmt), block_size)


def _adopt_cache_dir(cache_dir: str | None) -> None:
    """Use the client's numba cache directory in this worker, when it can see it.

    A worker started with its own ``NUMBA_CACHE_DIR`` keeps it; one on another machine (the
    directory does not exist there) keeps numba's default and compiles on its first task.
    """
    if not cache_dir or os.environ.get("NUMBA_CACHE_DIR") or not os.path.isdir(cache_dir):
        return
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    if "numba" in sys.modules:  # numba reads the variable once, at import
        from numba.core import config

        config.reload_config()


def run_point(point: SweepPoint, cache_dir: str | None = None) -> dict:
    """Run one simulation of a sweep (the Dask task) and return its row.

    Parameters
    ----------
    point : SweepPoint
        What to simulate.
    cache_dir : str, optional
        The client's ``NUMBA_CACHE_DIR``, adopted by a worker that has none of its own.

    Returns
    -------
    dict
        The config columns, the ``results`` fields of ``kvnumba simulate --json`` (``wall_s``
        is this task's wall time: trace, pool, replay and report), and ``key``.
    """
    t0 = time.perf_counter()
    _adopt_cache_dir(cache_dir)
    requests = _load(point.trace, point.limit, point.trace_format)
    config = point.sim_config()
    keys = _keys(point.trace, point.limit, point.trace_format, point.block_size)
    result = simulate(requests, config, keys=keys)
    results = result_fields(result, requests, config, keys)
    results["wall_s"] = round(time.perf_counter() - t0, 2)
    return {**asdict(point), **results, "key": point.key}


class ResultStore:
    """The output folder of a sweep: ``results.jsonl`` (the record) and ``results.csv``.

    Parameters
    ----------
    folder : str or path-like
        Created if missing.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.jsonl = self.folder / RESULTS_JSONL
        self.csv = self.folder / RESULTS_CSV
        self._columns: list[str] = []

    def load(self) -> dict[str, dict]:
        """Read the rows already written, keyed by ``key``, and make the CSV match them.

        A last line cut short (the process was killed while writing it) is dropped; any other
        line that is not a row is an error, since it would be data lost.

        Returns
        -------
        dict of str to dict

        Raises
        ------
        ValueError
            ``results.jsonl`` holds a line that is not a result row.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        rows: dict[str, dict] = {}
        if self.jsonl.exists():
            lines = self.jsonl.read_text(encoding="utf-8").splitlines()
            for lineno, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = row["key"]
                except (ValueError, TypeError, KeyError):
                    if lineno == len(lines):
                        continue  # the write of the last row was interrupted
                    raise ValueError(
                        f"{self.jsonl}: line {lineno} is not a sweep result row; move the "
                        "file away to start afresh"
                    ) from None
                rows[key] = row
        # Rewrite both files from the rows read: drops a cut-short last line, and makes the CSV
        # (written second, so possibly one row behind after a kill) match the record.
        self._rewrite(list(rows.values()))
        return rows

    def append(self, row: dict) -> None:
        """Append one row to both files, flushed at once.

        Parameters
        ----------
        row : dict
            A :func:`run_point` row.
        """
        with self.jsonl.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if any(k not in self._columns for k in row):
            # A row with a field the CSV lacks (an older sweep's file): rewrite it whole.
            self._rewrite([*self._read_jsonl_rows()])
            return
        with self.csv.open("a", encoding="utf-8", newline="") as fh:
            csv.DictWriter(fh, self._columns, restval="").writerow(row)

    def _read_jsonl_rows(self) -> list[dict]:
        text = self.jsonl.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _rewrite(self, rows: list[dict]) -> None:
        columns: dict[str, None] = {}
        for row in rows:
            columns.update(dict.fromkeys(row))
        self._columns = list(columns)
        for path, write in ((self.jsonl, self._write_jsonl), (self.csv, self._write_csv)):
            tmp = path.with_name(path.name + ".tmp")
            with tmp.open("w", encoding="utf-8", newline="") as fh:
                write(fh, rows)
            os.replace(tmp, path)  # atomic: an interrupted rewrite leaves the old file

    @staticmethod
    def _write_jsonl(fh, rows):
        for row in rows:
            fh.write(json.dumps(row) + "\n")

    def _write_csv(self, fh, rows):
        writer = csv.DictWriter(fh, self._columns, restval="")
        if self._columns:
            writer.writeheader()
        writer.writerows(rows)


@dataclass
class SweepResult:
    """Outcome of :func:`sweep`.

    Attributes
    ----------
    rows : list of dict
        One row per grid point that has a result (finished now or before), in grid order.
    ran : int
        Simulations run by this call.
    skipped : int
        Grid points already in the output folder, not re-run.
    failed : list of (SweepPoint, str)
        Points whose task raised, with the error; they have no row and are retried next time.
    workers : int
        Dask workers that ran the tasks (0 when nothing had to run).
    elapsed_s : float
        Wall time of the call.
    """

    rows: list[dict]
    ran: int
    skipped: int
    failed: list = field(default_factory=list)
    workers: int = 0
    elapsed_s: float = 0.0


@contextlib.contextmanager
def _dask_client(scheduler, n_workers: int | None, cache_dir: str | None):
    """A ``distributed.Client``: the given one, one connected to an address, or a LocalCluster."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError("kvnumba sweep runs on Dask: pip install 'kvnumba[sweep]'") from None
    import dask

    if isinstance(scheduler, Client):
        yield scheduler
        return
    if scheduler is not None:
        with Client(scheduler) as client:
            yield client
        return
    import logging

    env = {"NUMBA_CACHE_DIR": cache_dir} if cache_dir else {}
    # The workers inherit this configuration (each nanny passes it on).
    with _sigint_ignored(), dask.config.set(QUIET_WORKERS):
        cluster = LocalCluster(
            n_workers=n_workers or os.cpu_count() or 1,
            threads_per_worker=1,  # one simulation per process: they hold the GIL
            processes=True,
            # Any free port for the scheduler's HTTP server: 8787 may be taken by another
            # cluster, and distributed then warns on stderr.
            dashboard_address=":0",
            # CRITICAL: a worker whose scheduler stops first (Ctrl-C on a loaded machine) logs a
            # heartbeat ERROR with a traceback; a simulation's own failure reaches the sweep
            # through its future, not through the log.
            silence_logs=logging.CRITICAL,
            env=env,
        )
    with cluster, Client(cluster) as client:
        yield client


@contextlib.contextmanager
def _sigint_ignored():
    """Ignore SIGINT in this process for a while, so that processes it starts ignore it too.

    Ctrl-C in a terminal signals the whole foreground process group, local workers included.
    A worker killed by it mid-task makes its nanny log tracebacks; only the client should
    react: it stops collecting, cancels the tasks and closes the cluster. An ignored signal
    stays ignored across ``exec``, and Python then installs no handler of its own.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def sweep(
    traces: str | Sequence[str],
    *,
    out: str | os.PathLike | None = None,
    scheduler=None,
    n_workers: int | None = None,
    progress: bool | None = None,
    on_row: Callable[[dict], object] | None = None,
    **grid: Unpack[GridOptions],
) -> SweepResult:
    """Run every simulation of a grid as a Dask task and collect one row per simulation.

    Parameters
    ----------
    traces : str or sequence of str
        Embedded trace names or trace files, as :func:`make_grid` takes them.
    out : str or path-like, optional
        Output folder: rows are appended to ``results.jsonl`` and ``results.csv`` as each task
        finishes, and points already there are skipped (resume). ``None`` keeps rows in memory.
    scheduler : str or distributed.Client, optional
        A running cluster: its scheduler's address (``tcp://host:8786``) or a client. Default:
        a :class:`distributed.LocalCluster` of ``n_workers`` single-threaded processes, closed
        at the end.
    n_workers : int, optional
        Workers of the local cluster; default ``os.cpu_count()``.
    progress : bool, optional
        Show a tqdm bar over tasks: ``None`` (default) when stderr is a terminal.
    on_row : callable, optional
        Called with each new row once it is written (an exception raised there, such as
        ``KeyboardInterrupt``, stops the sweep; the rows written so far stay).
    **grid
        The grid, the cost profile and the trace files' format: the keywords of
        :func:`make_grid` (:class:`GridOptions`), with its defaults.

    Returns
    -------
    SweepResult

    Raises
    ------
    GridError
        A ``ValueError``: a bad grid (see :func:`make_grid`) or an unreadable trace, raised
        before any task starts.
    ValueError
        ``results.jsonl`` in ``out`` holds a line that is not a row.
    ImportError
        ``distributed`` is not installed (``pip install 'kvnumba[sweep]'``).
    """
    t0 = time.perf_counter()
    points = make_grid(traces, **grid)
    check_traces(points)
    store = ResultStore(out) if out is not None else None
    done = store.load() if store is not None else {}
    todo = [p for p in points if p.key not in done]
    skipped = len(points) - len(todo)
    failed: list = []
    workers = ran = 0
    if todo:
        # Before the cluster starts: compiling wants both cores.
        warm_kernels(
            policy=any(
                p.eviction != "lru" or p.sliding_window or p.attention_chunk_size for p in todo
            )
        )
        cache_dir = os.environ.get("NUMBA_CACHE_DIR")
        with _dask_client(scheduler, n_workers, cache_dir) as client:
            from distributed import as_completed

            workers = len(client.scheduler_info().get("workers", {}))
            futures = client.map(run_point, todo, cache_dir=cache_dir, pure=False)
            point_of = dict(zip((f.key for f in futures), todo, strict=True))
            disable = None if progress is None else not progress
            try:
                with progress_bar(len(todo), "sim", "sweep", disable=disable) as bar:
                    for future in as_completed(futures):
                        try:
                            row = future.result()
                        except Exception as exc:  # one bad point does not stop the sweep
                            failed.append((point_of[future.key], f"{type(exc).__name__}: {exc}"))
                            bar.update()
                            continue
                        if store is not None:
                            store.append(row)
                        done[row["key"]] = row
                        ran += 1
                        bar.update()
                        if on_row is not None:
                            on_row(row)
            finally:
                # Interrupted or not: tasks not yet run must not go on in a shared cluster.
                client.cancel([f for f in futures if not f.done()])
    return SweepResult(
        rows=[done[p.key] for p in points if p.key in done],
        ran=ran,
        skipped=skipped,
        failed=failed,
        workers=workers,
        elapsed_s=time.perf_counter() - t0,
    )
