"""Intrusive doubly linked lists in arrays, and the three lists of a manager.

A list is two link arrays (``prev``, ``nxt``, indexed by node) and its ends: the head at
``ends[head_i]`` and, for lists appended at the back, the tail at ``ends[tail_i]``. An unlinked
node keeps its own links ("dancing links"): only the neighbours change, so a logged unlink costs
two entries and the node's links come back with the rollback for free.

The lists:

- the **LRU list** of cached blocks (``lru_prev``/``lru_next``, ends in ``meta``): the head is
  the least recently released block, reclaimed first;
- the **buckets** of mapped pages with ``c`` free blocks (``bucket_prev``/``bucket_next``, head
  ``buckets[c]``, no tail): a page entering a bucket goes to the front;
- the **cache-only list** of pages holding cached but no referenced blocks (``co_prev``/
  ``co_next``, ends in ``meta``), oldest stamp first.
"""

from numba import int64, types, void

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.undo import NOT_LOGGED, log_write, set_logged
from kvnumba._kernels.views import VIEWS, array_type
from kvnumba._state import (
    FIELD,
    M_BUCKET_MIN,
    M_CACHED,
    M_CO_COUNT,
    M_CO_HEAD,
    M_CO_TAIL,
    M_LRU_HEAD,
    M_LRU_TAIL,
    NIL,
)

_I32, _I64 = array_type("int32"), array_type("int64")
_CODES = types.UniTuple(int64, 2)
# Explicit signatures (see .jit): ends are ``meta`` (int64) or the page buckets (int32).
_ENDS = (_I64, _I32)


@inlined([void(VIEWS, ends, int64, int64, int64) for ends in _ENDS])
def _set_end(v, ends, ends_code, i, value):
    if ends_code != NOT_LOGGED:
        log_write(v, ends_code, i, ends[i])
    ends[i] = value


@inlined([void(VIEWS, int64, _I32, _I32, _CODES, ends, int64, int64, int64) for ends in _ENDS])
def list_unlink(v, node, prev, nxt, codes, ends, ends_code, head_i, tail_i):
    """Remove ``node`` from its list (O(1)); ``codes`` = undo codes of ``(prev, nxt)``;
    ``tail_i < 0`` for a list without a tail."""
    p = prev[node]
    n = nxt[node]
    if p == NIL:
        _set_end(v, ends, ends_code, head_i, n)
    else:
        set_logged(v, nxt, codes[1], p, n)
    if n != NIL:
        set_logged(v, prev, codes[0], n, p)
    elif tail_i >= 0:
        _set_end(v, ends, ends_code, tail_i, p)


@inlined(void(VIEWS, int64, _I32, _I32, _CODES, _I64, int64, int64, int64))
def list_push_back(v, node, prev, nxt, codes, ends, ends_code, head_i, tail_i):
    """Append ``node`` at the tail (O(1))."""
    t = ends[tail_i]
    set_logged(v, prev, codes[0], node, t)
    set_logged(v, nxt, codes[1], node, NIL)
    if t == NIL:
        _set_end(v, ends, ends_code, head_i, node)
    else:
        set_logged(v, nxt, codes[1], t, node)
    _set_end(v, ends, ends_code, tail_i, node)


@inlined([void(VIEWS, int64, _I32, _I32, _CODES, ends, int64, int64) for ends in _ENDS])
def list_push_front(v, node, prev, nxt, codes, ends, ends_code, head_i):
    """Put ``node`` at the head of a list without a tail (O(1))."""
    front = ends[head_i]
    set_logged(v, prev, codes[0], node, NIL)
    set_logged(v, nxt, codes[1], node, front)
    if front != NIL:
        set_logged(v, prev, codes[0], front, node)
    _set_end(v, ends, ends_code, head_i, node)


_LRU = (FIELD.lru_prev, FIELD.lru_next)
_BUCKET = (FIELD.bucket_prev, FIELD.bucket_next)
_CACHE_ONLY = (FIELD.co_prev, FIELD.co_next)


@inlined
def lru_unlink(v, b):
    """Take cached block ``b`` off the LRU list."""
    list_unlink(v, b, v.lru_prev, v.lru_next, _LRU, v.meta, NOT_LOGGED, M_LRU_HEAD, M_LRU_TAIL)
    v.meta[M_CACHED] -= 1


@inlined
def lru_push_tail(v, b):
    """Append block ``b`` as the most recently released cached block."""
    list_push_back(v, b, v.lru_prev, v.lru_next, _LRU, v.meta, NOT_LOGGED, M_LRU_HEAD, M_LRU_TAIL)
    v.meta[M_CACHED] += 1


@out_of_line
def bucket_unlink(v, page, c):
    """Remove ``page`` from bucket ``c``."""
    list_unlink(v, page, v.bucket_prev, v.bucket_next, _BUCKET, v.buckets, FIELD.buckets, c, -1)


@out_of_line
def bucket_push(v, page, c):
    """Put ``page`` at the front of bucket ``c``."""
    list_push_front(v, page, v.bucket_prev, v.bucket_next, _BUCKET, v.buckets, FIELD.buckets, c)
    if c < v.meta[M_BUCKET_MIN]:
        v.meta[M_BUCKET_MIN] = c


@out_of_line
def cache_only_unlink(v, page):
    """Take ``page`` off the cache-only list."""
    list_unlink(
        v, page, v.co_prev, v.co_next, _CACHE_ONLY, v.meta, NOT_LOGGED, M_CO_HEAD, M_CO_TAIL
    )
    v.meta[M_CO_COUNT] -= 1


@out_of_line
def cache_only_push(v, page):
    """Append ``page`` to the cache-only list (the caller stamps it)."""
    list_push_back(
        v, page, v.co_prev, v.co_next, _CACHE_ONLY, v.meta, NOT_LOGGED, M_CO_HEAD, M_CO_TAIL
    )
    v.meta[M_CO_COUNT] += 1
