"""Engine block hashes as kvnumba block keys, and back.

An engine that hashes blocks itself hands kvnumba one 256-bit key per full block
(``BlockManager(..., block_keys=True)``): four uint64 words. vLLM's block hash is the raw digest
(``bytes``; 32 for sha256, 16 or 8 for the xxhash variants). The digest's bytes are the key's
bytes, zero-padded to 32, so the conversion is a copy in C, with no Python work per block; the
padding is undone from the digest length, which one engine uses for every block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

KEY_BYTES = 32  # four uint64 words
# One descriptor object: numpy resolves a dtype given as a type on every call.
_UINT64 = np.dtype(np.uint64)
_UINT8 = np.dtype(np.uint8)


def keys_from_hashes(
    hashes: Sequence[bytes], start: int = 0, stop: int | None = None
) -> np.ndarray:
    """Keys of ``hashes[start:stop]`` as a ``uint64[n, 4]`` array.

    Parameters
    ----------
    hashes : sequence of bytes
        Block digests, at most 32 bytes each, all of one length (one hash function).
    start, stop : int
        The slice of ``hashes`` to convert (``stop`` defaults to the end).

    Returns
    -------
    numpy.ndarray of uint64, shape (n, 4)
        Row ``i`` holds the bytes of ``hashes[start + i]``, zero-padded to 32.

    Raises
    ------
    ValueError
        A digest longer than 32 bytes, or digests of different lengths.
    """
    return keys_from_digests(hashes[start:stop])


def keys_from_runs(runs: Sequence[tuple[Sequence[bytes], int, int]]) -> np.ndarray:
    """Keys of several slices of hash lists, in order, as one ``uint64[n, 4]`` array.

    One join and one copy for all the slices (the keys of many requests' new blocks at once),
    with no Python work per block.

    Parameters
    ----------
    runs : sequence of (hashes, start, stop)
        The slices ``hashes[start:stop]`` to convert, concatenated in this order.

    Returns
    -------
    numpy.ndarray of uint64, shape (n, 4)
        As :func:`keys_from_hashes` of the concatenated slices.

    Raises
    ------
    ValueError
        As :func:`keys_from_hashes`.
    """
    digests: list[bytes] = []
    for hashes, start, stop in runs:
        digests += hashes[start:stop]
    return keys_from_digests(digests)


def keys_from_digests(digests: Sequence[bytes]) -> np.ndarray:
    """Keys of ``digests`` as a ``uint64[n, 4]`` array (see :func:`keys_from_hashes`).

    Parameters
    ----------
    digests : sequence of bytes
        Block digests, at most 32 bytes each, all of one length.

    Returns
    -------
    numpy.ndarray of uint64, shape (n, 4)
        Row ``i`` holds the bytes of ``digests[i]``, zero-padded to 32.

    Raises
    ------
    ValueError
        A digest longer than 32 bytes, or digests of different lengths.
    """
    n = len(digests)
    if n == 0:
        return np.zeros((0, 4), dtype=np.uint64)
    joined = b"".join(digests)
    width = len(digests[0])
    if width * n != len(joined) or width > KEY_BYTES or width == 0:
        raise ValueError(
            f"block hashes must be 1..{KEY_BYTES} bytes, all of one length "
            f"(got {n} hashes of {len(joined)} bytes in all, the first of {width})"
        )
    if width == KEY_BYTES:
        return np.frombuffer(joined, dtype=_UINT64).reshape(n, 4)
    # Shorter digests (xxhash): pad each row; still one copy, no loop over blocks.
    raw = np.zeros((n, KEY_BYTES), dtype=_UINT8)
    raw[:, :width] = np.frombuffer(joined, dtype=_UINT8).reshape(n, width)
    return raw.view(_UINT64)


def hash_from_key(key: np.ndarray, width: int = KEY_BYTES) -> bytes:
    """The digest a key row was made from: its first ``width`` bytes.

    Parameters
    ----------
    key : numpy.ndarray of uint64, shape (4,)
        One key row.
    width : int, default 32
        Length of the engine's digests.

    Returns
    -------
    bytes
        The digest (the inverse of :func:`keys_from_hashes` for one row).
    """
    return np.ascontiguousarray(key, dtype=np.uint64).tobytes()[:width]
