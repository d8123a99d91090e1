"""Names of the eviction policies (no numba here: the reference model and the CLIs read them).

See ``docs/eviction.md`` for what each policy does.
"""

from __future__ import annotations

#: The policies built into the kernels.
BUILTIN_POLICIES = ("lru", "lfu", "sieve", "leaf-lru")
#: Priority policies kvnumba ships (:mod:`kvnumba.policies`, written with :mod:`kvnumba.priority`).
SHIPPED_POLICIES = ("t-lru", "rlt", "leaf-lfu", "gdsf")
#: Policies a :class:`kvnumba.BlockManager` can be built with by name; ``"lru"`` is the default.
#: A :class:`kvnumba.priority.PriorityPolicy` (or ``"module:attribute"`` naming one) is accepted
#: too.
EVICTION_POLICIES = BUILTIN_POLICIES + SHIPPED_POLICIES
#: Policies that need the future of a trace: simulator options only (``kvnumba simulate
#: --eviction oracle``), never a ``BlockManager`` policy.
HINDSIGHT_POLICIES = ("oracle",)
#: Every name the simulator and the sweeps accept.
SIMULATOR_POLICIES = EVICTION_POLICIES + HINDSIGHT_POLICIES

#: The code of each built-in policy in the manager's state (``meta``); LRU is 0.
POLICY_CODES = {name: code for code, name in enumerate(BUILTIN_POLICIES + HINDSIGHT_POLICIES)}
#: The code of every priority policy (the kernels call its priority through its address).
PRIORITY_CODE = len(POLICY_CODES)


def is_priority_spec(eviction) -> bool:
    """Whether ``eviction`` stands for a priority policy rather than a built-in one.

    Parameters
    ----------
    eviction : object
        A policy name, ``"module:attribute"``, or a policy object.

    Returns
    -------
    bool
    """
    if isinstance(eviction, str):
        return eviction in SHIPPED_POLICIES or ":" in eviction
    return hasattr(eviction, "leaves_only") and hasattr(eviction, "address")


def policy_name(eviction) -> str:
    """The name a policy is reported under: a built-in name itself, a priority policy its own
    name (also when ``"module:attribute"`` names it).

    Parameters
    ----------
    eviction : str or PriorityPolicy
        A valid policy as ``policy_code`` takes it.

    Returns
    -------
    str
    """
    policy = _priority(eviction)
    return eviction if policy is None else policy.name


def needs_future(eviction) -> bool:
    """Whether policy ``eviction`` reads the future of a trace (the simulator gives its manager
    next-use hints): ``oracle``, or a priority policy made with ``hindsight=True``.

    Parameters
    ----------
    eviction : str or PriorityPolicy
        A valid policy as ``policy_code`` takes it.

    Returns
    -------
    bool
    """
    policy = _priority(eviction)
    return eviction in HINDSIGHT_POLICIES if policy is None else policy.hindsight


def _priority(eviction):
    """The priority policy ``eviction`` stands for, or None for a built-in name."""
    if not is_priority_spec(eviction):
        return None
    from kvnumba.priority import resolve

    return resolve(eviction)


def policy_code(name, *, hindsight: bool = False) -> int:
    """The state code of policy ``name``.

    Parameters
    ----------
    name : str or PriorityPolicy
        A name of :data:`EVICTION_POLICIES` (or of :data:`HINDSIGHT_POLICIES` when
        ``hindsight``), ``"module:attribute"`` naming a priority policy, or a
        :class:`kvnumba.priority.PriorityPolicy`.
    hindsight : bool
        Whether policies that need the future are allowed (the simulator's managers).

    Returns
    -------
    int
        The code (``POLICY_CODES[name]``, or :data:`PRIORITY_CODE`).

    Raises
    ------
    ValueError
        For any other name, listing the known ones.
    """
    policy = _priority(name)  # ValueError for what names none
    if policy is not None:
        if policy.hindsight and not hindsight:
            raise ValueError(
                f"eviction policy {policy.name!r} reads the future of a trace (hindsight=True): "
                "a simulator option only"
            )
        return PRIORITY_CODE
    known = SIMULATOR_POLICIES if hindsight else EVICTION_POLICIES
    if not isinstance(name, str) or name not in known:
        extra = (
            ""
            if hindsight or name not in HINDSIGHT_POLICIES
            else f" ({name!r} needs the future of a trace: a simulator option only)"
        )
        raise ValueError(
            f"unknown eviction policy {name!r}; known: {', '.join(known)}, or a PriorityPolicy"
            f" ('module:attribute'){extra}"
        )
    return POLICY_CODES[name]


def check_next_use(policy: str, num_blocks: int, blocks, next_use, *, priority=False) -> None:
    """Validate the inputs of ``set_next_use`` (the hints of ``oracle`` and of priority policies).

    Parameters
    ----------
    policy : str
        The manager's policy; ``"oracle"`` and priority policies take hints.
    num_blocks : int
        The manager's pool size.
    blocks, next_use : numpy.ndarray of int64
        Block ids and the trace position of each one's next use (-1: never).
    priority : bool
        The manager's policy is a priority policy.

    Raises
    ------
    ValueError
        For another policy, unequal lengths, a block outside the pool or a next use below -1.
    """
    if policy not in HINDSIGHT_POLICIES and not priority:
        raise ValueError(
            "set_next_use gives the oracle policy and priority policies their hints; this "
            f"manager's policy is {policy!r}"
        )
    if blocks.shape != next_use.shape:
        raise ValueError(f"next_use has {next_use.shape[0]} entries for {blocks.shape[0]} blocks")
    if blocks.size and (blocks.min() < 0 or blocks.max() >= num_blocks):
        raise ValueError(f"block ids must be in [0, {num_blocks})")
    if next_use.size and next_use.min() < -1:
        raise ValueError("next_use must be >= -1 (-1: never used again)")


def check_tags(policy: str, num_blocks: int | None, targets, tags, *, priority: bool) -> None:
    """Validate the inputs of ``set_tags`` (a priority policy's tags of blocks) or, with
    ``num_blocks=None``, of ``set_sequence_tags`` (its tags of sequences).

    Parameters
    ----------
    policy : str
        The manager's policy's name.
    num_blocks : int or None
        The manager's pool size; None when ``targets`` are sequence ids (the kernel checks
        those).
    targets, tags : numpy.ndarray of int64
        Block ids or sequence ids, and the tag of each.
    priority : bool
        The manager's policy is a priority policy (no other reads tags).

    Raises
    ------
    ValueError
        For another policy, unequal lengths or a block outside the pool.
    """
    call, what = ("set_tags", "blocks") if num_blocks is not None else ("set_sequence_tags", "ids")
    if not priority:
        raise ValueError(
            f"{call} tags {'sequences' if num_blocks is None else 'blocks'} for a priority "
            f"policy; this manager's is {policy!r}"
        )
    if targets.shape != tags.shape:
        raise ValueError(f"tags has {tags.shape[0]} entries for {targets.shape[0]} {what}")
    if num_blocks is not None and targets.size:
        if targets.min() < 0 or targets.max() >= num_blocks:
            raise ValueError(f"block ids must be in [0, {num_blocks})")


def is_valid_policy(eviction, *, hindsight: bool = True) -> bool:
    """Whether ``policy_code`` accepts ``eviction`` (loading a ``"module:attribute"`` policy).

    Parameters
    ----------
    eviction : object
        What to test.
    hindsight : bool
        Whether policies that need the future are allowed.

    Returns
    -------
    bool
    """
    try:
        policy_code(eviction, hindsight=hindsight)
    except ValueError:
        return False
    return True
