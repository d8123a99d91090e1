"""kvnumba: a Numba-jitted paged KV-cache block manager.

The allocator state is a set of flat numpy arrays; every block operation is an
``@njit(cache=True)`` kernel over them; :class:`BlockManager` is the thin facade that validates
input, calls the kernels, raises typed errors and delivers callbacks.

``BlockManager`` and ``PagePool`` are imported lazily, so ``import kvnumba.reference`` (the
pure-Python model) does not load numba.
"""

from __future__ import annotations

from kvnumba._layout import NULL_BLOCK
from kvnumba.errors import (
    CallbackError,
    InvalidGeometry,
    InvalidPosition,
    InvalidSequence,
    InvariantViolation,
    KVNumbaError,
    PoolExhausted,
    SequenceReleased,
    SequenceTooLong,
    TooManySequences,
)
from kvnumba.eviction import EVICTION_POLICIES
from kvnumba.results import AdmitResult, AppendResult, BlockEvents, LookupResult, Stats
from kvnumba.windows import KVCacheGroup

__version__ = "0.1.0"

_LAZY = {
    "BlockManager": "kvnumba.manager",
    "Sequence": "kvnumba.sequence",
    "PagePool": "kvnumba.pages.pool",
}

__all__ = [
    "AdmitResult",
    "AppendResult",
    "BlockEvents",
    "BlockManager",
    "CallbackError",
    "EVICTION_POLICIES",
    "InvalidGeometry",
    "InvalidPosition",
    "InvalidSequence",
    "InvariantViolation",
    "KVCacheGroup",
    "KVNumbaError",
    "LookupResult",
    "NULL_BLOCK",
    "PagePool",
    "PoolExhausted",
    "Sequence",
    "SequenceReleased",
    "SequenceTooLong",
    "Stats",
    "TooManySequences",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvnumba' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
