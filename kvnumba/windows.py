"""Windowed attention (sliding window, chunked local): the rules that decide which blocks a
sequence still needs and which prefix of a prompt a windowed manager may reuse.

The functions here are plain Python over integers and integer sequences, so the reference
model calls them as they are and the kernels compile them (``kvnumba._kernels.windows``): one
statement of each rule. ``docs/windows.md`` states the contract.
"""

from __future__ import annotations

from kvnumba._state import NULL_BLOCK
from kvnumba.errors import InvalidGeometry

__all__ = [
    "NULL_BLOCK",
    "first_needed_block",
    "window_geometry",
    "window_hit",
]


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


def window_hit(hits, limit, length, block_size, window, chunk):
    """The prefix a windowed prompt may reuse: ``(k, first)``.

    ``hits[pos]`` (``pos < limit``) is the registered block of the prompt's block ``pos``, or
    a negative number for a miss. ``k`` blocks count as cached (``k * block_size`` tokens);
    positions ``first .. k - 1`` are the blocks to claim, the ones below ``first`` are not
    needed.

    - Sliding window ``W``: ``k`` is the largest value in ``0 .. limit`` such that positions
      ``max(0, k - w) .. k - 1`` all hit, ``w = ceil((W - 1) / block_size)``, searched from the
      right; ``first = max(0, k - w)``.
    - Chunked local ``C``: ``first = min(limit, ((length - 1) // C * C) // block_size)`` and
      ``k = first + h``, ``h`` the hits at positions ``first, first + 1, ...`` up to the first
      miss.
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
        first = min(limit, ((length - 1) // chunk * chunk) // block_size)
    k = first
    while k < limit and hits[k] >= 0:
        k += 1
    return k, first
