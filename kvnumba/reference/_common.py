"""Constants and small helpers of the pure-Python model: hashing, input validation, sizes.

Also the names of the state a call snapshots and restores (``_STATE``, ``_PAGE_STATE``) and of
the counters (``_COUNTERS``).
"""

from __future__ import annotations

import numbers

import numpy as np

from kvnumba.errors import PoolExhausted

_MASK64 = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1
#: Chained-hash seed of a sequence's first block (any constant; only the model uses it).
ROOT_HASH = 0x9E3779B97F4A7C15
_COUNTERS = ("allocations", "evictions", "cow_copies", "prefix_queries", "prefix_hits")
# Attributes saved (shallow copies) and restored around an atomic multi-prompt admit.
_STATE = (
    "_ref",
    "_tokens",
    "_key",
    "_hash",
    "_prefix",
    "_twins",  # tuples, replaced rather than mutated, so a shallow copy is a snapshot
    "_lru",
    "_free",
    "_gen",
    "_live",
    "_table",
    "_len",
    "_salt",
    "_anchor",  # windowed attention: the parent hash across each sequence's gap
    "_trimmed",
    "_unknown",
    "_slots",
    "_counters",
    "_events",
    "_policy",  # the eviction policy's state: a dataclass with its own copy()
)
# Page state of a manager on a page pool, saved with deep copies (the lists inside are mutated).
_PAGE_STATE = ("_unmapped", "_phys", "_page_free", "_buckets", "_cache_only")


def _hash64(key: tuple) -> int:
    """Deterministic 64-bit hash of a prefix-cache key (ints and tuples hash reproducibly)."""
    return hash(key) & _MASK64


def _as_int(value, name: str) -> int:
    """Return ``value`` as a Python int; bools and non-integers raise ``TypeError``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


def _as_int_array(values, name: str) -> np.ndarray:
    """Validate a 1-D integer array-like and return it as an int64 array.

    An empty list or tuple is accepted whatever dtype numpy infers for it; an empty ndarray
    must still have an integer dtype.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {arr.ndim} dimensions")
    if arr.dtype == np.bool_:
        raise TypeError(f"{name} must hold integers, got bool")
    if arr.size == 0 and not isinstance(values, np.ndarray):
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds values beyond the int64 range")
    return arr.astype(np.int64)


def _exhausted(needed: int, available: int, shortfall: int) -> PoolExhausted:
    """``PoolExhausted(needed, available)`` that also carries the blocks the call lacked."""
    error = PoolExhausted(needed, available)
    error.shortfall = shortfall  # type: ignore[attr-defined]  # the model's own note
    return error


def _blocks_for(length: int, block_size: int) -> int:
    """Blocks needed to hold ``length`` tokens."""
    return -(-length // block_size)
