"""What workers report, by name.

A worker returns one of these NamedTuples (built in compiled code, never boxed) and its caller
reads the fields by name. The entry kernels turn them into the plain tuples the facade reads
through the decoders of ``kvnumba.kernels`` (``RESULTS``): boxing a named tuple at the Python
boundary would cost every call.
"""

from typing import NamedTuple


class Outcome(NamedTuple):
    """What a state-changing worker reports, in the order of an entry kernel's outcome."""

    #: A status code of :mod:`kvnumba.errors`.
    status: int
    #: Index of the offending input (sequence, prompt, token or block), or -1.
    bad: int
    #: Blocks the call takes (for ``ST_POOL_EXHAUSTED``), or record rows it needs
    #: (``ST_NEED_BUFFERS``).
    needed: int
    #: Blocks available when the call started (free plus cached).
    available: int
    #: The worker's own count: copy-on-write pairs written (append), slot-mapping entries
    #: written (admit), blocks registered (set_keys) or evicted (evict, reset).
    count: int


class Status(NamedTuple):
    """A check's verdict: a status code and the index of the offending input, or -1."""

    status: int
    bad: int


class PromptHits(NamedTuple):
    """The cache hits of one prompt, as a lookup of its leading blocks finds them."""

    #: Hit blocks (written to the caller's ``hits``).
    found: int
    #: Hits at refcount 0 (cached blocks the prompt would claim).
    cached: int
    #: Blocks looked up at most (the prefix-cache query count).
    queries: int
