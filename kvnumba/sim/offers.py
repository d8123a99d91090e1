"""Which waiting prompts the replay offers to ``admit``, and which it need not.

At a tight pool most of the queue cannot fit, step after step. Offering every waiting prompt to
every ``admit`` would rebuild and rehash the same long prompts each step only to fail them
again. A prompt that failed is therefore remembered with the blocks it lacks: its blocks less
the hits one ``lookup`` finds (a lookup claims nothing). Until the pool holds that many free
plus cached blocks the prompt cannot fit, so it is not offered, unless a prompt admitted since
may have filled its first missing block.

That bound holds because, while the prompt waits, its hits can only shrink or be added to by an
admission: decode output never matches a prompt, and a block that a running sequence releases
was a hit already while in use. On a trace with ``hash_ids`` the block keys
(:class:`~kvnumba.sim.ideal.BlockKeys`) say which admission can add to which prompt: one whose
prompt holds the waiting prompt's first missing block. Without keys any admission forgets every
bound. Under a window a released block can become a hit, so there the bound is only "more than
the pool holds now", forgotten by any admission (as before this module, for a whole window).

Skipping a prompt that cannot fit changes nothing: ``admit(..., atomic=False)`` takes each
prompt all or nothing, in order, and a prompt that does not fit changes no state. The caller
offers the runs of consecutive prompts that may fit, one ``admit`` per run, in queue order, and
asks again after a run admitted something; the replay's rows are those of offering the whole
window at once.
"""

from __future__ import annotations

import numpy as np

from kvnumba.sim.ideal import BlockKeys

#: A bound that any admission forgets (no keys, or a window).
ANY_ADMISSION = -2
#: A bound that no other prompt's admission can lower: the first missing block holds the
#: request's own generated tokens, or no block is missing that a lookup could find.
NO_ADMISSION = -1


class OfferGate:
    """Per waiting request, the free plus cached blocks it needs at least before it may fit.

    Parameters
    ----------
    manager
        The replay's block manager (its ``lookup`` finds a prompt's hits, claiming nothing).
    requests : int
        Requests in the trace.
    block_size : int
        Tokens per block.
    keys : BlockKeys or None
        The trace's block keys; ``None`` when it has no ``hash_ids``.
    windowed : bool
        The manager has a sliding window or attention chunks.
    """

    def __init__(
        self, manager, requests: int, block_size: int, keys: BlockKeys | None, windowed: bool
    ):
        self._manager = manager
        self._block_size = block_size
        self._keys = keys
        self._windowed = windowed
        self._length = np.full(requests, -1, np.int64)  # the prompt length bounded; -1: none
        self._lacks = np.zeros(requests, np.int64)
        self._waits_for = np.zeros(requests, np.int64)  # a block key, or one of the two above
        if keys is not None:
            counts = np.bincount(keys.owner, minlength=requests)
            self._first_key = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            self._key_count = counts.astype(np.int64)

    def may_fit(self, requests: np.ndarray, lengths: np.ndarray, available: int) -> np.ndarray:
        """Which of ``requests`` (with prompts of ``lengths`` tokens) may fit a pool holding
        ``available`` free plus cached blocks: those without a bound, or whose bound is met."""
        bounded = self._length[requests] == lengths
        return ~bounded | (self._lacks[requests] <= available)

    def admitted(self, requests: np.ndarray) -> None:
        """Forget the bounds that the admission of ``requests`` may have lowered (and theirs)."""
        if requests.size == 0:
            return
        self._length[requests] = -1
        known = np.flatnonzero(self._length >= 0)
        if known.size == 0:
            return
        waits_for = self._waits_for[known]
        stale = waits_for == ANY_ADMISSION
        if self._keys is not None:
            starts, counts = self._first_key[requests], self._key_count[requests]
            rows = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            stale |= np.isin(waits_for, self._keys.keys[rows])
        self._length[known[stale]] = -1

    def failed(
        self, requests: np.ndarray, lengths: np.ndarray, tokens: np.ndarray, available: int
    ) -> None:
        """Bound ``requests``, which just failed to fit (``tokens``: their prompts, concatenated;
        ``available``: free plus cached blocks now)."""
        if requests.size == 0:
            return
        self._length[requests] = lengths
        if self._windowed:
            self._lacks[requests] = available + 1
            self._waits_for[requests] = ANY_ADMISSION
            return
        bs = self._block_size
        hits = np.asarray(self._manager.lookup(tokens, lengths).num_cached_tokens) // bs
        self._lacks[requests] = -(-lengths // bs) - hits
        if self._keys is None:
            self._waits_for[requests] = ANY_ADMISSION
            return
        # The first missing block, if it is a prompt block another prompt can hold.
        own = hits >= self._key_count[requests]
        waits_for = np.full(requests.size, NO_ADMISSION, np.int64)
        waits_for[~own] = self._keys.keys[self._first_key[requests[~own]] + hits[~own]]
        self._waits_for[requests] = waits_for
