"""Carving the named arrays out of the two arenas of :mod:`kvnumba._state`.

Workers are compiled without NRT, so the views made here carry no reference counting and cost a
few pointer computations; unused ones are optimised away.
"""

import numpy as np
from numba import njit

from kvnumba._state import HEADER_BYTES, HEADER_SLOTS


@njit(cache=True, _nrt=False, inline="always")
def _field(arena, header, i):
    offset = header[HEADER_SLOTS * i]
    return arena[offset : offset + header[HEADER_SLOTS * i + 1]]


@njit(cache=True, _nrt=False, inline="always")
def _shape(header, i):
    return header[HEADER_SLOTS * i + 2], header[HEADER_SLOTS * i + 3]


@njit(cache=True, _nrt=False, inline="always")
def unpack(arena, scratch):
    """Named views of both arenas, in ``State`` field order then ``SCRATCH_FIELDS`` order."""
    h = arena[:HEADER_BYTES].view(np.int64)
    g = scratch[:HEADER_BYTES].view(np.int64)
    return (
        _field(arena, h, 0).view(np.int32),  # ref
        _field(arena, h, 1).view(np.int32),  # lru_prev
        _field(arena, h, 2).view(np.int32),  # lru_next
        _field(arena, h, 3).view(np.int32),  # free_stack
        _field(arena, h, 4).view(np.uint64),  # block_hash
        _field(arena, h, 5).view(np.int64),  # block_salt
        _field(arena, h, 6).view(np.uint8),  # block_flags
        _field(arena, h, 7).view(np.int64).reshape(_shape(h, 7)),  # tokens
        _field(arena, h, 8).view(np.int32),  # htab
        _field(arena, h, 9).view(np.int32).reshape(_shape(h, 9)),  # seq_table
        _field(arena, h, 10).view(np.int64),  # seq_len
        _field(arena, h, 11).view(np.int64),  # seq_gen
        _field(arena, h, 12).view(np.int64),  # seq_salt
        _field(arena, h, 13).view(np.uint8),  # seq_live
        _field(arena, h, 14).view(np.int32),  # slot_stack
        _field(arena, h, 15).view(np.int64),  # meta
        _field(scratch, g, 0).view(np.int64).reshape(_shape(g, 0)),  # ulog
        _field(scratch, g, 1).view(np.int64),  # ev_ids
        _field(scratch, g, 2).view(np.uint64),  # ev_hash
        _field(scratch, g, 3).view(np.int64).reshape(_shape(g, 3)),  # ev_tok
        _field(scratch, g, 4).view(np.int64),  # seq_mark
        _field(scratch, g, 5).view(np.int64),  # scr
        _field(scratch, g, 6).view(np.int64),  # meta_save
    )


@njit(cache=True, _nrt=False, inline="always")
def unpack_pages(arena, scratch):
    """Views of the page-pool fields: ``pages, page_stamp, block_next, buckets, map_rec,
    unmap_rec`` (empty without a page pool)."""
    h = arena[:HEADER_BYTES].view(np.int64)
    g = scratch[:HEADER_BYTES].view(np.int64)
    return (
        _field(arena, h, 16).view(np.int32).reshape(_shape(h, 16)),  # pages
        _field(arena, h, 17).view(np.int64),  # page_stamp
        _field(arena, h, 18).view(np.int32),  # block_next
        _field(arena, h, 19).view(np.int32),  # buckets
        _field(scratch, g, 7).view(np.int64).reshape(_shape(g, 7)),  # map_rec
        _field(scratch, g, 8).view(np.int64).reshape(_shape(g, 8)),  # unmap_rec
    )


@njit(cache=True, inline="always")
def scratch_slots(scratch):
    """The scratch ``slots`` field (``max_seqs`` int64): room for the slots of a call's ids.

    A call with more than ``max_seqs`` ids repeats one or names an unknown one, and validation
    stops there before writing past ``max_seqs`` entries.
    """
    g = scratch[:HEADER_BYTES].view(np.int64)
    return _field(scratch, g, 9).view(np.int64)
