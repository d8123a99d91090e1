"""Eviction policies written by their user: a priority over a block's features.

A priority policy is one numba function ``priority(f) -> int`` over a :class:`BlockFeatures`
record. Among the candidates (every cached block, or only the leaves of the cached prefix
forest) an allocation evicts the one with the smallest priority, the earliest released first on
ties. kvnumba compiles the function once per process as a C callback and its kernels call it
through its address, so the policy runs inside the same compiled kernels as the built-in
policies: rollback, ``check()``, block events, page pools, the simulator, the sweeps and the
benchmarks take it without a change anywhere else.

When a priority is evaluated
    When a block is released into the cache, and again while it stays cached whenever one of
    its features other than the clocks changes: it becomes an orphan, its next-use hint or its
    tag is set, or (unless only leaves are candidates, which have no children) a child of it
    enters or leaves the cache. ``clock`` and ``age`` are their values at that moment; a policy
    that ages its blocks does it through ``age``, as GreedyDual does. The kernels skip an
    evaluation that cannot change the priority: after a change of a feature the function does
    not read, unless it reads ``clock`` or ``age`` (:meth:`PriorityPolicy.features_read`).

See ``docs/eviction.md`` ("Your own policy") for a tutorial, and :mod:`kvnumba.policies` for
the policies kvnumba ships written this way.
"""

from __future__ import annotations

import dis
import importlib
from typing import Any, NamedTuple

import numpy as np
from numba import njit, types
from numba.core import config
from numba.core.registry import CPUDispatcher

from kvnumba._layout import (
    PRIORITY_STORED,
    REKEY_CHILDREN,
    REKEY_NEXT_USE,
    REKEY_ORPHAN,
    REKEY_TAG,
)

__all__ = ["BlockFeatures", "PriorityPolicy", "priority_policy", "resolve"]


class BlockFeatures(NamedTuple):
    """What a priority function knows about a cached block (all int64).

    Attributes
    ----------
    block : int
        The block's id in the pool.
    hits : int
        Prefix hits on the block since its content was registered.
    stamp : int
        Its release stamp: releases into the cache before this one (release order, so also the
        order of last use: a block is used until it is released).
    clock : int
        Releases into the cache so far (the stamp the next release gets).
    age : int
        The largest priority a block an allocation evicted had so far (0 before the first, and
        never below 0): GreedyDual's inflation value.
    depth : int
        The block's position in its sequence when it was registered (0: the first block).
    children : int
        Its children in the cached prefix forest: cached blocks registered right after it.
    orphan : int
        1 if the block's parent content is no longer registered: no prompt can reach the block
        through a prefix any more.
    next_use : int
        The hint given with ``set_next_use`` (-1: none). The simulator gives a policy made with
        ``hindsight=True`` the trace position of the block's next use.
    tag : int
        The tag given with ``set_tags``, or by the release of a sequence tagged with
        ``set_sequence_tags`` that cached the block, whichever came later (0 until then; reset
        when the block is registered).
    length : int
        Tokens of the sequence whose release cached the block, at that release.
    block_size : int
        Tokens per block.
    """

    block: int
    hits: int
    stamp: int
    clock: int
    age: int
    depth: int
    children: int
    orphan: int
    next_use: int
    tag: int
    length: int
    block_size: int


#: Fields of the feature record, in the order the kernels write them.
FEATURES = BlockFeatures._fields
NUM_FEATURES = len(FEATURES)

