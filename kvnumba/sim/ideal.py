"""The ideal prefix hit rate of a trace: what an unbounded pool would serve from cache.

Computed from the Mooncake ``hash_ids`` alone, independently of the simulator and of the block
manager, under the manager's rules:

* the cache holds whole ``block_size``-token blocks; a block is reusable once any earlier
  admitted prompt held the same tokens at the same position after the same prefix (so the key
  of prompt block ``i`` is the chain of hash ids covering tokens ``0 .. (i + 1) * block_size -
  1``, plus ``i``);
* a prompt reuses the longest run of leading blocks that are cached, but never its last token:
  at most ``(prompt_len - 1) // block_size`` blocks;
* nothing is ever evicted (the pool is unbounded), so once seen, a block stays reusable.

Under a sliding window of ``W >= 2`` tokens the ideal is the same: a windowed hit needs the
blocks of the prompt's last window before its end, and with nothing evicted the blocks cached
for a prompt always form a prefix (every key chains its prefix), so the longest cached prefix
is also the longest whose last window is cached. ``W = 1`` needs no earlier block: every prompt
hits its cap. Under chunked local attention of ``C`` tokens a prompt needs no block below its
last token's chunk: it counts those blocks as cached (``docs/windows.md``), then the run of
cached blocks from there, and only the blocks a prompt computed (from its last chunk on) are
cached for the prompts after it (:func:`ideal_prefix_hits`, ``attention_chunk_size``).

Requests are taken in admission order: arrival order by default (the simulator's queue order,
which is what an unbounded pool admits), or any order given, such as the order in which one
simulation actually admitted its requests. The latter is how :func:`ideal_prefix_hits` tells
the hits lost to evictions apart from those lost to admission order and rejected requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvnumba.sim.traces import MOONCAKE_BLOCK, Request


@dataclass(frozen=True)
class IdealHits:
    """Cached prompt tokens of an unbounded pool.

    Attributes
    ----------
    cached_tokens : int
        Prompt tokens served from the cache.
    prompt_tokens : int
        Prompt tokens of the requests counted.
    """

    cached_tokens: int
    prompt_tokens: int

    @property
    def rate(self) -> float:
        """``cached_tokens / prompt_tokens`` (0.0 for no prompt tokens)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class BlockKeys:
    """Content keys of every full prompt block of a trace (see :func:`block_keys`).

    Attributes
    ----------
    keys : numpy.ndarray of int64
        One key per full prompt block, request after request; equal keys mean equal content
        after an equal prefix.
    owner : numpy.ndarray of int64
        Index of the request each block belongs to.
    pos : numpy.ndarray of int64
        Block index inside its prompt.
    prompt_len : numpy.ndarray of int64
        Prompt tokens per request.
    block_size : int
        Tokens per block.
    """

    keys: np.ndarray
    owner: np.ndarray
    pos: np.ndarray
    prompt_len: np.ndarray
    block_size: int


