"""Turning user input into the contiguous int64 arrays the kernels take."""

from __future__ import annotations

import operator

import numpy as np

_INT64_MAX = np.iinfo(np.int64).max


def index_array(value, name: str) -> np.ndarray:
    """A 1-D C-contiguous int64 array from any 1-D integer array-like.

    Raises
    ------
    TypeError
        For float, bool, object or other non-integer input (Python ints beyond int64 make an
        object array and land here too).
    ValueError
        For input that is not one-dimensional or does not fit in int64.
    """
    if type(value) is np.ndarray and value.dtype == np.int64 and value.ndim == 1:
        # The hot path: already what the kernels take.
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)
    if isinstance(value, (str, bytes)) or np.isscalar(value):
        raise TypeError(f"{name} must be a 1-D array-like of integers, got {type(value).__name__}")
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0 and not isinstance(value, np.ndarray):
        return np.empty(0, dtype=np.int64)  # [] and () carry no dtype of their own
    kind = array.dtype.kind
    if kind == "u":
        if array.size and array.max() > _INT64_MAX:
            raise ValueError(f"{name} holds values beyond int64")
    elif kind != "i":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def positive_int(value, name: str, error=ValueError) -> int:
    """``value`` as an int >= 1; ``error`` for anything else (bool and float are refused)."""
    if isinstance(value, bool):
        raise error(f"{name} must be a positive integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise error(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise error(f"{name} must be a positive integer, got {number}")
    return number
