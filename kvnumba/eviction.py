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
