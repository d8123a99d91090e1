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

from typing import NamedTuple

import numpy as np
from numba import int64, types, void

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.undo import NOT_LOGGED, log_write, set_logged
from kvnumba._kernels.views import VIEWS, array_type
from kvnumba._layout import (
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


class LinkedList(NamedTuple):
    """One list: its link arrays, their undo codes and where its ends are kept."""

    #: Back links, indexed by node.
    prev: np.ndarray
    #: Forward links, indexed by node.
    nxt: np.ndarray
    #: Undo codes of ``(prev, nxt)``.
    codes: tuple
    #: The array holding the list's ends: ``meta`` (int64) or the page buckets (int32).
    ends: np.ndarray
    #: Undo code of ``ends``, or ``NOT_LOGGED`` (``meta``, which a logged call saves whole).
    ends_code: int
    #: Index of the head in ``ends``.
    head_i: int
    #: Index of the tail in ``ends``, or -1 for a list without a tail.
    tail_i: int


_I32, _I64 = array_type("int32"), array_type("int64")
# Explicit signatures (see .jit): ends are ``meta`` (int64) or the page buckets (int32).
_LISTS = [
    types.NamedTuple([_I32, _I32, types.UniTuple(int64, 2), ends, int64, int64, int64], LinkedList)
    for ends in (_I64, _I32)
]
_ENDS = (_I64, _I32)


@inlined([void(VIEWS, ends, int64, int64, int64) for ends in _ENDS])
def _set_end(v, ends, ends_code, i, value):
    if ends_code != NOT_LOGGED:
        log_write(v, ends_code, i, ends[i])
    ends[i] = value


@inlined([void(VIEWS, int64, lst) for lst in _LISTS])
def list_unlink(v, node, lst):
    """Remove ``node`` from its list (O(1))."""
    p = lst.prev[node]
    n = lst.nxt[node]
    if p == NIL:
        _set_end(v, lst.ends, lst.ends_code, lst.head_i, n)
    else:
        set_logged(v, lst.nxt, lst.codes[1], p, n)
    if n != NIL:
        set_logged(v, lst.prev, lst.codes[0], n, p)
    elif lst.tail_i >= 0:
        _set_end(v, lst.ends, lst.ends_code, lst.tail_i, p)


@inlined(void(VIEWS, int64, _LISTS[0]))
def list_push_back(v, node, lst):
    """Append ``node`` at the tail (O(1))."""
    t = lst.ends[lst.tail_i]
    set_logged(v, lst.prev, lst.codes[0], node, t)
    set_logged(v, lst.nxt, lst.codes[1], node, NIL)
    if t == NIL:
        _set_end(v, lst.ends, lst.ends_code, lst.head_i, node)
    else:
        set_logged(v, lst.nxt, lst.codes[1], t, node)
    _set_end(v, lst.ends, lst.ends_code, lst.tail_i, node)


@inlined([void(VIEWS, int64, lst) for lst in _LISTS])
def list_push_front(v, node, lst):
    """Put ``node`` at the head of a list without a tail (O(1))."""
    front = lst.ends[lst.head_i]
    set_logged(v, lst.prev, lst.codes[0], node, NIL)
    set_logged(v, lst.nxt, lst.codes[1], node, front)
    if front != NIL:
        set_logged(v, lst.prev, lst.codes[0], front, node)
    _set_end(v, lst.ends, lst.ends_code, lst.head_i, node)


_LRU = (FIELD.lru_prev, FIELD.lru_next)
_BUCKET = (FIELD.bucket_prev, FIELD.bucket_next)
_CACHE_ONLY = (FIELD.co_prev, FIELD.co_next)


@inlined
def lru_unlink(v, b):
    """Take cached block ``b`` off the LRU list."""
    lru = LinkedList(v.lru_prev, v.lru_next, _LRU, v.meta, NOT_LOGGED, M_LRU_HEAD, M_LRU_TAIL)
    list_unlink(v, b, lru)
    v.meta[M_CACHED] -= 1


@inlined
def lru_push_tail(v, b):
    """Append block ``b`` as the most recently released cached block."""
    lru = LinkedList(v.lru_prev, v.lru_next, _LRU, v.meta, NOT_LOGGED, M_LRU_HEAD, M_LRU_TAIL)
    list_push_back(v, b, lru)
    v.meta[M_CACHED] += 1


@out_of_line
def bucket_unlink(v, page, c):
    """Remove ``page`` from bucket ``c``."""
    bucket = LinkedList(v.bucket_prev, v.bucket_next, _BUCKET, v.buckets, FIELD.buckets, c, -1)
    list_unlink(v, page, bucket)


@out_of_line
def bucket_push(v, page, c):
    """Put ``page`` at the front of bucket ``c``."""
    bucket = LinkedList(v.bucket_prev, v.bucket_next, _BUCKET, v.buckets, FIELD.buckets, c, -1)
    list_push_front(v, page, bucket)
    if c < v.meta[M_BUCKET_MIN]:
        v.meta[M_BUCKET_MIN] = c


@out_of_line
def cache_only_unlink(v, page):
    """Take ``page`` off the cache-only list."""
    cache_only = LinkedList(
        v.co_prev, v.co_next, _CACHE_ONLY, v.meta, NOT_LOGGED, M_CO_HEAD, M_CO_TAIL
    )
    list_unlink(v, page, cache_only)
    v.meta[M_CO_COUNT] -= 1


@out_of_line
def cache_only_push(v, page):
    """Append ``page`` to the cache-only list (the caller stamps it)."""
    cache_only = LinkedList(
        v.co_prev, v.co_next, _CACHE_ONLY, v.meta, NOT_LOGGED, M_CO_HEAD, M_CO_TAIL
    )
    list_push_back(v, page, cache_only)
    v.meta[M_CO_COUNT] += 1
