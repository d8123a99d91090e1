"""Exception hierarchy of kvnumba and the kernel status codes that map onto it.

Kernels never raise: they return one of the ``ST_*`` integers below (plus the index of the
offending input element where that helps the message). The facade turns a non-zero status into
the typed exception with the numbers a user needs.
"""

from __future__ import annotations

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
ST_BAD_NEW_LEN = 12  # truncate: a new length below 0 or above the sequence's length
ST_BAD_BLOCK = 13  # evict: a block id outside the pool
ST_BLOCK_IN_USE = 14  # evict: a block that a sequence references
ST_BAD_KEY_COUNT = (
    15  # key_counts[i] outside [0, lengths[i] // block_size], or not summing to len(keys)
)
ST_BAD_CAP = 16  # a negative max_hit_blocks
ST_BAD_KEY_POSITION = 17  # set_keys: a position that is not a full block of the sequence
ST_KEY_CONFLICT = 18  # set_keys: a block that already has another key


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
