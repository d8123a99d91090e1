"""The ``@njit(cache=True)`` kernels, one module per concern.

Entry points (called by the facade) take the state arrays in ``STATE_FIELDS`` order followed by
the scratch arrays in ``SCRATCH_FIELDS`` order (see :mod:`kvnumba._state`); helpers take only the
arrays they touch. Kernels never raise: they return a status code from :mod:`kvnumba.errors`.
"""
