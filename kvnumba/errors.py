"""Exception hierarchy of kvnumba and the kernel status codes that map onto it.

Kernels never raise: they return one of the ``ST_*`` integers below (plus the index of the
offending input element where that helps the message). The facade turns a non-zero status into
the typed exception with the numbers a user needs through one table, :data:`STATUS_ERRORS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

# Kernel status codes. 0 is success; every other value names one failure.
ST_OK = 0
ST_POOL_EXHAUSTED = 1
ST_UNKNOWN_SEQ = 2
ST_RELEASED_SEQ = 3
ST_TOO_LONG = 4
ST_TOO_MANY_SEQS = 5
ST_DUPLICATE_ID = 6
ST_NEED_BUFFERS = 7  # scratch buffers too small for this call; the facade grows them and retries
ST_NEGATIVE_COUNT = 8
ST_TOKEN_MISMATCH = 9  # len(tokens) differs from the number of tokens the call appends
ST_BAD_TOKEN = 10  # a negative token id (-1 is reserved for "no id")
ST_BAD_LENGTH = 11  # a prompt of length < 1
ST_BAD_NEW_LEN = 12  # truncate, release_window: a length below 0 or above the sequence's
ST_BAD_BLOCK = 13  # evict: a block id outside the pool
ST_BLOCK_IN_USE = 14  # evict: a block that a sequence references
# key_counts[i] outside [0, lengths[i] // block_size], or not summing to len(keys)
ST_BAD_KEY_COUNT = 15
ST_BAD_CAP = 16  # a negative max_hit_blocks
ST_BAD_KEY_POSITION = 17  # set_keys: a position that is not a full block of the sequence
ST_KEY_CONFLICT = 18  # set_keys: a block that already has another key
# truncate: a cut whose window would reach a block that already left it (windowed managers)
ST_WINDOW_GAP = 19


class KVNumbaError(Exception):
    """Base class of every error kvnumba raises on purpose."""


class PoolExhausted(KVNumbaError):
    """The pool cannot supply the blocks a call needs; nothing was changed.

    Parameters
    ----------
    needed : int
        Blocks the call would take (new blocks plus copy-on-write blocks).
    available : int
        Free blocks plus reclaimable cached blocks (plus free pool pages times
        ``blocks_per_page``) at the start of the call.
    """

    def __init__(self, needed: int, available: int, message: str | None = None):
        self.needed = int(needed)
        self.available = int(available)
        super().__init__(
            message
            or f"pool exhausted: the call needs {self.needed} blocks, {self.available} available"
        )


class InvalidSequence(KVNumbaError):
    """An id that names no live sequence of this manager (unknown or released)."""

    def __init__(self, seq_id: int, message: str | None = None):
        self.seq_id = int(seq_id)
        super().__init__(message or f"unknown sequence id {self.seq_id}")


class SequenceReleased(InvalidSequence):
    """The id named a sequence that has been released; ids are never reused."""

    def __init__(self, seq_id: int):
        super().__init__(seq_id, f"sequence {int(seq_id)} has been released")


class SequenceTooLong(KVNumbaError):
    """A sequence would grow beyond ``max_seq_len`` tokens."""

    def __init__(self, seq_id: int, length: int, max_seq_len: int, message: str | None = None):
        self.seq_id = int(seq_id)  # -1 for a prompt of admit, which has no id yet
        self.length = int(length)
        self.max_seq_len = int(max_seq_len)
        super().__init__(
            message
            or f"sequence {self.seq_id} would hold {self.length} tokens, "
            f"more than max_seq_len={self.max_seq_len}"
        )


class TooManySequences(KVNumbaError):
    """More live sequences than ``max_seqs`` would exist."""

    def __init__(self, requested: int, available: int, max_seqs: int):
        self.requested = int(requested)
        self.available = int(available)
        self.max_seqs = int(max_seqs)
        super().__init__(
            f"the call needs {self.requested} new sequences but only {self.available} of "
            f"max_seqs={self.max_seqs} slots are free"
        )


class InvalidGeometry(KVNumbaError, ValueError):
    """Constructor arguments that describe no valid pool."""


class InvalidPosition(KVNumbaError, IndexError):
    """A token position outside a sequence."""


class CallbackError(KVNumbaError):
    """A callback raised after its call committed; the call's result is kept.

    ``on_evict``, ``on_map`` and ``on_unmap`` run after the kernel committed, so the call is not
    undone: every callback of the call still runs once, then this error is raised with the
    first callback exception as ``__cause__``.

    Parameters
    ----------
    result : object
        The call's full result (``AppendResult``, ``AdmitResult``, ...; ``None`` for a call
        that returns nothing).
    message : str, optional
        Replaces the default message.

    Attributes
    ----------
    result : object
        As given.
    """

    def __init__(self, result=None, message: str | None = None):
        self.result = result
        super().__init__(
            message
            or "a callback raised after the call committed; the call's result is in .result "
            "and the callback's exception in __cause__"
        )


class InvariantViolation(KVNumbaError):
    """``check()`` found state that contradicts an invariant; the message names the first one."""


# --- status -> exception ------------------------------------------------------------------------


class ManagerFacts(Protocol):
    """What a message needs to know of the manager whose call failed."""

    block_size: int
    max_seq_len: int
    max_seqs: int
    num_blocks: int

    def seq_len(self, seq_id: int) -> int:
        """Tokens held by the live sequence ``seq_id``."""

    def ref(self, block: int) -> int:
        """Reference count of ``block``."""

    def free_slots(self) -> int:
        """Sequence slots not in use."""


class Failure(NamedTuple):
    """A failed kernel call, as the builders of :data:`STATUS_ERRORS` read it.

    Attributes
    ----------
    status : int
        The kernel's ``ST_*`` code.
    bad : int
        Index of the offending input element (-1 when no single element is at fault).
    inputs : dict
        The call's converted inputs by name (``ids``, ``counts``, ``lengths``, ``tokens``,
        ``new_lens``, ``block_ids``, ``key_counts``, ``caps``, ``starts``), those it has.
    facts : ManagerFacts
        The manager's geometry and lookups.
    needed, available : int
        Blocks, for ``PoolExhausted``.
    requested : int
        New sequences the call asked for, for ``TooManySequences`` (0: one per prompt).
    """

    status: int
    bad: int
    inputs: dict
    facts: ManagerFacts
    needed: int = 0
    available: int = 0
    requested: int = 0


def _at(f: Failure, name: str) -> int:
    return int(f.inputs[name][f.bad])


def _key_count(f: Failure) -> Exception:
    if "starts" in f.inputs:  # set_keys
        ids, starts, counts = f.inputs["ids"], f.inputs["starts"], f.inputs["counts"]
        if f.bad < 0 and starts.shape[0] == ids.shape[0] == counts.shape[0]:
            return ValueError(f"keys has a row count other than sum(counts) = {counts.sum()}")
        return ValueError("starts and counts need one entry per id")
    if f.bad < 0:
        return ValueError("key_counts needs one entry per prompt and must sum to the rows of keys")
    return ValueError(
        f"key_counts[{f.bad}] = {_at(f, 'key_counts')} is outside [0, lengths[{f.bad}] // "
        f"block_size = {_at(f, 'lengths') // f.facts.block_size}]"
    )


def _cap(f: Failure) -> Exception:
    if f.bad < 0:
        return ValueError("max_hit_blocks needs one entry per prompt")
    return ValueError(f"max_hit_blocks[{f.bad}] = {_at(f, 'caps')} is negative")


def _new_len(f: Failure) -> Exception:
    # truncate's new_lens, or release_window's lengths (the tokens it has processed).
    name = "new_lens" if "new_lens" in f.inputs else "lengths"
    if f.inputs[name][f.bad] < 0:
        return ValueError(f"{name}[{f.bad}] = {_at(f, name)} is negative")
    seq_id = _at(f, "ids")
    return ValueError(
        f"{name}[{f.bad}] = {_at(f, name)} exceeds the {f.facts.seq_len(seq_id)} tokens of "
        f"sequence {seq_id}" + ("; truncate never grows a sequence" if name == "new_lens" else "")
    )


def _block_in_use(f: Failure) -> Exception:
    block = _at(f, "block_ids")
    return ValueError(
        f"block {block} (block_ids[{f.bad}]) is referenced by a sequence (refcount "
        f"{f.facts.ref(block)}); only cached blocks can be evicted"
    )


def _token_mismatch(f: Failure) -> Exception:
    ids, counts, lengths = f.inputs.get("ids"), f.inputs.get("counts"), f.inputs.get("lengths")
    if counts is not None and ids is not None and counts.shape != ids.shape:
        return ValueError(f"counts has {counts.shape[0]} entries for {ids.shape[0]} ids")
    if lengths is not None:
        return ValueError(
            f"tokens has {f.inputs['tokens'].shape[0]} entries but lengths sum to "
            f"{sum(int(x) for x in lengths)}"
        )
    total = "" if counts is None else f" ({int(counts.sum())})"
    return ValueError(f"tokens does not hold one id per appended token{total}")


def _too_long(f: Failure) -> Exception:
    limit = f.facts.max_seq_len
    if "lengths" in f.inputs:
        length = _at(f, "lengths")
        return SequenceTooLong(
            -1,
            length,
            limit,
            f"prompt {f.bad} has {length} tokens, more than max_seq_len={limit}",
        )
    seq_id = _at(f, "ids")
    return SequenceTooLong(seq_id, f.facts.seq_len(seq_id) + _at(f, "counts"), limit)


def _too_many(f: Failure) -> Exception:
    lengths = f.inputs.get("lengths")
    requested = f.requested or (0 if lengths is None else lengths.shape[0])
    return TooManySequences(requested, f.facts.free_slots(), f.facts.max_seqs)


def _bad_key_position(f: Failure) -> Exception:
    seq_id, start, count = _at(f, "ids"), _at(f, "starts"), _at(f, "counts")
    full = f.facts.seq_len(seq_id) // f.facts.block_size
    return ValueError(
        f"key positions {start} .. {start + count - 1} of sequence {seq_id} are not all full "
        f"blocks it holds (it has {full} full blocks; a windowed sequence no longer holds "
        "those that left its window)"
    )


#: The typed exception of every non-zero kernel status, built from the failed call.
STATUS_ERRORS: dict[int, Callable[[Failure], Exception]] = {
    ST_POOL_EXHAUSTED: lambda f: PoolExhausted(f.needed, f.available),
    ST_UNKNOWN_SEQ: lambda f: InvalidSequence(_at(f, "ids")),
    ST_RELEASED_SEQ: lambda f: SequenceReleased(_at(f, "ids")),
    ST_TOO_LONG: _too_long,
    ST_TOO_MANY_SEQS: _too_many,
    ST_DUPLICATE_ID: lambda f: ValueError(
        f"sequence id {_at(f, 'ids')} appears more than once in one call"
    ),
    ST_NEGATIVE_COUNT: lambda f: ValueError(f"counts[{f.bad}] = {_at(f, 'counts')} is negative"),
    ST_TOKEN_MISMATCH: _token_mismatch,
    ST_BAD_TOKEN: lambda f: ValueError(f"tokens[{f.bad}] is negative; token ids must be >= 0"),
    ST_BAD_LENGTH: lambda f: ValueError(
        f"lengths[{f.bad}] = {_at(f, 'lengths')}: every prompt needs at least one token"
    ),
    ST_BAD_NEW_LEN: _new_len,
    ST_BAD_BLOCK: lambda f: ValueError(
        f"block_ids[{f.bad}] = {_at(f, 'block_ids')} is outside the pool of "
        f"{f.facts.num_blocks} blocks"
    ),
    ST_BLOCK_IN_USE: _block_in_use,
    ST_BAD_KEY_COUNT: _key_count,
    ST_BAD_CAP: _cap,
    ST_BAD_KEY_POSITION: _bad_key_position,
    ST_KEY_CONFLICT: lambda f: ValueError(
        f"a block of sequence {_at(f, 'ids')} already has another key"
    ),
    ST_WINDOW_GAP: lambda f: ValueError(
        f"new_lens[{f.bad}] = {_at(f, 'new_lens')}: sequence {_at(f, 'ids')} cut to that "
        "length would need blocks that already left its attention window"
    ),
}


def error_for(failure: Failure) -> Exception:
    """The typed exception of ``failure.status`` (:data:`STATUS_ERRORS`).

    Parameters
    ----------
    failure : Failure
        The failed call.

    Returns
    -------
    Exception
        A ``RuntimeError`` for a status the table does not know (a kernel bug).
    """
    build = STATUS_ERRORS.get(failure.status)
    if build is None:  # pragma: no cover - every status a kernel returns is in the table
        return RuntimeError(f"unexpected kernel status {failure.status}")
    return build(failure)
