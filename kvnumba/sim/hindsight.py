"""Hints for the ``oracle`` eviction policy: when each prompt block's content is next used.

The oracle (``kvnumba simulate --eviction oracle``, see ``docs/eviction.md``) evicts the cached
leaf whose content the trace uses again furthest in the future. The simulator knows the future
from the Mooncake ``hash_ids``: :func:`next_use` gives, for every full prompt block of every
request, the trace position of the next request whose prompt holds a block with the same key
(:func:`kvnumba.sim.ideal.block_keys`), and :class:`Hints` hands those values to the manager
after each admission.

Trace order is request index order (``Request.index``): the order of the trace file, which is
also arrival order for a trace sorted by timestamp, as the Mooncake trace is.

Under a sliding window or chunked local attention the next use is still the next prompt that
holds the content, though that prompt's hit may not need the block (it lies below the hit's
window): the oracle is then a coarser reference point.
"""

from __future__ import annotations

import numpy as np

from kvnumba.sim.ideal import BlockKeys


def next_use(keys: BlockKeys) -> np.ndarray:
    """For every block of ``keys``, the next request in trace order whose prompt has its key.

    Parameters
    ----------
    keys : BlockKeys
        From :func:`kvnumba.sim.ideal.block_keys` (blocks listed request after request).

    Returns
    -------
    numpy.ndarray of int64
        One value per block, aligned with ``keys.keys``: the index of the next later request
        that holds the same key, or -1 when none does.
    """
    k, owner = keys.keys, keys.owner
    out = np.full(k.size, -1, np.int64)
    if k.size < 2:
        return out
    # Blocks are listed in request order and a prompt holds a key at most once (the key
    # includes the block's position), so a stable sort by key lists each key's holders in
    # trace order: a block's next use is its successor in the sorted order, if it has the key.
    order = np.argsort(k, kind="stable")
    same = k[order[1:]] == k[order[:-1]]
    out[order[:-1][same]] = owner[order[1:][same]]
    return out


def prompt_block_starts(keys: BlockKeys) -> np.ndarray:
    """Where each request's blocks begin in the arrays of ``keys``.

    Parameters
    ----------
    keys : BlockKeys

    Returns
    -------
    numpy.ndarray of int64, shape (requests + 1,)
        Request ``i`` holds blocks ``starts[i] .. starts[i + 1] - 1``.
    """
    counts = keys.prompt_len // keys.block_size
    starts = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def admitted_prompt_blocks(
    keys: BlockKeys, starts: np.ndarray, requests: np.ndarray, tables: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The blocks that hold the full prompt blocks of freshly admitted requests.

    Parameters
    ----------
    keys : BlockKeys
    starts : numpy.ndarray of int64
        :func:`prompt_block_starts` of ``keys``.
    requests : numpy.ndarray of int64
        The admitted requests' indices.
    tables : numpy.ndarray of int
        Their block tables (``mgr.block_tables`` of their sequences, one row each, padded with
        -1), read right after the admission. A windowed manager's rows may begin with
        ``NULL_BLOCK`` entries (-2): positions below a hit's window that the prompt does not
        hold; they are left out.

    Returns
    -------
    blocks : numpy.ndarray of int64
        Block ids, request after request, prompt position after position.
    index : numpy.ndarray of int64
        For each of ``blocks``, its index in the arrays of ``keys``.
    """
    requests = np.asarray(requests, np.int64)
    n_full = starts[requests + 1] - starts[requests]
    width = int(n_full.max()) if n_full.size else 0
    if width == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    col = np.arange(width, dtype=np.int64)
    take = col < n_full[:, None]
    # A re-admitted request also holds its generated tokens: only the prompt's blocks are keyed.
    blocks = np.asarray(tables)[:, :width][take].astype(np.int64)
    index = (starts[requests][:, None] + col)[take]
    held = blocks >= 0  # NULL_BLOCK is negative: no block, so no hint and no key to remember
    return blocks[held], index[held]


class Hints:
    """The next-use hints of one trace, handed to an oracle manager after each admission.

    A block's hint is the next use after the *latest* request in trace order that has held its
    content so far, not merely after the request just admitted: a preempted request that is
    re-admitted after later requests shared its prefix would otherwise point the block at a
    request that has already come, and two requests of one ``admit`` call that share a block
    would give it two values.

    Parameters
    ----------
    keys : BlockKeys
        :func:`kvnumba.sim.ideal.block_keys` of the trace at the manager's block size.

    Attributes
    ----------
    next_use : numpy.ndarray of int64
        :func:`next_use` of ``keys``.
    starts : numpy.ndarray of int64
        :func:`prompt_block_starts` of ``keys``.
    """

    def __init__(self, keys: BlockKeys):
        self.keys = keys
        self.next_use = next_use(keys)
        self.starts = prompt_block_starts(keys)
        _, self._key_id = np.unique(keys.keys, return_inverse=True)
        # Per distinct key: the entry (index into ``keys``) of its latest holder admitted so
        # far. Entries are in request order, so the largest entry is the latest request.
        self._latest = np.full(int(self._key_id.max(initial=-1)) + 1, -1, np.int64)

    def values(self, index: np.ndarray) -> np.ndarray:
        """Record the entries ``index`` as admitted and return their blocks' next use.

        Parameters
        ----------
        index : numpy.ndarray of int64
            Entries of ``keys`` (request, prompt position) whose requests were just admitted.

        Returns
        -------
        numpy.ndarray of int64
            For each entry, the next request after the latest admitted holder of its key
            (-1: never again).
        """
        kid = self._key_id[index]
        np.maximum.at(self._latest, kid, index)
        return self.next_use[self._latest[kid]]

    def after_admit(self, mgr, requests: np.ndarray, tables: np.ndarray) -> None:
        """Tell ``mgr`` the next use of every full prompt block of requests just admitted.

        Parameters
        ----------
        mgr
            An oracle manager (``eviction="oracle", _hindsight=True``).
        requests : numpy.ndarray of int64
            Indices of the requests admitted (first admissions and re-admissions alike).
        tables : numpy.ndarray of int
            Their block tables, one row each.
        """
        blocks, index = admitted_prompt_blocks(self.keys, self.starts, requests, tables)
        if not blocks.size:
            return
        hints = self.values(index)
        # A block shared by two prompts of one call is listed twice, with one value.
        blocks, first = np.unique(blocks, return_index=True)
        mgr.set_next_use(blocks, hints[first])