#: The feature whose change each ``REKEY_*`` trigger of the kernels stands for.
_REKEY_BITS = {
    "children": REKEY_CHILDREN,
    "orphan": REKEY_ORPHAN,
    "next_use": REKEY_NEXT_USE,
    "tag": REKEY_TAG,
}
# Instructions that read one local variable by name.
_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_FAST_BORROW")
# Fused instructions (Python 3.13 on) that name two locals, the one pushed last second:
# ``LOAD_FAST_LOAD_FAST (a, b)`` loads both, ``STORE_FAST_LOAD_FAST (a, b)`` stores ``a``
# and loads ``b``. An attribute read right after applies to ``b``.
_FUSED_LOADS = ("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "STORE_FAST_LOAD_FAST")


def _attributes_read(fn) -> frozenset[str]:
    """The features ``fn(f)`` reads as ``f.name``; all of them if ``f`` is used otherwise.

    The kernels keep only the features read (:meth:`PriorityPolicy.stored_features`), so a
    use of ``f`` this cannot follow (stored, passed on, indexed, captured, or named by an
    instruction it does not know) counts as reading every feature.
    """
    every = frozenset(FEATURES)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount != 1:
        return every
    arg = code.co_varnames[0]
    if arg in code.co_cellvars:  # captured by an inner function
        return every
    ins = list(dis.get_instructions(code))
    reads = set()
    for i, op in enumerate(ins):
        names = op.argval if isinstance(op.argval, tuple) else (op.argval,)
        if arg not in names:
            continue
        if op.opname in _LOADS:
            pass
        elif op.opname in _FUSED_LOADS and names[1] == arg and names[0] != arg:
            pass  # the argument pushed last: its attribute may follow
        else:
            return every  # stored, deleted, fused otherwise, or an instruction not known here
        after = ins[i + 1] if i + 1 < len(ins) else None
        if after is None or after.opname != "LOAD_ATTR" or after.argval not in every:
            return every
        reads.add(after.argval)
    return frozenset(reads)


class PriorityPolicy:
    """An eviction policy given by a priority over :class:`BlockFeatures` (smallest evicted).

    Parameters
    ----------
    priority : callable
        ``priority(features) -> int``, a numba ``@njit`` function or a plain function that numba
        can compile. It must not raise, and should be pure: it may be called again for a block
        whose features changed.
    name : str
        The policy's name, as ``mgr.eviction``, the simulator's reports and the sweep rows show
        it. Must not be the name of a built-in policy.
    leaves_only : bool, default False
        Only leaves of the cached prefix forest (cached blocks with no cached child) are
        candidates, as in SGLang's radix cache: a prefix is never cut above a cached suffix.
    hindsight : bool, default False
        The policy reads ``next_use`` as the simulator's future knowledge: a simulator option
        only (the simulator then gives each block the position of its next use).

    Examples
    --------
    >>> from numba import njit
    >>> @njit
    ... def oldest_first(f):
    ...     return f.stamp
    >>> fifo_like = PriorityPolicy(oldest_first, name="by-stamp")
    >>> fifo_like.name
    'by-stamp'
    """

    def __init__(self, priority, *, name: str, leaves_only: bool = False, hindsight=False):
        from kvnumba.eviction import BUILTIN_POLICIES

        if not callable(priority):
            raise TypeError(f"priority must be callable, got {type(priority).__name__}")
        if not isinstance(name, str) or not name or name in BUILTIN_POLICIES:
            raise ValueError(
                f"a priority policy needs a name other than a built-in policy's, got {name!r}"
            )
        self.name = name
        self.leaves_only = bool(leaves_only)
        self.hindsight = bool(hindsight)
        self.priority = priority if isinstance(priority, CPUDispatcher) else njit(priority)
        self._address: int | None = None
        self._callback: Any = None
        self._reads: frozenset[str] | None = None

    def __repr__(self) -> str:
        return (
            f"PriorityPolicy({getattr(self.priority, '__name__', '?')}, name={self.name!r}, "
            f"leaves_only={self.leaves_only}, hindsight={self.hindsight})"
        )

    def __getstate__(self):
        # The compiled callback belongs to this process; another one compiles its own.
        state = self.__dict__.copy()
        state["_address"], state["_callback"] = None, None
        return state

    def python_priority(self, features: BlockFeatures) -> int:
        """The priority of ``features`` computed by the function run as Python (the reference
        model's way).

        Parameters
        ----------
        features : BlockFeatures
            The block's features.

        Returns
        -------
        int
        """
        fn = getattr(self.priority, "py_func", self.priority)
        return int(fn(features))

    def features_read(self) -> frozenset[str]:
        """The features the priority function reads, from its bytecode: the attributes it
        loads from its argument. Every feature when the argument is used in any other way
        (passed on, indexed, unpacked, captured, reassigned), so the answer never leaves out a
        feature the function depends on.

        Returns
        -------
        frozenset of str
            Names of :class:`BlockFeatures` fields.
        """
        if self._reads is None:
            fn = getattr(self.priority, "py_func", self.priority)
            self._reads = _attributes_read(fn)
        return self._reads

    def rekey_triggers(self) -> int:
        """The feature changes after which the kernels compute a cached block's priority again
        (``REKEY_*`` bits of ``kvnumba._layout``): those of a feature the function reads, and all
        of them if it reads ``clock`` or ``age``, whose values differ at every call. Skipping
        the others cannot change a priority, so it changes no victim.

        Returns
        -------
        int
        """
        reads = self.features_read()
        if reads & {"clock", "age"}:
            return sum(_REKEY_BITS.values())
        return sum(bit for name, bit in _REKEY_BITS.items() if name in reads)

    def needs_forest(self) -> bool:
        """Whether the kernels keep the cached prefix forest for this policy: with
        ``leaves_only``, or when a feature the function reads depends on it (``orphan``,
        ``children``) or makes a block be keyed again when the forest changes (``clock``,
        ``age``: :meth:`rekey_triggers`). Without it a block costs 24 bytes less and a release
        into the cache or out of it skips the forest's links.

        Returns
        -------
        bool
        """
        return self.leaves_only or bool(self.rekey_triggers() & (REKEY_ORPHAN | REKEY_CHILDREN))

    def stored_features(self) -> int:
        """The features the kernels keep per cached block for this policy: bit ``i`` set for
        ``kvnumba._layout.PRIORITY_STORED[i]`` when the function reads it. The others (and the
        features computed when called: ``block``, ``stamp``, the clocks, ``children``,
        ``orphan``, ``block_size``) cost no bytes per block; the function is called with a
        placeholder for a feature it does not read.

        Returns
        -------
        int
        """
        reads = self.features_read()
        return sum(1 << i for i, name in enumerate(PRIORITY_STORED) if name in reads)

    def address(self) -> int:
        """The address the kernels call (compiled on first use, once per process).

        Returns
        -------
        int
            A C function ``int64 (int64 *record)``; under ``NUMBA_DISABLE_JIT`` a key of the
            Python registry the kernels, then run as Python, look the function up in.
        """
        if self._address is None:
            if config.DISABLE_JIT:  # type: ignore[attr-defined]  # set at run time
                self._address = _register_python(self)
            else:
                self._callback = _compile_callback(self.priority)
                self._address = int(self._callback.address)
        return self._address


def priority_policy(name: str, *, leaves_only: bool = False, hindsight: bool = False):
    """Decorator: a :class:`PriorityPolicy` named ``name`` from a priority function.

    Parameters
    ----------
    name : str
        The policy's name.
    leaves_only, hindsight : bool
        As for :class:`PriorityPolicy`.

    Returns
    -------
    callable
        ``decorator(priority) -> PriorityPolicy``.

    Examples
    --------
    >>> @priority_policy("hit-aware-lru")
    ... def hit_aware(f):
    ...     return f.stamp + 1000 * f.hits
    >>> hit_aware.leaves_only
    False
    """

    def decorate(priority) -> PriorityPolicy:
        return PriorityPolicy(priority, name=name, leaves_only=leaves_only, hindsight=hindsight)

    return decorate


def resolve(spec) -> PriorityPolicy:
    """The priority policy ``spec`` names.

    Parameters
    ----------
    spec : PriorityPolicy or str
        A policy object, the name of a policy of :mod:`kvnumba.policies`, or
        ``"package.module:attribute"`` naming a :class:`PriorityPolicy` (how the command line,
        the sweeps' workers and a configuration file name a policy of their own).

    Returns
    -------
    PriorityPolicy

    Raises
    ------
    ValueError
        If ``spec`` names nothing of the kind.
    """
    if isinstance(spec, PriorityPolicy):
        return spec
    if isinstance(spec, str) and ":" in spec:
        module, _, attribute = spec.partition(":")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load eviction policy {spec!r}: {exc}") from None
        if not isinstance(found, PriorityPolicy):
            raise ValueError(f"{spec!r} is a {type(found).__name__}, not a PriorityPolicy")
        return found
    from kvnumba.policies import SHIPPED

    if isinstance(spec, str) and spec in SHIPPED:
        return SHIPPED[spec]
    raise ValueError(f"{spec!r} names no priority policy")


# --- compiling the callback ------------------------------------------------------------------
def _compile_callback(priority):
    """``priority`` wrapped as a C callback ``int64 (int64 *record)``."""
    from numba import carray, cfunc

    @cfunc(types.int64(types.CPointer(types.int64)))
    def wrapper(p):
        r = carray(p, (NUM_FEATURES,))
        features = BlockFeatures(
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11]
        )
        return np.int64(priority(features))

    return wrapper


#: Under ``NUMBA_DISABLE_JIT``: the policies the Python kernels call, by their key.
_PYTHON_PRIORITIES: dict[int, PriorityPolicy] = {}


def _register_python(policy: PriorityPolicy) -> int:
    key = len(_PYTHON_PRIORITIES) + 1
    _PYTHON_PRIORITIES[key] = policy
    return key


def call_python(key: int, record) -> int:
    """The priority of the policy registered under ``key`` for a feature record (the kernels'
    call when they run as Python)."""
    return _PYTHON_PRIORITIES[int(key)].python_priority(BlockFeatures(*(int(x) for x in record)))
