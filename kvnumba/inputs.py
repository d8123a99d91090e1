"""Turning user input into the contiguous int64 arrays the kernels take."""

from __future__ import annotations

import numbers
import operator
import os

import numpy as np

#: An empty token vector (a call without token ids) and an empty key array (no engine keys).
NO_TOKENS = np.empty(0, dtype=np.int64)
NO_KEYS = np.empty((0, 4), dtype=np.uint64)
#: ``max_hit_blocks`` of a call without a cap.
CAP_NONE = np.iinfo(np.int64).max
#: dtypes tested by identity on the engine path (numpy keeps one descriptor of each).
INT64 = np.dtype(np.int64)
UINT64 = np.dtype(np.uint64)
_INT64_MAX = np.iinfo(np.int64).max
_UINT64_LIMIT = 1 << 64


def index_array(value, name: str) -> np.ndarray:
    """A 1-D C-contiguous int64 array from any 1-D integer array-like.

    Raises
    ------
    TypeError
        For float, bool, object or other non-integer input (Python ints beyond int64 make an
        object array and land here too), and for ``str``, ``bytes`` and ``bytearray``.
    ValueError
        For input that is not one-dimensional or does not fit in int64.
    """
    if type(value) is np.ndarray and value.dtype == np.int64 and value.ndim == 1:
        # The hot path: already what the kernels take.
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)
    # bytes and bytearray would pass as uint8 arrays: b"\x05" is not the token 5.
    if isinstance(value, (str, bytes, bytearray)) or np.isscalar(value):
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


def key_rows(value, name: str = "keys") -> np.ndarray:
    """A C-contiguous ``uint64[K, 4]`` array of engine block keys from an integer array-like.

    An ndarray of unsigned integers is taken as it is, one of signed integers if no entry is
    negative. Other input (lists, object arrays) may hold Python ints up to ``2**64 - 1``: a
    vLLM sha256 block hash is ``np.frombuffer(h, np.uint64)``, and its words often exceed int64.
    An empty list or tuple is zero keys.

    Raises
    ------
    TypeError
        For float, bool, string or other non-integer entries, and for a scalar.
    ValueError
        For a shape other than ``(K, 4)``, or an entry below 0 or beyond ``2**64 - 1``.
    """
    if type(value) is np.ndarray and value.dtype == np.uint64 and value.ndim == 2:
        array = value  # the hot path; the shape is still checked below
    elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        if value.dtype.kind == "i" and value.size and value.min() < 0:
            raise ValueError(f"{name} must be non-negative (uint64 words)")
        array = value
    elif isinstance(value, np.ndarray) and value.dtype.kind != "O":
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
    else:
        if isinstance(value, (str, bytes, bytearray)) or np.isscalar(value) or value is None:
            raise TypeError(f"{name} must be a [K, 4] array-like of integers")
        if isinstance(value, (list, tuple)) and len(value) == 0:
            return np.empty((0, 4), dtype=np.uint64)
        # Python ints of any size survive in an object array; numpy alone would turn a list with
        # a word beyond int64 into float64.
        array = np.array(value, dtype=object)
        if array.ndim != 2 or array.shape[1] != 4:  # ragged rows make a 1-D array of lists
            raise ValueError(f"{name} must have shape [K, 4], got {array.shape}")
        for entry in array.flat:
            if isinstance(entry, (bool, np.bool_)) or not isinstance(entry, numbers.Integral):
                raise TypeError(f"{name} must hold integers, got {type(entry).__name__}")
            if not 0 <= int(entry) < _UINT64_LIMIT:
                raise ValueError(f"{name} holds {int(entry)}, outside the uint64 range")
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{name} must have shape [K, 4], got {array.shape}")
    if array.dtype == object:
        return np.array([[int(w) for w in row] for row in array], dtype=np.uint64).reshape(-1, 4)
    return np.ascontiguousarray(array, dtype=np.uint64)


