"""Trace-driven serving simulation on top of the block manager (``kvnumba simulate``).

* :mod:`kvnumba.sim.traces` parses the Mooncake JSONL and Azure CSV traces into lazy
  :class:`Request` records;
* :mod:`kvnumba.sim.scheduler` replays them with continuous batching and preemption;
* :mod:`kvnumba.sim.cli` is the command line.
"""

from kvnumba.sim.scheduler import SimConfig, SimResult, Simulator, simulate
from kvnumba.sim.traces import Request, load_azure, load_mooncake, load_trace

__all__ = [
    "Request",
    "SimConfig",
    "SimResult",
    "Simulator",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "simulate",
]
