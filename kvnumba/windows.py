"""Windowed attention (sliding window, chunked local) and KV cache groups: the rules that decide
which blocks a sequence still needs and which prefix of a prompt a manager may reuse.

The functions here are plain Python over integers and integer sequences, so the reference
model calls them as they are and the kernels compile them (``kvnumba._kernels.windows``): one
statement of each rule. ``docs/windows.md`` states the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvnumba._layout import MAX_GROUPS, NULL_BLOCK
from kvnumba.errors import InvalidGeometry

__all__ = [
    "MAX_GROUPS",
    "NULL_BLOCK",
    "KVCacheGroup",
    "first_needed_block",
    "group_geometry",
    "group_hit",
    "window_geometry",
    "window_hit",
]


@dataclass(frozen=True)
class KVCacheGroup:
    """The attention kind of one KV cache group of a model (``BlockManager(kv_cache_groups=)``).

    Parameters
    ----------
    sliding_window : int, optional
        Sliding-window attention of ``W`` tokens.
    attention_chunk_size : int, optional
        Chunked local attention with chunks of ``C`` tokens (a multiple of the block size).
        Neither set: full attention.
    """

    sliding_window: int | None = None
    attention_chunk_size: int | None = None


def group_geometry(kv_cache_groups, block_size: int) -> tuple[tuple[int, int], ...]:
    """Validate a manager's KV cache groups; returns each group's ``(window, chunk)``.

    Parameters
    ----------
    kv_cache_groups : sequence of KVCacheGroup
        One to ``MAX_GROUPS`` groups.
    block_size : int
        The manager's block size.

    Raises
    ------
    InvalidGeometry
        No group, more than ``MAX_GROUPS``, or a group :func:`window_geometry` refuses.
    TypeError
        Not a sequence of :class:`KVCacheGroup`.
    """
    if isinstance(kv_cache_groups, (str, bytes)) or not hasattr(kv_cache_groups, "__len__"):
        raise TypeError("kv_cache_groups must be a sequence of KVCacheGroup")
    groups = []
    for group in kv_cache_groups:
        if not isinstance(group, KVCacheGroup):
            raise TypeError(f"kv_cache_groups holds {type(group).__name__}, not KVCacheGroup")
        groups.append(window_geometry(group.sliding_window, group.attention_chunk_size, block_size))
    if not 1 <= len(groups) <= MAX_GROUPS:
        raise InvalidGeometry(
            f"kv_cache_groups must hold 1 to {MAX_GROUPS} groups, got {len(groups)}"
        )
    return tuple(groups)


def window_geometry(sliding_window, attention_chunk_size, block_size: int) -> tuple[int, int]:
    """Validate a manager's attention kind; returns ``(window, chunk)`` in tokens, 0 for unset.

    Parameters
    ----------
    sliding_window : int or None
        Tokens a token attends to, itself included (``W >= 1``).
    attention_chunk_size : int or None
        Tokens of one chunk of chunked local attention, a positive multiple of ``block_size``.
    block_size : int
        The manager's block size.

    Raises
    ------
    InvalidGeometry
        Both set, a value below 1, a chunk that is not a multiple of ``block_size``.
    TypeError
        A value that is not an integer.
    """
    values = []
    for name, value in (
        ("sliding_window", sliding_window),
        ("attention_chunk_size", attention_chunk_size),
    ):
        if value is None:
            values.append(0)
            continue
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{name} must be an integer or None, got {type(value).__name__}")
        value = int(value)
        if value < 1:
            raise InvalidGeometry(f"{name} must be at least 1 token, got {value}")
        values.append(value)
    window, chunk = values
    if window and chunk:
        raise InvalidGeometry(
            "sliding_window and attention_chunk_size exclude each other: a manager serves one "
            "attention kind (use one manager per KV cache group)"
        )
    if chunk % block_size:
        raise InvalidGeometry(
            f"attention_chunk_size={chunk} must be a multiple of block_size={block_size}"
        )
    return window, chunk


def first_needed_block(length, block_size, window, chunk):
    """The lowest table position that the next tokens of a sequence of ``length`` tokens can
    reach (0 for full attention: ``window == chunk == 0``).

    Sliding window ``W``: ``max(0, length - W + 1) // block_size``; chunked local ``C``:
    ``(length // C * C) // block_size``.
    """
    if window > 0:
        return max(0, length - window + 1) // block_size
    if chunk > 0:
        return (length // chunk * chunk) // block_size
    return 0


def window_hit(hits, limit, block_size, window, chunk):
    """The prefix a windowed prompt may reuse: ``(k, first)``.

    ``hits[pos]`` (``pos < limit``) is the registered block of the prompt's block ``pos``, or
    a negative number for a miss. ``k`` blocks count as cached (``k * block_size`` tokens);
    positions ``first .. k - 1`` are the blocks to claim, the ones below ``first`` are not
    needed.

    - Sliding window ``W``: ``k`` is the largest value in ``0 .. limit`` such that positions
      ``max(0, k - w) .. k - 1`` all hit, ``w = ceil((W - 1) / block_size)``, searched from the
      right; ``first = max(0, k - w)``.
    - Chunked local ``C``: ``first = (limit * block_size // C * C) // block_size``, the chunk
      of the first token computed after ``limit`` blocks, and ``k = first + h``, ``h`` the hits
      at positions ``first, first + 1, ...`` up to the first miss (below ``limit``).
    - Full attention: the hits from position 0 up to the first miss; ``first = 0``.
    """
    if window > 0:
        w = (window - 1 + block_size - 1) // block_size
        if w == 0:
            return limit, limit
        run = 0
        for pos in range(limit - 1, -1, -1):
            if hits[pos] >= 0:
                run += 1
                if run == w:
                    return pos + w, pos
            else:
                run = 0
        return run, 0  # fewer than w blocks, all hits from position 0
    first = 0
    if chunk > 0:
        first = (limit * block_size // chunk * chunk) // block_size
    k = first
    while k < limit and hits[k] >= 0:
        k += 1
    return k, first


def group_hit(rows, limit, block_size, windows, chunks, num_groups):
    """The prefix every KV cache group of a prompt may reuse: the largest ``k <= limit`` that
    :func:`window_hit` gives each group ``g`` (hits ``rows[g]``, window ``windows[g]``, chunk
    ``chunks[g]``) when capped at ``k``.

    Each group's rule is searched with the cap the others left, until none lowers it: the
    fixed point vLLM's hybrid coordinator computes. A full-attention group caps the others at
    its leading run; a sliding-window group then looks for its window below that.
    """
    k = limit
    while True:
        cap = k
        for g in range(num_groups):
            found, _ = window_hit(rows[g], cap, block_size, windows[g], chunks[g])
            cap = min(cap, found)
        if cap == k:
            return k
        k = cap
