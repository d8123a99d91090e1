"""Page bookkeeping as the block steps call it (:mod:`.blocks`): the calls of
:mod:`.virtual_pages` for a manager on a page pool, nothing for a manager without one.

Which of the two is decided when numba types a call, by the type of the views
(:func:`.views.is_paged`: a paged kernel hands its workers the pool's arena typed with layout
``'A'``, ``entry.paged``). The kernels of a manager without a page pool are therefore compiled
without the page code, which was about a fifth of the quick start's compile time. Their
callers still test ``meta[M_PAGE_K]`` at run time, so the empty versions are never reached.

Each name here is a Python function that numba replaces at every call site
(``inline="always"``); run as Python (``NUMBA_DISABLE_JIT``) it makes the page call.
"""

import numpy as np
from numba.extending import overload

from kvnumba._kernels.views import is_paged
from kvnumba._kernels.virtual_pages import cache_in_page as _cache_in_page
from kvnumba._kernels.virtual_pages import evicted_to_page as _evicted_to_page
from kvnumba._kernels.virtual_pages import free_in_page as _free_in_page
from kvnumba._kernels.virtual_pages import page_gain_ref as _page_gain_ref
from kvnumba._kernels.virtual_pages import take_from_pages as _take_from_pages
from kvnumba._state import NIL


def take_from_pages(v):
    """:func:`.virtual_pages.take_from_pages`, or NIL (take a cached block) without pages."""
    return _take_from_pages(v)


def page_gain_ref(v, page):
    """:func:`.virtual_pages.page_gain_ref`."""
    _page_gain_ref(v, page)


def cache_in_page(v, b):
    """:func:`.virtual_pages.cache_in_page`."""
    _cache_in_page(v, b)


def free_in_page(v, b):
    """:func:`.virtual_pages.free_in_page`."""
    _free_in_page(v, b)


def evicted_to_page(v, b):
    """:func:`.virtual_pages.evicted_to_page`."""
    _evicted_to_page(v, b)


@overload(take_from_pages, inline="always")
def _take_from_pages_impl(v):
    if is_paged(v):
        return lambda v: _take_from_pages(v)
    return lambda v: np.int64(NIL)


@overload(page_gain_ref, inline="always")
def _page_gain_ref_impl(v, page):
    if is_paged(v):
        return lambda v, page: _page_gain_ref(v, page)
    return lambda v, page: None


@overload(cache_in_page, inline="always")
def _cache_in_page_impl(v, b):
    if is_paged(v):
        return lambda v, b: _cache_in_page(v, b)
    return lambda v, b: None


@overload(free_in_page, inline="always")
def _free_in_page_impl(v, b):
    if is_paged(v):
        return lambda v, b: _free_in_page(v, b)
    return lambda v, b: None


@overload(evicted_to_page, inline="always")
def _evicted_to_page_impl(v, b):
    if is_paged(v):
        return lambda v, b: _evicted_to_page(v, b)
    return lambda v, b: None
