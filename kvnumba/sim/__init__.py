"""Trace-driven serving simulation on top of the block manager.

* :mod:`kvnumba.sim.traces` parses the Mooncake JSONL and Azure CSV traces into lazy
  :class:`Request` records;
* :mod:`kvnumba.sim.scheduler` replays them with continuous batching and preemption
  (:func:`compare_window`: a windowed config and the same without its window);
* :mod:`kvnumba.sim.cost` times the replay's steps with a cost model (:class:`CostModel`; the
  default profile :data:`DEFAULT_COST` is an assumption): prompt tokens computed, modeled TTFT
  and TPOT, what a hit is worth;
* :mod:`kvnumba.sim.ideal` computes a trace's ideal prefix hit rate (an unbounded pool);
* :mod:`kvnumba.sim.hindsight` gives the ``oracle`` eviction policy each block's next use;
* :mod:`kvnumba.sim.unreachable` counts the cached blocks no prompt can hit any more;
* :mod:`kvnumba.sim.report` builds the reported fields, the hint and the plots;
* :mod:`kvnumba.sim.sweeps` runs grids of simulations on Dask (:func:`sweep`);
* :mod:`kvnumba.sim.cli` and :mod:`kvnumba.sim.sweep_cli` are ``kvnumba simulate`` and
  ``kvnumba sweep``.

:func:`sweep` needs the ``sweep`` extra (``distributed``), imported only when a sweep runs, so
``import kvnumba.sim`` loads neither Dask nor numba.
"""

from kvnumba.sim.cost import DEFAULT_COST, CostModel
from kvnumba.sim.ideal import ideal_prefix_hit_rate
from kvnumba.sim.scheduler import SimConfig, SimResult, Simulator, compare_window, simulate
from kvnumba.sim.sweeps import SweepResult, sweep
from kvnumba.sim.traces import Request, load_azure, load_mooncake, load_trace

__all__ = [
    "DEFAULT_COST",
    "CostModel",
    "Request",
    "SimConfig",
    "SimResult",
    "Simulator",
    "SweepResult",
    "compare_window",
    "ideal_prefix_hit_rate",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "simulate",
    "sweep",
]
