"""The ``kvnumba bench`` command: the standard workloads, their replay, and the report.

- :mod:`kvnumba.bench.workloads` generates the workloads of ``docs/workloads.md`` as
  batched operations (compact numpy arrays, one batched call per operation kind per step);
- :mod:`kvnumba.bench.runner` replays a workload against a manager class and times only the
  allocator calls;
- :mod:`kvnumba.bench.cli` compares :class:`kvnumba.BlockManager` with
  :class:`kvnumba.reference.ReferenceBlockManager` and prints the table.
"""
