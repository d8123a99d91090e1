"""Page bookkeeping as the block steps call it (:mod:`.blocks`): the calls of
:mod:`.virtual_pages` for a manager on a page pool, nothing for a manager without one.

Which of the two is decided when numba types a call, by the type of the views
(:func:`.versions.is_paged`: a paged kernel hands its workers the pool's arena typed as
``versions.POOL_VIEW``, ``entry.with_pages``). The kernels of a manager without a page pool are therefore compiled
without the page code, a large part of the quick start's compile time otherwise. Their
callers still test ``meta[M_PAGE_K]`` at run time, so the empty versions are never reached.

Each name here is a Python function that numba replaces at every call site
(``inline="always"``); run as Python (``NUMBA_DISABLE_JIT``) it makes the page call.
"""

import numpy as np
from numba.extending import overload

from kvnumba._kernels.versions import is_paged
from kvnumba._kernels.virtual_pages import cache_in_page as _cache_in_page
from kvnumba._kernels.virtual_pages import evicted_to_page as _evicted_to_page
from kvnumba._kernels.virtual_pages import free_in_page as _free_in_page
from kvnumba._kernels.virtual_pages import page_gain_ref as _page_gain_ref
from kvnumba._kernels.virtual_pages import take_from_pages as _take_from_pages
from kvnumba._layout import NIL


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


def _resolve_by_views(stub, page_call):
    """Make numba resolve ``stub(v, x)`` to ``page_call(v, x)`` for a paged manager's views and
    to nothing for a plain manager's."""

    @overload(stub, inline="always")
    def _resolve(v, x):
        if is_paged(v):
            return lambda v, x: page_call(v, x)
        return lambda v, x: None


for _stub, _page_call in [
    (page_gain_ref, _page_gain_ref),
    (cache_in_page, _cache_in_page),
    (free_in_page, _free_in_page),
    (evicted_to_page, _evicted_to_page),
]:
    _resolve_by_views(_stub, _page_call)
