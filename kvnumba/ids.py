"""Sequence ids: ``tag << 47 | generation << slot_bits | slot``.

An id names a slot of one manager and the slot's generation (how many times the slot has been
handed out), so a released id is never mistaken for the slot's next occupant; the **tag** in the
top 16 bits names the manager, so an id of one manager is ``InvalidSequence`` for every other
one of the process. ``slot_bits`` is the width of ``max_seqs - 1`` (at least 1), and the
generation gets the ``47 - slot_bits`` bits between: a slot can be handed out ``2**(47 -
slot_bits) - 1`` times (1.4e11 times for 1024 slots, 65,535 times at the largest ``max_seqs``)
before its generation wraps to 1 and old ids of that slot could name a sequence again.

Tags come from a process-wide counter that skips tags of managers still alive: two live
managers never share one (up to 65,535 of them), and a tag comes round again only after 65,536
managers were created. The kernels read the manager's tag and slot width from ``meta``
(``M_ID_TAG``, ``M_SLOT_BITS``) and the layout constants from here; the facade and the reference
model use the functions.
"""

from __future__ import annotations

import itertools
import threading
import weakref

from kvnumba.errors import InvalidGeometry

#: Bits of the tag, at the top of the (non-negative) int64 id, and where they start.
ID_TAG_BITS = 16
ID_TAG_SHIFT = 63 - ID_TAG_BITS
_TAGS = 1 << ID_TAG_BITS
_counter = itertools.count(1)
_live: set[int] = set()
# Reentrant: a garbage collection inside new_tag can run a collected manager's finalizer
# (_release_tag) in the same thread, which then takes the lock again (it deadlocked tests).
_lock = threading.RLock()


def new_tag(owner: object) -> int:
    """A tag no live manager holds, held until ``owner`` is garbage-collected.

    Parameters
    ----------
    owner : object
        The manager the tag is for (weakly referenced).

    Returns
    -------
    int
        The tag, in ``1 .. 2**16 - 1``.
    """
    with _lock:
        if len(_live) >= _TAGS - 1:
            raise InvalidGeometry(f"more than {_TAGS - 1} live managers in one process")
        while True:
            tag = next(_counter) % _TAGS
            if tag and tag not in _live:
                break
        _live.add(tag)
    weakref.finalize(owner, _release_tag, tag)
    return tag


def _release_tag(tag: int) -> None:
    with _lock:
        _live.discard(tag)


def slot_bits(max_seqs: int) -> int:
    """Bits of an id that hold the slot, for a manager of ``max_seqs`` sequences."""
    return max(1, (max_seqs - 1).bit_length())


def generation_mask(bits: int) -> int:
    """Mask of an id's generation field when its slot takes ``bits`` bits (also the largest
    generation: the kernels compile this function too)."""
    return (1 << (ID_TAG_SHIFT - bits)) - 1


def compose_id(tag: int, generation: int, slot: int, bits: int) -> int:
    """The id of ``slot`` at ``generation`` under ``tag``, the slot taking ``bits`` bits (the
    kernels compile this function too)."""
    return tag << ID_TAG_SHIFT | generation << bits | slot


def generation_limit(max_seqs: int) -> int:
    """Generations an id can tell apart before they wrap (the largest is the limit)."""
    return generation_mask(slot_bits(max_seqs))


def next_generation(generation: int, max_seqs: int) -> int:
    """The generation after ``generation``: one more, wrapping from the limit back to 1."""
    return generation % generation_limit(max_seqs) + 1


def make_id(tag: int, generation: int, slot: int, max_seqs: int) -> int:
    """The id of ``slot`` at ``generation`` in the manager tagged ``tag``."""
    return compose_id(tag, generation, slot, slot_bits(max_seqs))


def split_id(seq_id: int, max_seqs: int) -> tuple[int, int, int]:
    """``(tag, generation, slot)`` of a non-negative id (inverse of :func:`make_id`)."""
    bits = slot_bits(max_seqs)
    return (
        seq_id >> ID_TAG_SHIFT,
        (seq_id >> bits) & generation_mask(bits),
        seq_id & ((1 << bits) - 1),
    )