def hit_caps(value, count: int, name: str = "max_hit_blocks") -> np.ndarray | None:
    """Per-prompt caps on cache hits: ``None`` (no cap), one int for all, or one per prompt.

    Returns ``None`` or an int64 array of ``count`` caps, each ``>= 0``.

    Raises
    ------
    TypeError
        For a bool, float or other non-integer cap.
    ValueError
        For a negative cap, or an array whose length is not ``count``.
    """
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        caps = np.full(count, int(value), dtype=np.int64)
    elif isinstance(value, (bool, np.bool_, float, np.floating)):
        raise TypeError(f"{name} must be an integer or a 1-D integer array-like, got {value!r}")
    else:
        caps = index_array(value, name)
        if len(caps) != count:
            raise ValueError(f"{name} has {len(caps)} entries for {count} prompts")
    if caps.size and caps.min() < 0:
        i = int(np.argmin(caps))
        raise ValueError(f"{name}[{i}] = {int(caps[i])} is negative")
    return caps


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


def memory_limits() -> list[tuple[int, str]]:
    """The bounds on the memory this process may still allocate, as ``(bytes, what)`` pairs.

    Physical memory, and the room left under the address-space limit (``RLIMIT_AS``) where one
    is set. Either is left out where the platform cannot tell.
    """
    limits = []
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        physical = -1
    if physical > 0:
        limits.append((physical, "physical memory"))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        soft = -1
    if soft >= 0 and soft != getattr(resource, "RLIM_INFINITY", -1):
        # The limit counts the address space already in use (numba maps a lot of it).
        used = 0
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):  # pragma: no cover - no procfs
            pass
        limits.append((max(soft - used, 0), "room left under the address-space limit (RLIMIT_AS)"))
    return limits


def check_state_bytes(needed: int, what: str, max_state_bytes: int | None = None) -> None:
    """Raise ``InvalidGeometry`` if ``needed`` bytes exceed what this process may allocate.

    Called by constructors before they allocate, so an absurd geometry fails with the number of
    bytes instead of ending the process (OOM) or failing inside numpy.

    Parameters
    ----------
    needed : int
        Bytes the constructor would allocate (a Python int: no overflow).
    what : str
        What the bytes are for, for the message.
    max_state_bytes : int, optional
        An explicit bound of the caller, checked first.
    """
    from kvnumba.errors import InvalidGeometry

    limits = memory_limits()
    if max_state_bytes is not None:
        limits.insert(0, (max_state_bytes, "max_state_bytes"))
    for limit, name in limits:
        if needed > limit:
            raise InvalidGeometry(
                f"{what} needs {needed} bytes of state, more than the {limit} bytes of {name}"
            )


def switch(value, name: str) -> bool:
    """A keyword switch: ``True``/``False`` (numpy booleans too), ``TypeError`` otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def int64_vector(value, name: str) -> np.ndarray:
    """:func:`index_array`, with a C-contiguous 1-D int64 array passed through untouched."""
    if type(value) is np.ndarray and value.dtype == np.int64 and value.flags.c_contiguous:
        if value.ndim == 1:
            return value
    return index_array(value, name)


def count_arg(value, name: str, minimum: int) -> int:
    """An integer count of at least ``minimum`` (``TypeError`` for a bool, ``ValueError``
    below the minimum)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not a bool")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def prompt_arrays(tokens, lengths, salts, groups: int = 1) -> tuple[np.ndarray, ...]:
    """The token, length and salt vectors of an ``admit`` or ``lookup`` (salts default to 0).

    ``tokens`` may be None (an empty vector). Raises ``ValueError`` for salts of another
    length than ``lengths``, or (a manager of ``groups`` KV cache groups, which keeps
    ``salt * groups + group`` per sequence) a salt whose product would not fit in int64.
    """
    tokens_in = NO_TOKENS if tokens is None else index_array(tokens, "tokens")
    lengths = index_array(lengths, "lengths")
    if salts is None:
        salts = np.zeros(lengths.shape[0], dtype=np.int64)
    else:
        salts = index_array(salts, "salts")
        if salts.shape != lengths.shape:
            raise ValueError(f"salts has {salts.shape[0]} entries for {lengths.shape[0]} prompts")
        if groups > 1 and salts.shape[0]:
            low, high = -(2**63 // groups), (2**63 - groups) // groups
            if salts.min() < low or salts.max() > high:
                raise ValueError(
                    f"salts of a manager of {groups} KV cache groups must lie in [{low}, {high}]"
                )
    return tokens_in, lengths, salts
