"""``CallPipeline``: the one path of every state-changing call, written once.

A state-changing entry kernel either commits or changes nothing and returns a status. The
pipeline runs it; grows the scratch records and retries while the kernel asks for room
(``ST_NEED_BUFFERS``); has a failed logged call undone (``k_rollback``); on a page pool, runs
the call under the pool's lock with the coordinator's reclaim (:class:`PageSide`); turns a
failure into its typed exception (``errors.STATUS_ERRORS``); and, once the call committed,
keeps its block events and delivers its callbacks (``CallbackError`` carries the result).
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from kvnumba import errors as E
from kvnumba._kernel_set import Lazy, ready
from kvnumba._layout import M_ID_TAG, M_SLOT_TOP, S_FAILED, S_LOG_ON
from kvnumba.ids import split_id
from kvnumba.kernels import bad_of, count_of, head_of, needed_of, status_of, values_of


def part_call(part: str, method):
    """A public call of ``BlockManager`` served wholly by one of its parts (the manager's
    attribute ``part``): ``method``, with its signature and docstring, called on that part."""
    name = method.__name__

    def call(self, *args, **kwargs):
        return getattr(getattr(self, part), name)(*args, **kwargs)

    return functools.update_wrapper(call, method)


class Facts:
    """What an error message needs to know of a manager (:class:`kvnumba.errors.ManagerFacts`),
    and whether an id names one of its live sequences.

    Parameters
    ----------
    arenas : Arenas
        The manager's arenas (counters and reference counts).
    kernels : KernelSet
        Its kernels (a sequence's length is read through ``k_seq_lens``).
    """

    def __init__(self, arenas, kernels):
        g = arenas.geometry
        self.block_size = g.block_size
        self.max_seq_len = g.max_seq_len
        self.max_seqs = g.max_seqs
        self.num_blocks = g.num_blocks
        self._arenas = arenas
        self._kernels = kernels

    def seq_len(self, seq_id: int) -> int:
        """Tokens held by the live sequence ``seq_id``."""
        ids = np.array([seq_id], dtype=np.int64)
        return int(values_of(self._kernels.k_seq_lens(ids, *self._arenas.args))[0])

    def ref(self, block: int) -> int:
        """Reference count of ``block``."""
        return int(self._arenas.s.ref[block])

    def free_slots(self) -> int:
        """Sequence slots not in use."""
        return int(self._arenas.s.meta[M_SLOT_TOP])

    def is_live(self, seq_id: int) -> bool:
        """Whether ``seq_id`` names a live sequence of this manager."""
        seq_id = operator.index(seq_id)
        if seq_id < 0:
            return False
        tag, generation, slot = split_id(seq_id, self.max_seqs)
        s = self._arenas.s
        if tag != s.meta[M_ID_TAG] or slot >= self.max_seqs:
            return False
        return bool(s.seq_live[slot]) and generation == s.seq_gen[slot]


def failure(facts, status, bad, needed=0, available=0, requested=0, **inputs) -> Exception:
    """The typed exception of a failed kernel call (``errors.STATUS_ERRORS``).

    Parameters
    ----------
    facts : Facts
        The manager's geometry and lookups.
    status, bad : int
        The kernel's status and offending input index.
    needed, available : int
        Blocks, for ``PoolExhausted``.
    requested : int
        New sequences asked for, for ``TooManySequences``.
    **inputs
        The call's inputs by name.
    """
    return E.error_for(E.Failure(status, bad, inputs, facts, needed, available, requested))


def deliver_evictions(arenas, on_evict) -> None:
    """Call ``on_evict`` with copies of the last call's eviction records, if there are any."""
    if on_evict is not None:
        records = arenas.evictions()
        if records is not None:
            on_evict(*records)


class CallPipeline:
    """Runs a manager's calls: retry, rollback, typed errors, events and callbacks.

    Parameters
    ----------
    arenas : Arenas
    kernels : KernelSet
    events : EngineKeys
        Keeps the block events of committed calls.
    facts : Facts
        What error messages read of the manager.
    on_evict : callable or None
        The manager's eviction callback.
    pages : PageSide or None
        The page-pool part of a manager on a page pool.

    Attributes
    ----------
    failed_calls : int
        Calls that failed for lack of blocks, and non-atomic calls that served only part of
        their input (``Stats.failed_calls``).
    """

    def __init__(self, arenas, kernels, events, facts, on_evict, pages=None):
        self.arenas = arenas
        self.kernels = kernels
        self.events = events
        self.facts = facts
        self.on_evict = on_evict
        self.pages = pages
        self.failed_calls = 0

    def run(self, kernel, inputs, *, atomic=True, grow=None, build=None, first=None, **context):
        """Run one state-changing entry kernel to its end.

        Parameters
        ----------
        kernel : callable
            A ``KernelSet`` attribute; called as ``kernel(*inputs, *arenas.call_args)``.
        inputs : tuple
            The call's converted inputs.
        atomic : bool
            Whether the call is all-or-nothing (a page pool reclaims only for such calls).
        grow : callable, optional
            ``grow(result)`` makes room after ``ST_NEED_BUFFERS``; the call is then retried.
        build : callable, optional
            Makes the call's result from the kernel's result, through the getters of its
            layout (``kvnumba.kernels.RESULTS``).
        first : tuple, optional
            The result of a first try the caller made already (without a page pool).
        **context
            The inputs by name, for the error message (``errors.Failure.inputs``).

        Returns
        -------
        object
            ``build(result)``, or None without ``build``.
        """
        if type(kernel) is Lazy:
            kernel = kernel.load()
        arenas = self.arenas
        pages = self.pages
        if pages is None:
            # The common case first: one try that commits, without the retry loop's closure.
            result = kernel(*inputs, *arenas.call_args) if first is None else first
            if status_of(result) == 0:
                if not atomic and arenas.scr[S_FAILED]:  # set by a partial append or admit
                    self.failed_calls += 1
                out = None if build is None else build(result)
                if self.on_evict is not None or self.events.chunks is not None:
                    self.after_commit(out)
                return out
            first = result

        def until_buffers_fit(result=None):
            while True:
                if result is None:
                    result = kernel(*inputs, *arenas.call_args)
                status = status_of(result)
                if status and arenas.scr[S_LOG_ON]:
                    # A logged call that failed leaves its undo to the facade (k_rollback).
                    self.kernels.k_rollback(*arenas.call_args)
                if status != E.ST_NEED_BUFFERS or grow is None:
                    return result
                grow(result)
                result = None

        if pages is None:
            result, givers, pending = until_buffers_fit(first), (), None
        else:
            pending = pages.orphans_first()
            result, givers = pages.run_with_reclaim(until_buffers_fit, atomic)
        if status_of(result):
            self.fail(*head_of(result), **context)
        if not atomic and arenas.scr[S_FAILED]:  # set by a partial append or admit only
            self.failed_calls += 1
        out = None if build is None else build(result)
        if pages is None:
            self.after_commit(out)
        else:
            self.events.collect()
            pages.deliver(givers, out, pending)
        return out

    def run_evicting(self, kernel, inputs, **named) -> int:
        """Run ``evict`` or ``reset_prefix_cache``: returns the blocks evicted."""
        arenas = self.arenas
        return self.run(
            kernel,
            inputs,
            grow=lambda result: arenas.grow_records(needed_of(result)),
            build=lambda result: int(count_of(result)),
            **named,
        )

    def read(self, kernel, ids: np.ndarray) -> np.ndarray:
        """Run a read-only kernel over sequence ids (``k_block_tables``, ``k_seq_lens``)."""
        result = ready(kernel)(ids, *self.arenas.args)
        if status_of(result):
            self.fail(status_of(result), bad_of(result), ids=ids)
        return values_of(result)

    def can_append(self, ids: np.ndarray, counts: np.ndarray) -> bool:
        """``BlockManager.can_append`` without a page pool (``PageSide.can_append`` with)."""
        status, bad, need, available = head_of(
            self.kernels.k_can_append(ids, counts, *self.arenas.args)
        )
        if status:
            self.fail(status, bad, ids=ids, counts=counts)
        return bool(need <= available)

    def after_commit(self, out, pending=None) -> None:
        """A committed call without a page pool: keep its events, call ``on_evict``."""
        if self.events.chunks is not None:
            self.events.collect()
        if self.on_evict is not None:
            deliver_all((self.deliver_evictions,), out, pending)

    def fail(self, status, bad, needed=0, available=0, requested=0, **inputs):
        """Raise the typed exception of a failed call (:func:`failure`); a call that failed
        for lack of blocks counts in ``failed_calls``."""
        if status == E.ST_POOL_EXHAUSTED:
            self.failed_calls += 1
        raise failure(self.facts, status, bad, needed, available, requested, **inputs)

    def deliver_evictions(self) -> None:
        """Call ``on_evict`` with copies of the last call's eviction records, if any."""
        deliver_evictions(self.arenas, self.on_evict)


def deliver_all(deliveries, result=None, pending=None) -> None:
    """Run every callback delivery of a committed call, even if one raises.

    Parameters
    ----------
    deliveries : sequence of callables
        Each delivers one callback of the call.
    result : object
        The call's result, carried by the ``CallbackError``.
    pending : Exception, optional
        A callback error raised earlier in the same call (it comes first).

    Raises
    ------
    CallbackError
        With the first callback exception as ``__cause__``, after every delivery ran.
    """
    error = pending
    for deliver in deliveries:
        try:
            deliver()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
            if error is None:
                error = exc
    if error is not None:
        raise E.CallbackError(result) from error
