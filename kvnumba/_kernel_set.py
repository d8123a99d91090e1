"""``KernelSet``: the entry kernels one manager calls, each an attribute named after it.

``manager.append`` calls ``kernels.k_append``, which is ``kvnumba._kernels.entry.k_append``
compiled for the facade's argument types (:func:`kvnumba.kernels.compiled`), or its page
variant ``k_append_paged`` on a page pool. One loading rule: an attribute starts as a
:class:`Lazy` loader that compiles the kernel (or loads it from numba's cache) on first use and
puts the compiled kernel in its place, so a program pays only for the kernels it calls. A
manager on a page pool loads the quick start's kernels at construction and the pipeline loads
any other before it takes the pool's lock, so that no process waits on the lock while another
compiles.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from kvnumba.kernels import LAZY, ONE_REQUEST, SIGNATURES, compiled

#: Entry kernels a manager can call, by their plain names (a page pool's variant is bound under
#: the plain name).
KERNEL_NAMES = tuple(name for name in SIGNATURES if not name.endswith("_paged"))

#: A compiled entry kernel (a numba dispatcher), a :class:`Lazy` loader, or ``_closed``: each
#: takes the call's inputs, then the arenas, and returns its status and outputs.
Kernel = Callable[..., Any]

# (entry kernel name, policy) -> compiled entry point, shared by all managers.
_LOADED: dict = {}


def load(name: str, policy: bool = False):
    """The compiled entry kernel ``name`` (its version for an eviction policy other than LRU
    with ``policy``), compiled or loaded from numba's cache once per process."""
    kernel = _LOADED.get((name, policy))
    if kernel is None:
        kernel = _LOADED[name, policy] = compiled(name, policy)
    return kernel


class Lazy:
    """Stands for an entry kernel until its first use, then puts the compiled one in its place.

    Parameters
    ----------
    owner : KernelSet
        The set whose attribute this is.
    attribute : str
        The attribute (the kernel's plain name).
    name : str
        The entry kernel to load (the page variant's name on a page pool).
    policy : bool
        Whether to load its version for an eviction policy other than LRU.
    """

    __slots__ = ("owner", "attribute", "name", "policy")

    def __init__(self, owner: KernelSet, attribute: str, name: str, policy: bool = False):
        # Weakly: the set holds its loaders, and a cycle would keep a dropped manager's parts
        # alive until the garbage collector ran.
        self.owner = weakref.ref(owner)
        self.attribute, self.name, self.policy = attribute, name, policy

    def load(self):
        """Compile or load the kernel now and bind it in the owner; returns it."""
        kernel = load(self.name, self.policy)
        owner = self.owner()
        if owner is not None:
            setattr(owner, self.attribute, kernel)
        return kernel

    def __call__(self, *args):
        return self.load()(*args)


def _closed(*args):
    raise ValueError("the block manager is closed")


class KernelSet:
    """The entry kernels of one manager (attributes ``k_append``, ``k_admit``, ...).

    Parameters
    ----------
    paged : bool
        Whether the manager is on a page pool: each kernel with a page variant is bound to it
        and takes the pool's arena after the manager's two (``Arenas.call_args``).
    policy : bool
        Whether its eviction policy is not LRU: each kernel is bound to its policy version,
        but the one-request kernels, which have none (such a manager calls only their lookup,
        which reads the state).
    """

    # Every kernel attribute, declared (``__init__`` binds each by the one rule below; the
    # module's last line checks that this list and ``kvnumba.kernels.SIGNATURES`` agree).
    k_new_sequences: Kernel
    k_append: Kernel
    k_can_append: Kernel
    k_admit: Kernel
    k_fork: Kernel
    k_release: Kernel
    k_block_tables: Kernel
    k_seq_lens: Kernel
    k_check: Kernel
    k_rollback: Kernel
    k_truncate: Kernel
    k_release_window: Kernel
    k_evict: Kernel
    k_reset_prefix_cache: Kernel
    k_admit_keys: Kernel
    k_lookup: Kernel
    k_lookup_keys: Kernel
    k_set_keys: Kernel
    k_append_one: Kernel
    k_append_one_keys: Kernel
    k_admit_one: Kernel
    k_admit_one_keys: Kernel
    k_lookup_one: Kernel
    k_lookup_one_keys: Kernel
    k_give_up: Kernel
    k_commit_give_up: Kernel
    k_set_next_use: Kernel
    k_set_tags: Kernel
    k_set_sequence_tags: Kernel

    __slots__ = (*KERNEL_NAMES, "__weakref__")

    def __init__(self, paged: bool, policy: bool = False):
        for name in KERNEL_NAMES:
            version = policy and name not in ONE_REQUEST
            entry = name + "_paged" if paged and name + "_paged" in SIGNATURES else name
            if (entry, version) in _LOADED:
                setattr(self, name, _LOADED[entry, version])
            elif paged and name not in LAZY and name not in ONE_REQUEST:
                # Compiled now, never under the page pool's lock (other processes would wait).
                setattr(self, name, load(entry, version))
            else:
                setattr(self, name, Lazy(self, name, entry, version))

    def close(self) -> None:
        """Make every kernel raise ``ValueError`` (a closed manager)."""
        for name in KERNEL_NAMES:
            setattr(self, name, _closed)


def ready(kernel):
    """``kernel`` compiled: a :class:`Lazy` loader is loaded now (before a lock is taken)."""
    return kernel.load() if type(kernel) is Lazy else kernel


if tuple(KernelSet.__annotations__) != KERNEL_NAMES:
    raise ImportError("KernelSet's declared kernels differ from kvnumba.kernels.SIGNATURES")
