"""Names of the eviction policies (no numba here: the reference model and the CLIs read them).

See ``docs/eviction.md`` for what each policy does.
"""

from __future__ import annotations

#: Policies a :class:`kvnumba.BlockManager` can be built with; ``"lru"`` is the default.
EVICTION_POLICIES = ("lru", "lfu", "sieve", "leaf-lru")
#: Policies that need the future of a trace: simulator options only (``kvnumba simulate
#: --eviction oracle``), never a ``BlockManager`` policy.
HINDSIGHT_POLICIES = ("oracle",)
#: Every name the simulator and the sweeps accept.
SIMULATOR_POLICIES = EVICTION_POLICIES + HINDSIGHT_POLICIES

#: The code of each policy in the manager's state (``meta``); LRU is 0.
POLICY_CODES = {name: code for code, name in enumerate(SIMULATOR_POLICIES)}


def policy_code(name, *, hindsight: bool = False) -> int:
    """The state code of policy ``name``.

    Parameters
    ----------
    name : str
        A name of :data:`EVICTION_POLICIES` (or of :data:`HINDSIGHT_POLICIES` when
        ``hindsight``).
    hindsight : bool
        Whether policies that need the future are allowed (the simulator's managers).

    Returns
    -------
    int
        The code (``POLICY_CODES[name]``).

    Raises
    ------
    ValueError
        For any other name, listing the known ones.
    """
    known = SIMULATOR_POLICIES if hindsight else EVICTION_POLICIES
    if not isinstance(name, str) or name not in known:
        extra = (
            ""
            if hindsight or name not in HINDSIGHT_POLICIES
            else f" ({name!r} needs the future of a trace: a simulator option only)"
        )
        raise ValueError(f"unknown eviction policy {name!r}; known: {', '.join(known)}{extra}")
    return POLICY_CODES[name]


def check_next_use(policy: str, num_blocks: int, blocks, next_use) -> None:
    """Validate the inputs of ``set_next_use`` (the ``oracle`` policy's hints).

    Parameters
    ----------
    policy : str
        The manager's policy; only ``"oracle"`` takes hints.
    num_blocks : int
        The manager's pool size.
    blocks, next_use : numpy.ndarray of int64
        Block ids and the trace position of each one's next use (-1: never).

    Raises
    ------
    ValueError
        For another policy, unequal lengths, a block outside the pool or a next use below -1.
    """
    if policy not in HINDSIGHT_POLICIES:
        raise ValueError(
            f"set_next_use gives the simulator's oracle policy its hints; this manager's "
            f"policy is {policy!r}"
        )
    if blocks.shape != next_use.shape:
        raise ValueError(f"next_use has {next_use.shape[0]} entries for {blocks.shape[0]} blocks")
    if blocks.size and (blocks.min() < 0 or blocks.max() >= num_blocks):
        raise ValueError(f"block ids must be in [0, {num_blocks})")
    if next_use.size and next_use.min() < -1:
        raise ValueError("next_use must be >= -1 (-1: never used again)")
