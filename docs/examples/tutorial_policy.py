"""The policy of the tutorial in ``docs/eviction.md`` ("Your own policy").

Run it in the simulator with this folder on the path::

    PYTHONPATH=docs/examples kvnumba simulate --eviction tutorial_policy:shallow_first
"""

from kvnumba.priority import priority_policy


@priority_policy("shallow-first", leaves_only=True)
def shallow_first(f):
    """Evict orphans, then shallow leaves before deep ones, LRU within a depth band."""
    if f.orphan:  # no prompt can reach it any more
        return -1
    band = min(f.depth // 8, 15)  # 8-block bands of prefix depth
    return band * (1 << 40) + f.stamp
