"""The two kinds of helper of the kernel layer, as decorators.

Entry kernels (:mod:`.entry`, and the page pool's three in :mod:`.physical_pages`) are plain
``@njit(cache=True)``: the facade calls them. Every other compiled function is a helper,
compiled without numba's runtime (NRT) and without the Python and C wrappers numba would
otherwise build (for a helper taking the forty views those wrappers are larger than its body,
and compiling them was a large part of the quick start):

- :func:`inlined`: LLVM always inlines it into its caller (numba's ``forceinline``). numba
  types and optimises its body once; a call site costs numba nothing and LLVM a little, and
  after inlining the views it takes are registers again: the hot path is as fast as with
  numba's own ``inline="always"``, which re-translates and re-types the body at every call
  site (that was most of the compile time).
- :func:`out_of_line`: a real call, for cold code (page bookkeeping, copy-on-write, rollback)
  and for bodies shared by several entries (the general path of ``append`` and ``admit``).

A helper with integer parameters states its signature: numba would otherwise compile it once
per combination of argument types, and types a constant argument (``FIELD.ref``) as its own
literal type, so that one ``log_write`` came in 29 versions.

Two rules follow. A helper cannot be called from Python (there is no wrapper; the process would
crash): tests call helpers from a small ``@njit`` driver. And a function compiled with NRT must
not receive arrays from a helper (they come without the references NRT would release): the
few array-returning functions NRT code needs (``pool_views``, ``scratch_slots``) are inlined at
numba's IR level instead.
"""

import inspect

from numba import njit
from numba.core.dispatcher import Dispatcher

_HELPER = dict(cache=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)


# Helpers with a stated signature, in decoration order (a helper's callees come first), and
# those signatures. They are compiled when the first kernel of a process is loaded
# (:func:`compile_stated`), not at import, so that importing the package writes no cache file;
# numba then refuses them other argument types. Each signature taking the views also gets its
# twin with the views of a manager on a page pool (:data:`.versions.VIEWS_PAGED`) or with another
# eviction policy, but only when such a kernel is first compiled (:func:`compile_twins`), so
# that a program without a page pool or with LRU never compiles them.
_STATED: list = []
_COMPILED: list = []  # the same, once compiled: the sources of their twins
_TWINS: set = set()  # views types whose twins are compiled


def _decorator(options, signatures):
    if inspect.isfunction(signatures):  # used bare: @inlined
        return njit(**options)(signatures)
    if signatures is None:
        return njit(**options)

    def decorate(func):
        dispatcher = njit(**options)(func)
        if isinstance(dispatcher, Dispatcher):  # not under NUMBA_DISABLE_JIT
            _STATED.append((dispatcher, signatures))
        return dispatcher

    return decorate


def _signatures(signatures) -> list:
    return signatures if isinstance(signatures, list) else [signatures]


def compile_stated() -> None:
    """Compile (or load from numba's cache) every helper's stated signatures, then refuse
    other argument types; a no-op once done. Runs before the first kernel is compiled."""
    for dispatcher, signatures in _STATED:
        for signature in _signatures(signatures):
            dispatcher.compile(signature)
        dispatcher.disable_compile(True)
        _COMPILED.append((dispatcher, signatures))
    _STATED.clear()


def compile_twins(views_type) -> None:
    """Give every helper with a stated signature its twin for another kind of manager's views
    (``views_type``: :data:`.versions.VIEWS_PAGED`, or the views of a manager with another eviction
    policy, :data:`.versions.VIEWS_POLICY`), so that its kernels compile the helpers' versions for
    those views. A twin is added by allowing one more compile (``disable_compile``). Called
    before such a kernel is compiled; a no-op once done for ``views_type``.
    """
    from kvnumba._kernels.views import VIEWS

    compile_stated()
    if views_type in _TWINS:
        return
    _TWINS.add(views_type)
    for dispatcher, signatures in _COMPILED:
        for signature in _signatures(signatures):
            if VIEWS not in signature.args:
                continue
            args = [views_type if arg == VIEWS else arg for arg in signature.args]
            dispatcher.disable_compile(False)
            try:
                dispatcher.compile(signature.return_type(*args))
            finally:
                dispatcher.disable_compile(True)


def inlined(signatures=None):
    """Compile a helper that LLVM inlines at every call site.

    Parameters
    ----------
    signatures : numba signature or list of them, optional
        The helper's explicit signature(s); without one it is compiled per argument types.
        ``@inlined`` may be used without parentheses.
    """
    # forceinline is set on both kinds: numba passes an unset flag on from the function being
    # compiled to the helpers it compiles on the way.
    return _decorator({**_HELPER, "forceinline": True}, signatures)


def out_of_line(signatures=None):
    """Compile a helper that stays a function of its own (compiled once, called).

    Parameters
    ----------
    signatures : numba signature or list of them, optional
        As for :func:`inlined`.
    """
    return _decorator({**_HELPER, "forceinline": False}, signatures)