def block_keys(requests: Sequence[Request], block_size: int) -> BlockKeys | None:
    """Key every full prompt block of a Mooncake trace by its content and prefix.

    Parameters
    ----------
    requests : sequence of Request
        The trace; ``requests[i].index`` must be ``i``.
    block_size : int
        Tokens per block (any size; it need not divide 512).

    Returns
    -------
    BlockKeys or None
        ``None`` when some request carries no ``hash_ids`` (an Azure-format trace: it says
        nothing about sharing, so there is no ideal to compute).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if any(r.hash_ids is None for r in requests):
        return None
    prompt_len = np.fromiter((r.prompt_len for r in requests), np.int64, len(requests))
    stride = int(prompt_len.max() // block_size) + 1 if len(requests) else 1
    # A node is one distinct chain of leading hash ids (a path in the prefix trie): two prompts
    # share tokens 0..k*512-1 exactly when their k-th nodes are equal.
    nodes: dict[tuple[int, int], int] = {}
    keys, owner, pos = [], [], []
    for r in requests:
        hash_ids = r.hash_ids
        assert hash_ids is not None  # tested above
        chain = np.empty(len(hash_ids), np.int64)
        parent = -1
        for j, h in enumerate(hash_ids.tolist()):
            parent = nodes.setdefault((parent, h), len(nodes))
            chain[j] = parent
        i = np.arange(r.prompt_len // block_size, dtype=np.int64)
        # The hash block holding the block's last token fixes its content and its prefix.
        last = ((i + 1) * block_size - 1) // MOONCAKE_BLOCK
        keys.append(chain[last] * stride + i)
        owner.append(np.full(i.size, r.index, np.int64))
        pos.append(i)
    return BlockKeys(_cat(keys), _cat(owner), _cat(pos), prompt_len, block_size)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def ideal_prefix_hits(
    keys: BlockKeys,
    order: Sequence[int] | np.ndarray | None = None,
    *,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
) -> IdealHits:
    """Prompt tokens an unbounded pool serves from cache, admitting requests in ``order``.

    Parameters
    ----------
    keys : BlockKeys
        From :func:`block_keys`.
    order : sequence of int, optional
        Request indices in admission order; requests not listed are never admitted (they
        neither hit nor fill the cache). Default: every request, in trace order.
    sliding_window, attention_chunk_size : int, optional
        The manager's attention kind (see the module docstring); full attention by default.

    Returns
    -------
    IdealHits
    """
    n = keys.prompt_len.size
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    rank = np.full(n, -1, np.int64)
    rank[order] = np.arange(order.size)
    admitted = rank[keys.owner] >= 0
    k, owner, pos = keys.keys[admitted], keys.owner[admitted], keys.pos[admitted]
    block_rank = rank[owner]
    # The first admission that held each distinct block.
    uniq, inverse = np.unique(k, return_inverse=True)
    first = np.full(uniq.size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inverse, block_rank)
    seen = first[inverse] < block_rank
    # A prompt reuses its leading run of cached blocks, never the block of its last token.
    cap = (keys.prompt_len[owner] - 1) // keys.block_size
    if sliding_window == 1:  # a token attends to itself only: no earlier block is needed
        seen = np.ones_like(seen)
    elif attention_chunk_size:
        # Each prompt needs its blocks from the chunk of its last token on (``start``), and
        # only those are computed, so only those fill the cache for later prompts.
        lengths = keys.prompt_len[owner]
        start = np.minimum(
            cap, (lengths - 1) // attention_chunk_size * attention_chunk_size // keys.block_size
        )
        computed = pos >= start
        first = np.full(uniq.size, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, inverse[computed], block_rank[computed])
        seen = (first[inverse] < block_rank) | ~computed  # below ``start``: not needed
    usable = pos < cap
    # First block of each prompt that is not reusable (or its cap): the length of the run.
    stop = np.where(usable & seen, cap, np.minimum(pos, cap))
    run = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(run, owner, stop)
    has_blocks = np.zeros(n, bool)
    has_blocks[owner] = True
    hits = np.where(has_blocks, run, 0)
    return IdealHits(
        cached_tokens=int(hits[order].sum()) * keys.block_size,
        prompt_tokens=int(keys.prompt_len[order].sum()),
    )


def ideal_prefix_hit_rate(
    requests: Sequence[Request],
    block_size: int,
    max_seq_len: int | None = None,
    *,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
) -> IdealHits | None:
    """The trace's ideal prefix hits: an unbounded pool, requests admitted in arrival order.

    Parameters
    ----------
    requests : sequence of Request
        The trace (``requests[i].index == i``).
    block_size : int
        Tokens per block.
    max_seq_len : int, optional
        Requests whose prompt plus output exceed it are never admitted (the simulator rejects
        them under any pool), so they are left out here too.
    sliding_window, attention_chunk_size : int, optional
        The attention kind, as for :func:`ideal_prefix_hits`.

    Returns
    -------
    IdealHits or None
        ``None`` for a trace without ``hash_ids``.
    """
    keys = block_keys(requests, block_size)
    if keys is None:
        return None
    arrival = np.fromiter((r.arrival_ms for r in requests), np.float64, len(requests))
    order = np.argsort(arrival, kind="stable")
    if max_seq_len is not None:
        total = np.fromiter((r.prompt_len + r.output_len for r in requests), np.int64, len(order))
        order = order[total[order] <= max_seq_len]
    return ideal_prefix_hits(
        keys, order, sliding_window=sliding_window, attention_chunk_size=attention_chunk_size
    )
