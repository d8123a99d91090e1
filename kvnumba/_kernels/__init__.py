"""The ``@njit(cache=True)`` kernels, one module per concern.

Entry points (:mod:`.entry`, called by the facade) take the call's inputs and the two arenas of
:mod:`kvnumba._layout`; workers and helpers are described in ``docs/design.md``. Kernels never
raise: they return a status code from :mod:`kvnumba.errors`.

Before the first kernel of a process is compiled or loaded (:func:`ensure_fresh_cache`, called
by ``kvnumba.kernels.compiled`` and the page pool's loader), numba's on-disk cache of these
modules is dropped if any of their sources (or the constants and rules they inline from
``_layout.py``, ``errors.py``, ``ids.py`` and ``windows.py``) changed: numba keys a cached
function by its own file only, and the workers here inline helpers from the other files. Importing the package
touches no file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from numba import config
from numba.core.caching import _CacheLocator

_HERE = Path(__file__).resolve().parent
_SOURCES = (
    *sorted(_HERE.glob("*.py")),
    *(_HERE.parent / name for name in ("_layout.py", "errors.py", "ids.py", "windows.py")),
)
_MARKER = "kvnumba-kernels.sha256"


def _cache_dirs() -> list[Path]:
    """Where numba keeps the cache of this package's kernels: under ``NUMBA_CACHE_DIR`` when it
    is set (numba then looks nowhere else, so neither do we), else next to the sources."""
    if config.CACHE_DIR:
        subpath = _CacheLocator.get_suitable_cache_subpath(str(_HERE / "entry.py"))
        return [Path(config.CACHE_DIR) / subpath]
    return [_HERE / "__pycache__"]


def drop_stale_cache() -> int:
    """Delete cached kernels compiled from other sources; returns how many files went."""
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in _SOURCES)).hexdigest()
    removed = 0
    for directory in _cache_dirs():
        marker = directory / _MARKER
        try:
            if marker.read_text() == digest:
                continue
        except OSError:
            pass  # no marker yet: whatever is there was compiled from unknown sources
        try:
            for stale in (*directory.glob("*.nbi"), *directory.glob("*.nbc")):
                stale.unlink()
                removed += 1
            directory.mkdir(parents=True, exist_ok=True)
            marker.write_text(digest)
        except OSError:
            pass  # a read-only location: numba will not write there either
    return removed


_checked = False


def check_cache_once() -> None:
    """Run :func:`drop_stale_cache` once per process."""
    global _checked
    if not _checked:
        _checked = True
        drop_stale_cache()


def ensure_fresh_cache() -> None:
    """Before the first kernel of a process is loaded: run :func:`drop_stale_cache` once, then
    compile (or load) the helpers that state their signatures (``jit.compile_stated``)."""
    check_cache_once()
    from kvnumba._kernels.jit import compile_stated

    compile_stated()
