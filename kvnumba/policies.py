"""Eviction policies from the LLM-serving literature, written as priority policies.

Each is a few lines over :class:`kvnumba.priority.BlockFeatures`, the same API a user's own
policy takes (``docs/eviction.md``, "Your own policy"). Smaller priorities are evicted first.

``t-lru``: Tail-Optimized LRU
    Zhang, Li, Moallemi and Peng, *Tail-Optimized Caching for LLM Inference* (NeurIPS 2025,
    arXiv:2510.15152). A conversation of ``L`` tokens whose next turn adds about ``Q`` tokens
    meets a time-to-first-token target of ``xi`` computed tokens as long as its first
    ``B = max(0, L + Q - xi)`` tokens stay cached; the blocks past ``B`` cannot cause a
    violation (the paper's "tail-excess-latency safe" part). T-LRU evicts those first, in LRU
    order, then the others in LRU order. Here ``L`` is the length of the sequence whose release
    cached the block, and a block counts as safe when it starts at or past token ``B``.
``rlt``: Randomized Leaf Token eviction
    Wu, Silwal and Zhang, *Randomization Boosts KV Caching, Learning Balances Query Load: A
    Joint Perspective* (ICLR 2026, arXiv:2601.18999). A randomized marking algorithm on the
    prefix tree: only leaves are evicted; a block used in the current phase is marked, and the
    victim is a leaf chosen uniformly at random among the unmarked ones; when every candidate
    is marked a new phase begins and all are unmarked. Here a phase is the high half of the
    key: a block gets the phase after the latest victim's when it is released (marked), and a
    pseudo-random low half, a hash of block and stamp, so that runs are reproducible. Orphans
    (no prompt can reach them) go first. Blocks, not tokens, are the unit.
``gdsf``: GreedyDual-Size-Frequency over the leaves, costed by position
    Cherkasova, *Improving WWW Proxies Performance with Greedy-Dual-Size-Frequency Caching
    Policy* (HP Labs HPL-98-69R1, 1998). A cached object's key is ``L + frequency * cost /
    size``, where ``L`` (the aging) is the key of the latest victim; the lowest key goes. Here
    every block has one size, the frequency is ``1 + hits``, and the cost is what recomputing
    the block's tokens takes: a token's linear layers cost the same at every position, its
    attention grows with the context before it, so the block at depth ``d`` costs
    ``linear_tokens + d * block_size`` units (``linear_tokens`` is the context at which a
    token's attention costs as much as the rest of its layers). Deep blocks of a long shared
    context are dearer to lose than the first blocks of a short chat. Leaves only, orphans
    first, as ``leaf-lfu``.
``leaf-lfu``: LFU with aging over the leaves (this project's)
    GreedyDual's aging (the key of the latest victim) plus one per use since registration,
    among leaves only: a block hit often keeps its place, a prefix is never cut under a
    cached suffix, and a block no longer used ages out as the age rises past it. The built-in
    ``lfu`` does the same over every cached block and can cut shared prefixes.
"""

from __future__ import annotations

from numba import njit

from kvnumba.priority import PriorityPolicy

__all__ = ["SHIPPED", "gdsf", "leaf_lfu", "rlt", "t_lru"]

#: How far above every LRU stamp the protected blocks of ``t-lru`` sort.
_PROTECTED = 1 << 40
_LOW = 0xFFFFFFFF


def t_lru(next_query_tokens: int = 512, slo_tokens: int = 4096) -> PriorityPolicy:
    """Tail-Optimized LRU (see the module notes).

    Parameters
    ----------
    next_query_tokens : int, default 512
        ``Q``: the tokens a conversation's next turn is expected to add.
    slo_tokens : int, default 4096
        ``xi``: the prompt tokens that can be computed within the time-to-first-token target.

    Returns
    -------
    PriorityPolicy
        Named ``"t-lru"``.
    """
    q, xi = int(next_query_tokens), int(slo_tokens)
    if q < 0 or xi < 0:
        raise ValueError("next_query_tokens and slo_tokens must be >= 0")

    @njit
    def t_lru_priority(f):
        protect_below = max(0, f.length + q - xi)
        if f.depth * f.block_size >= protect_below:
            return f.stamp  # past what the next turn needs cached: evicted first
        return f.stamp + _PROTECTED

    return PriorityPolicy(t_lru_priority, name="t-lru")


@njit
def _mix32(x):
    """A 32-bit integer hash (no product leaves int64, so Python computes the same)."""
    x &= _LOW
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _LOW
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _LOW
    return x ^ (x >> 16)


def rlt() -> PriorityPolicy:
    """Randomized Leaf Token eviction (see the module notes).

    Returns
    -------
    PriorityPolicy
        Named ``"rlt"``, leaves only.
    """

    @njit
    def rlt_priority(f):
        if f.orphan:
            return -1
        phase = (f.age >> 32) + 1
        return (phase << 32) | _mix32(f.block * 0x9E37 + f.stamp)

    return PriorityPolicy(rlt_priority, name="rlt", leaves_only=True)


def leaf_lfu() -> PriorityPolicy:
    """LFU with aging over the leaves of the cached prefix forest (see the module notes).

    Returns
    -------
    PriorityPolicy
        Named ``"leaf-lfu"``, leaves only.
    """

    @njit
    def leaf_lfu_priority(f):
        if f.orphan:
            return -1
        return f.age + 1 + f.hits

    return PriorityPolicy(leaf_lfu_priority, name="leaf-lfu", leaves_only=True)


def gdsf(linear_tokens: int = 32768) -> PriorityPolicy:
    """GreedyDual-Size-Frequency over the leaves, costed by position (see the module notes).

    Parameters
    ----------
    linear_tokens : int, default 32768
        The context length at which one token's attention costs as much as the rest of its
        layers: the weight of a block's position in its cost. About 32,768 for a model of
        Llama-3-8B's shape (its per-token linear layers against attention over the context), an
        assumption to set per model; a large value makes every block cost about the same
        (``leaf-lfu``'s order).

    Returns
    -------
    PriorityPolicy
        Named ``"gdsf"``, leaves only.
    """
    base = int(linear_tokens)
    if base < 1:
        raise ValueError("linear_tokens must be >= 1")

    @njit
    def gdsf_priority(f):
        if f.orphan:
            return -1
        return f.age + (1 + f.hits) * (base + f.depth * f.block_size)

    return PriorityPolicy(gdsf_priority, name="gdsf", leaves_only=True)


#: The shipped policies with their default parameters, by name.
SHIPPED = {p.name: p for p in (t_lru(), rlt(), leaf_lfu(), gdsf())}
