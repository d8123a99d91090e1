"""Helpers of the eviction-policy scenarios (``test_eviction_policies``,
``test_reference_eviction``): a manager of block size 2 with an eviction log, and the two ways
the scenarios fill it."""

from __future__ import annotations


class Evicted:
    """``on_evict`` recording the evicted block ids and payloads in order."""

    def __init__(self):
        self.blocks: list[int] = []
        self.tokens: list[tuple[int, ...]] = []

    def __call__(self, ids, hashes, tokens):
        self.blocks += ids.tolist()
        self.tokens += [tuple(row) for row in tokens.tolist()]


def make(impl, num_blocks, policy, **kw):
    """A manager of class ``impl`` (block size 2) with ``policy`` and the log of its evictions."""
    log = Evicted()
    kw.setdefault("max_seqs", 16)
    mgr = impl(num_blocks, 2, eviction=policy, on_evict=log, _hindsight=policy == "oracle", **kw)
    return mgr, log


def use(mgr, tokens, times=1) -> list[int]:
    """Admit ``tokens`` as one prompt and release it, ``times`` times; each time's cached tokens."""
    cached = []
    for _ in range(times):
        result = mgr.admit(tokens, [len(tokens)])
        mgr.release(result.ids)
        cached.append(int(result.num_cached_tokens[0]))
        mgr.check()
    return cached


def hold(mgr, tokens) -> int:
    """A new sequence appended ``tokens`` (its full blocks are registered as they fill)."""
    (seq,) = mgr.new_sequences(1)
    mgr.append([seq], [len(tokens)], tokens)
    mgr.check()
    return int(seq)
