"""``PagePool``: the physical page pool several block managers (and processes) share.

Two-level allocation: each manager has its own virtual block space, cut into virtual pages; a
virtual page is backed by a physical page taken from the pool before any of its blocks is used
and given back when it holds nothing. The pool state is a few flat int64 arrays carved out of one
arena (see :mod:`kvnumba._kernels.physical_pages`); every mutation is a kernel call over that arena.

A pool is either private to one process (``PagePool(num_pages)``) or lives in POSIX shared
memory (``PagePool.shared(name, num_pages)`` / ``PagePool.attach(name)``), where every mutation
holds a cross-process ``fcntl.flock`` lock on a file next to the segment.

Threading: all managers (clients) on one pool are used from one thread at a time per process. The
lock serialises processes, not threads of one process (it is re-entrant within a process).
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvnumba._kernels import ensure_fresh_cache
from kvnumba._kernels import physical_pages as K
from kvnumba.errors import (
    ST_OK,
    ST_POOL_EXHAUSTED,
    CallbackError,
    InvalidGeometry,
    InvariantViolation,
    PoolExhausted,
)
from kvnumba.inputs import check_state_bytes, index_array, positive_int
from kvnumba.pages._filelock import FileLock, fcntl
from kvnumba.pages._process import FORK_AWARE, process_start_time
from kvnumba.pages._shm import check_name, lock_path, open_shm
from kvnumba.pages.coordinator import PoolCoordinator

__all__ = ["PagePool", "PoolState", "process_start_time"]

_NO_LOCK = contextlib.nullcontext()


def _check_callbacks(on_map, on_unmap) -> None:
    """``TypeError`` for a callback that is neither ``None`` nor callable (before any call)."""
    for label, callback in (("on_map", on_map), ("on_unmap", on_unmap)):
        if callback is not None and not callable(callback):
            raise TypeError(f"{label} must be callable, got {type(callback).__name__}")


_KERNELS_LOADED = False


def _load_kernels() -> None:
    """Compile (or load from numba's cache) the pool workers before any lock is taken.

    A pool call, and the repair or reclaim an allocating call may run, would otherwise compile
    while it holds the lock and block every other process for the compile's duration. They run
    once on a throwaway one-page arena with the argument types of the real calls.
    """
    global _KERNELS_LOADED
    if _KERNELS_LOADED:
        return
    ensure_fresh_cache()
    arena = np.zeros(K.arena_layout(1)[2], dtype=np.uint8)
    K.init_arena(arena, 1)
    me = np.array([1, 1, 1], dtype=np.int64)
    out = np.empty(1, dtype=np.int64)
    none = np.empty(0, dtype=np.int64)
    K.map_pages(arena, me, none, out)
    K.unmap_pages(arena, 1, none, out)
    K.reclaim_pages(arena, none, none, out, out)
    K.repair_pages(arena, np.zeros(1, dtype=np.uint8))
    _KERNELS_LOADED = True


class PoolState(NamedTuple):
    """The arrays of a page pool (``PagePool.state``: read-only views; ``snapshot()``: copies).

    Attributes
    ----------
    head : int64[16]
        Free-stack top, logical clock, next client token, counters, layout (``H_*`` slots of
        :mod:`kvnumba._kernels.physical_pages`).
    free : int64[num_pages]
        Free physical pages; the first ``head[H_FREE_TOP]`` entries are live, the last is taken
        first.
    owner : int64[num_pages, 4]
        Per physical page: client token (-1 if free), owner pid, owner process start time,
        virtual page backed (-1 if free).
    """

    head: np.ndarray
    free: np.ndarray
    owner: np.ndarray


class _Holding:
    """The lock of one shared pool object, which also records its holder in the pool's head.

    The outermost acquisition in a process writes the process's pid into ``H_HOLDER`` and the
    release writes 0 back before it lets go, so a pid found there by the next holder names a
    process that died holding the lock, perhaps inside a kernel with a page half-written. That
    pid is kept in ``H_TORN`` until :meth:`PagePool.reclaim_dead` repaired the pool; the next
    allocating call runs it (``PagePool._repair_if_torn``).
    """

    __slots__ = ("_lock", "_pool")

    def __init__(self, pool: PagePool):
        self._pool = pool
        self._lock: FileLock | None = None

    def __enter__(self) -> None:
        lock = self._lock = FileLock.of(self._pool._shared_name())
        lock.__enter__()
        if lock.depth == 1:
            head = self._pool._head
            holder = int(head[K.H_HOLDER])
            if holder:
                head[K.H_TORN] = holder
            head[K.H_HOLDER] = lock.pid

    def __exit__(self, *exc) -> None:
        lock = self._lock
        assert lock is not None  # entered before
        head = self._pool._head
        if lock.depth == 1 and head is not None:
            head[K.H_HOLDER] = 0
        lock.__exit__()


class PagePool:
    """A pool of physical pages mapped on demand to the virtual pages of several clients.

    Parameters
    ----------
    num_pages : int
        Physical pages in the pool.
    on_map : callable, optional
        ``on_map(physical_ids, virtual_ids)`` (int64 array copies), called once per call of this
        pool object that mapped at least one page, after the call committed.
    on_unmap : callable, optional
        ``on_unmap(physical_ids, virtual_ids)``, likewise for pages given back.

    Notes
    -----
    A client (one per :class:`kvnumba.BlockManager`) gets a token from :meth:`register_client`
    and maps and unmaps pages with it. Mapping is all-or-nothing and O(1) per page (a free
    stack); every page records its owner: client token, pid and process start time, and the
    virtual page it backs. :meth:`pages_of`, :meth:`reclaim_dead` and :meth:`check` scan the owner
    table; they are introspection and recovery operations, not hot paths.

    All clients of one pool are used from one thread at a time per process; a shared pool
    serialises processes with a file lock around every mutation (never around callbacks).

    Examples
    --------
    >>> pool = PagePool(4)
    >>> me = pool.register_client()
    >>> pool.map_pages(me, [7, 8]).tolist()
    [0, 1]
    >>> pool.num_free
    2
    """

    _name: str | None  # None for a private pool
    _holding: _Holding | None  # a shared pool's lock

    def __init__(
        self,
        num_pages: int,
        on_map: Callable | None = None,
        on_unmap: Callable | None = None,
    ):
        num_pages = self._check_num_pages(num_pages)
        _check_callbacks(on_map, on_unmap)
        _, _, size = K.arena_layout(num_pages)
        check_state_bytes(size, f"a page pool of {num_pages} pages")
        raw = np.zeros(size + K.ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % K.ALIGN  # every field 64-byte aligned
        arena = raw[start : start + size]
        K.init_arena(arena, num_pages)
        self._name = None
        self._setup(arena, None, None, on_map, on_unmap)

    # --- construction ---------------------------------------------------------------------------

    @staticmethod
    def _check_num_pages(num_pages) -> int:
        num_pages = positive_int(num_pages, "num_pages", InvalidGeometry)
        if num_pages >= 2**31 - 1:
            raise InvalidGeometry("num_pages must be below 2**31 - 1")
        return num_pages

    def _setup(self, arena, shm, name, on_map, on_unmap) -> None:
        self._arena = arena
        self._shm = shm
        self._name = name
        self.on_map = on_map
        self.on_unmap = on_unmap
        head, free, owner = K.views_of(arena)
        self._head, self._free, self._owner = head, free, owner
        self._num_pages = int(head[K.H_NUM_PAGES])
        self._me_cache: dict[tuple[int, int], np.ndarray] = {}
        self._closed = False
        self._holding = _Holding(self) if shm is not None else None
        FORK_AWARE.add(self)
        # The BlockManagers of this process on this pool object, their orphaned pages and the
        # reclaim between them.
        self._coordinator = PoolCoordinator(self)

    @classmethod
    def shared(
        cls,
        name: str,
        num_pages: int,
        on_map: Callable | None = None,
        on_unmap: Callable | None = None,
    ) -> PagePool:
        """Create a pool in the shared-memory segment ``name`` (which must not exist yet).

        Parameters
        ----------
        name : str
            Segment name (``/dev/shm/<name>`` on Linux); the lock file is
            ``/dev/shm/<name>.kvnumba-lock``. One portable file name: 1 to 200 characters
            from ``[A-Za-z0-9._-]``, not starting with ``'.'``.
        num_pages : int
            Physical pages in the pool.
        on_map, on_unmap : callable, optional
            Callbacks of this process's pool object (see :class:`PagePool`).

        Returns
        -------
        PagePool

        Raises
        ------
        FileExistsError
            If a segment of that name exists.
        ValueError
            If ``name`` is not a valid name (checked before anything is created).
        TypeError
            If a callback is not callable.
        """
        if fcntl is None:  # pragma: no cover
            raise OSError("a shared PagePool needs fcntl (POSIX)")
        name = check_name(name)
        num_pages = cls._check_num_pages(num_pages)
        _check_callbacks(on_map, on_unmap)
        _, _, size = K.arena_layout(num_pages)
        check_state_bytes(size, f"a page pool of {num_pages} pages")
        self = cls.__new__(cls)
        self._name = name
        lock_existed = os.path.exists(lock_path(name))
        # The creator holds the lock while it initialises, so an attacher that opens the segment
        # early waits for the magic to be written.
        try:
            with self._locked_file():
                shm = open_shm(name, create=True, size=size)
                arena = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
                K.init_arena(arena, num_pages)
                self._setup(arena, shm, name, on_map, on_unmap)
        except BaseException:
            # Nothing of a failed creation stays behind; a lock file that was there before
            # belongs to an existing pool of that name.
            if not lock_existed:
                FileLock.forget(name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock_path(name))
            raise
        return self

    @classmethod
    def attach(
        cls,
        name: str,
        on_map: Callable | None = None,
        on_unmap: Callable | None = None,
    ) -> PagePool:
        """Open the shared pool ``name`` created by :meth:`shared` (in any process).

        Parameters
        ----------
        name : str
            Segment name given to :meth:`shared`.
        on_map, on_unmap : callable, optional
            Callbacks of this process's pool object.

        Returns
        -------
        PagePool

        Raises
        ------
        FileNotFoundError
            If no segment of that name exists.
        ValueError
            If the segment holds no page pool, or ``name`` is not a valid name (see
            :meth:`shared`).
        TypeError
            If a callback is not callable.
        """
        if fcntl is None:  # pragma: no cover
            raise OSError("a shared PagePool needs fcntl (POSIX)")
        name = check_name(name)
        _check_callbacks(on_map, on_unmap)
        self = cls.__new__(cls)
        self._name = name
        # Open the segment first (so a missing pool creates no lock file), then wait for the
        # lock: a creator still initialising holds it until the magic is written.
        shm = open_shm(name, create=False)
        with self._locked_file():
            head = np.ndarray((K.HEAD_SIZE,), dtype=np.int64, buffer=shm.buf)
            magic = int(head[K.H_MAGIC])
            num_pages = int(head[K.H_NUM_PAGES])
            del head
            size = K.arena_layout(num_pages)[2] if magic == K.POOL_MAGIC else 0
            if magic != K.POOL_MAGIC or shm.size < size:
                shm.close()
                raise ValueError(f"shared memory segment {name!r} holds no kvnumba page pool")
            arena = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
            self._setup(arena, shm, name, on_map, on_unmap)
        return self

    def __reduce__(self):
        # A shared pool travels to another process by name (callbacks stay behind); a private
        # pool is per process and does not travel.
        if self._shm is None:
            raise TypeError("a private PagePool cannot be pickled; use PagePool.shared")
        return (PagePool.attach, (self._name,))

    # --- locking --------------------------------------------------------------------------------

    def _shared_name(self) -> str:
        # Only a shared pool has a name, a segment and a lock file.
        assert self._name is not None, "a private page pool has no name"
        return self._name

    def _locked_file(self) -> FileLock:
        return FileLock.of(self._shared_name())

    def lock(self) -> contextlib.AbstractContextManager:
        """Hold the pool's cross-process lock (re-entrant within a process; no-op if private).

        A manager holds it around each kernel call that takes or gives pages; hold it only
        around kernel calls, never around callbacks or other slow work.

        Returns
        -------
        context manager
        """
        if self._closed:
            raise ValueError("the page pool is closed")
        if self._shm is None:
            return _NO_LOCK  # one process, one thread at a time: nothing to serialise
        assert self._holding is not None  # made with the segment
        return self._holding

    def _repair_if_torn(self) -> None:
        """Under the lock, at the start of an allocating call: repair the pool if a process
        died holding its lock (``reclaim_dead``); O(1) otherwise."""
        if self._shm is not None and self._head[K.H_TORN]:
            self.reclaim_dead()

    def _after_fork(self, pid: int, start: int) -> None:
        """In a forked child: forget the identities computed for the parent (a later process
        may reuse one of their pids)."""
        self._me_cache.clear()

    # --- properties -----------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        """Physical pages in the pool."""
        return self._num_pages

    @property
    def num_free(self) -> int:
        """Free physical pages right now (another process may change it the next moment)."""
        self._ensure_open()
        return int(self._head[K.H_FREE_TOP])

    @property
    def num_mapped(self) -> int:
        """Mapped physical pages right now (``num_pages - num_free``)."""
        return self._num_pages - self.num_free

    @property
    def name(self) -> str | None:
        """Shared-memory segment name, or ``None`` for a private pool."""
        return self._name if self._shm is not None else None

    @property
    def is_shared(self) -> bool:
        """Whether the pool lives in shared memory."""
        return self._shm is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def clock(self) -> int:
        """The pool-wide logical clock (advanced by kernels through ``pool_tick``)."""
        self._ensure_open()
        return int(self._head[K.H_CLOCK])

    @property
    def arena(self) -> np.ndarray:
        """The uint8 arena the kernels take (``kvnumba._kernels.physical_pages.pool_views`` carves it)."""
        self._ensure_open()
        return self._arena

    @property
    def state(self) -> PoolState:
        """Read-only views of the pool arrays (they see later changes; keep none past close)."""
        self._ensure_open()
        views = []
        for array in (self._head, self._free, self._owner):
            view = array.view()
            view.flags.writeable = False
            views.append(view)
        return PoolState(*views)

    def snapshot(self) -> PoolState:
        """Copies of the pool arrays, taken under the lock.

        The lock holder's slot (``H_HOLDER``) reads 0: it belongs to the lock, and would name
        this process only because the snapshot holds the lock.
        """
        with self.lock():
            head = self._head.copy()
            head[K.H_HOLDER] = 0
            return PoolState(head, self._free.copy(), self._owner.copy())

    # --- clients --------------------------------------------------------------------------------

    def register_client(self) -> int:
        """Hand out a new client token (1, 2, ... pool-wide; never reused).

        Returns
        -------
        int
        """
        with self.lock():
            token = int(self._head[K.H_NEXT_CLIENT])
            self._head[K.H_NEXT_CLIENT] = token + 1
        return token

    def identity(self, client: int) -> np.ndarray:
        """The ``me`` array ``(client, pid, start time)`` that ``pool_take`` records.

        Recomputed after a fork (the pid changes), cached otherwise.

        Parameters
        ----------
        client : int
            A token from :meth:`register_client` (not checked here; the kernels check it).

        Returns
        -------
        numpy.ndarray of int64, shape (3,)
        """
        pid = os.getpid()
        key = (int(client), pid)
        me = self._me_cache.get(key)
        if me is None:
            start = process_start_time(pid)
            me = np.array([client, pid, 0 if start is None else start], dtype=np.int64)
            self._me_cache[key] = me
        return me

    def _client(self, client) -> int:
        if isinstance(client, bool) or not isinstance(client, (int, np.integer)):
            raise TypeError(f"client must be an int token, got {type(client).__name__}")
        return int(client)

    # --- mapping --------------------------------------------------------------------------------

    def map_pages(self, client: int, virtual_ids) -> np.ndarray:
        """Map one physical page to each of ``virtual_ids`` for ``client``, all or nothing.

        If the pool has too few free pages it first frees the pages of dead processes
        (:meth:`reclaim_dead`) and tries again. If a process died holding the pool's lock, the
        call first repairs what it left half-written (:meth:`reclaim_dead` too).

        Parameters
        ----------
        client : int
            Token from :meth:`register_client`.
        virtual_ids : 1-D array-like of int
            Virtual pages to back (>= 0); recorded in the owner table and passed to ``on_map``.

        Returns
        -------
        numpy.ndarray of int64
            ``physical[i]`` backs ``virtual_ids[i]``.

        Raises
        ------
        PoolExhausted
            If fewer pages are free than requested (``needed``, ``available`` in pages); nothing
            changed.
        ValueError
            For an unknown client or a negative virtual id.
        CallbackError
            If ``on_map`` raised; the pages are mapped and ``.result`` holds them.
        """
        client = self._client(client)
        virtual_ids = index_array(virtual_ids, "virtual_ids")
        out = np.empty(virtual_ids.shape[0], dtype=np.int64)
        me = self.identity(client)
        _load_kernels()
        with self.lock():
            self._repair_if_torn()
            status, bad, available = K.map_pages(self._arena, me, virtual_ids, out)
            if status == ST_POOL_EXHAUSTED and self.reclaim_dead() > 0:
                status, bad, available = K.map_pages(self._arena, me, virtual_ids, out)
        if status != ST_OK:
            self._raise(status, bad, client, virtual_ids, needed=out.shape[0], available=available)
        if out.shape[0]:
            try:
                self.deliver(mapped=(out, virtual_ids))
            except Exception as exc:
                # The pages are mapped: the caller must still learn which ones.
                raise CallbackError(out) from exc
        return out

    def unmap_pages(self, client: int, physical_ids) -> np.ndarray:
        """Give back pages that ``client`` holds, all or nothing.

        Parameters
        ----------
        client : int
            Token from :meth:`register_client`.
        physical_ids : 1-D array-like of int
            Physical pages held by ``client``, no duplicates.

        Returns
        -------
        numpy.ndarray of int64
            The virtual page each of them backed.

        Raises
        ------
        ValueError
            For an unknown client, an out-of-range, duplicate or foreign page; nothing changed.
        CallbackError
            If ``on_unmap`` raised; the pages are given back and ``.result`` holds the virtual
            pages.
        """
        client = self._client(client)
        physical_ids = index_array(physical_ids, "physical_ids")
        virtual = np.empty(physical_ids.shape[0], dtype=np.int64)
        _load_kernels()
        with self.lock():
            status, bad = K.unmap_pages(self._arena, client, physical_ids, virtual)
        if status != ST_OK:
            self._raise(status, bad, client, physical_ids)
        if physical_ids.shape[0]:
            try:
                self.deliver(unmapped=(physical_ids.copy(), virtual))
            except Exception as exc:
                raise CallbackError(virtual) from exc
        return virtual

    def deliver(self, unmapped=None, mapped=None) -> None:
        """Call ``on_unmap`` then ``on_map`` with copies, for work that has committed.

        Managers integrating the pool call this once per API call after their kernel committed.

        Parameters
        ----------
        unmapped, mapped : tuple of two int64 arrays, optional
            ``(physical_ids, virtual_ids)``; skipped when ``None`` or empty.

        Raises
        ------
        Exception
            The first exception a callback raised, after both callbacks ran.
        """
        error = None
        if unmapped is not None and self.on_unmap is not None and len(unmapped[0]):
            try:
                self.on_unmap(
                    np.array(unmapped[0], dtype=np.int64), np.array(unmapped[1], np.int64)
                )
            except Exception as exc:  # noqa: BLE001 - re-raised below, after on_map ran
                error = exc
        if mapped is not None and self.on_map is not None and len(mapped[0]):
            try:
                self.on_map(
                    np.array(mapped[0], dtype=np.int64), np.array(mapped[1], dtype=np.int64)
                )
            except Exception as exc:  # noqa: BLE001
                error = error or exc
        if error is not None:
            raise error

    def _raise(self, status, bad, client, values, needed=0, available=0):
        if status == ST_POOL_EXHAUSTED:
            raise PoolExhausted(
                needed,
                available,
                f"page pool exhausted: {needed} pages needed, {available} free",
            )
        if status == K.ST_BAD_CLIENT:
            raise ValueError(f"client {client} is not a token of this pool")
        value = int(values[bad])
        if status == K.ST_BAD_VIRTUAL:
            raise ValueError(f"virtual_ids[{bad}] = {value} is negative")
        if status == K.ST_BAD_PAGE:
            raise ValueError(f"physical_ids[{bad}] = {value} is not a page of this pool")
        if status == K.ST_DUPLICATE_PAGE:
            raise ValueError(f"physical page {value} appears twice in physical_ids")
        if status == K.ST_NOT_OWNER:
            raise ValueError(f"physical page {value} is not held by client {client}")
        raise RuntimeError(f"unexpected pool status {status}")  # pragma: no cover

    # --- introspection and recovery -------------------------------------------------------------

    def pages_of(self, client: int) -> np.ndarray:
        """Physical pages ``client`` holds, ascending (a scan of the owner table).

        Parameters
        ----------
        client : int

        Returns
        -------
        numpy.ndarray of int64
        """
        client = self._client(client)
        with self.lock():
            return np.flatnonzero(self._owner[:, K.O_CLIENT] == client).astype(np.int64)

    def owner_of(self, physical: int) -> tuple[int, int, int, int] | None:
        """``(client, pid, start_time, virtual)`` of a mapped page, ``None`` if it is free.

        Parameters
        ----------
        physical : int

        Returns
        -------
        tuple of int or None
        """
        physical = _page_id(physical, self._num_pages)
        with self.lock():
            record = self._owner[physical].tolist()
        return None if record[K.O_CLIENT] == K.NO_CLIENT else tuple(record)

    def reclaim_dead(self) -> int:
        """Repair what killed processes left half-written, and free the pages of dead owners.

        First the repair: a process killed inside a pool call can leave a page popped off the
        free stack without a complete owner record, pushed back with its record not yet reset,
        or marked by an unmap; such pages are freed (or, for a mark, given back to their owner),
        so that :meth:`check` passes again. Then every page whose owner process is no longer
        running is freed: an owner is dead if its pid does not exist, is a zombie, or belongs to
        a process with a different start time (the pid was reused). Scans the owner table and
        checks each distinct owner process once. ``on_unmap`` is not called: the pages were not
        this process's. An allocating call runs it itself when it finds the pool exhausted or a
        process died holding the pool's lock.

        Returns
        -------
        int
            Pages freed.
        """
        _load_kernels()
        seen = np.zeros(self._num_pages, dtype=np.uint8)
        with self.lock():
            freed, _ = K.repair_pages(self._arena, seen)
            if freed:
                self._head[K.H_RECLAIMED] += freed
            if self._head[K.H_TORN]:
                self._head[K.H_TORN] = 0
            return freed + self._reclaim_owners()

    def _reclaim_owners(self) -> int:
        """Free the pages of dead owner processes (under the lock; see :meth:`reclaim_dead`)."""
        owned = self._owner[self._owner[:, K.O_CLIENT] != K.NO_CLIENT]
        if owned.shape[0] == 0:
            return 0
        owners = np.unique(owned[:, K.O_PID : K.O_START + 1], axis=0)
        dead = [
            (pid, start)
            for pid, start in owners.tolist()  # a loop over processes, not pages
            if process_start_time(pid) != start
        ]
        if not dead:
            return 0
        pids = np.array([d[0] for d in dead], dtype=np.int64)
        starts = np.array([d[1] for d in dead], dtype=np.int64)
        out = np.empty(owned.shape[0], dtype=np.int64)
        virtual = np.empty(owned.shape[0], dtype=np.int64)
        return int(K.reclaim_pages(self._arena, pids, starts, out, virtual))

    def stats(self) -> dict[str, int]:
        """Counters: ``num_pages``, ``free``, ``mapped``, ``maps``, ``unmaps``, ``reclaimed``,
        ``clients`` (tokens handed out), ``clock``."""
        head = self.snapshot().head
        free = int(head[K.H_FREE_TOP])
        return {
            "num_pages": self._num_pages,
            "free": free,
            "mapped": self._num_pages - free,
            "maps": int(head[K.H_MAPS]),
            "unmaps": int(head[K.H_UNMAPS]),
            "reclaimed": int(head[K.H_RECLAIMED]),
            "clients": int(head[K.H_NEXT_CLIENT]) - 1,
            "clock": int(head[K.H_CLOCK]),
        }

    def check(self) -> None:
        """Verify the pool arrays from scratch (under the lock).

        Every page is either on the free stack exactly once with the free record, or off it
        with an owner record (valid client, pid > 0, virtual >= 0); free + mapped == num_pages.

        Raises
        ------
        InvariantViolation
            Naming the first inconsistency. A page record or free-stack entry left half-written
            by a process killed inside a pool call is reported with a note that
            :meth:`reclaim_dead` repairs it (as the next allocating call does).
        """
        head, free, owner = self.snapshot()
        n = self._num_pages
        top = int(head[K.H_FREE_TOP])
        if head[K.H_MAGIC] != K.POOL_MAGIC or head[K.H_NUM_PAGES] != n:
            raise InvariantViolation("page pool header is corrupt")
        if not 0 <= top <= n:
            raise InvariantViolation(f"free-stack top {top} outside 0..{n}")
        # Every inconsistency below is one that repair_pages undoes.
        torn = int(head[K.H_TORN])
        cause = (
            f"process {torn} died holding the pool's lock"
            if torn
            else "a process killed inside a pool call can leave this"
        )
        hint = f" ({cause}; reclaim_dead() repairs it, as does the next call that maps pages)"
        stack = free[:top]
        if stack.size and (stack.min() < 0 or stack.max() >= n):
            raise InvariantViolation("free stack holds a page id out of range" + hint)
        counts = np.bincount(stack, minlength=n)
        if counts.max(initial=0) > 1:
            raise InvariantViolation(
                f"page {int(np.argmax(counts))} is on the free stack twice" + hint
            )
        is_free = counts == 1
        clients = owner[:, K.O_CLIENT]
        bad = np.flatnonzero(is_free & (clients != K.NO_CLIENT))
        if bad.size:
            raise InvariantViolation(
                f"page {int(bad[0])} is on the free stack but owned by client {clients[bad[0]]}"
                + hint
            )
        free_rows = owner[is_free]
        if free_rows.size and not (free_rows == np.array([-1, 0, 0, -1])).all():
            raise InvariantViolation("a free page has a non-canonical owner record" + hint)
        held = owner[~is_free]
        next_client = int(head[K.H_NEXT_CLIENT])
        lost = np.flatnonzero(~is_free & ((clients < 1) | (clients >= next_client)))
        if lost.size:
            raise InvariantViolation(
                f"page {int(lost[0])} is neither free nor owned by a valid client "
                f"(client {clients[lost[0]]})" + hint
            )
        if held.size and ((held[:, K.O_PID] <= 0).any() or (held[:, K.O_VIRTUAL] < 0).any()):
            raise InvariantViolation("a mapped page has no owner pid or no virtual page" + hint)
        if top + held.shape[0] != n:  # pragma: no cover - implied by the checks above
            raise InvariantViolation(f"free {top} + mapped {held.shape[0]} != {n} pages")

    # --- lifetime -------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise ValueError("the page pool is closed")

    def close(self) -> None:
        """Detach from the shared segment (no-op for a private pool's memory); idempotent.

        Views from :attr:`state` must be dropped first (they pin the segment's buffer).
        """
        if self._closed:
            return
        self._closed = True
        self._arena = self._head = self._free = self._owner = None
        if self._shm is not None:
            self._shm.close()

    def unlink(self) -> None:
        """Remove the shared segment and its lock file (once, when no process needs them).

        Processes still attached keep their mapping until they close it. No-op for a private
        pool.
        """
        if self._shm is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path(self._shared_name()))
        FileLock.forget(self._shared_name())

    def __enter__(self) -> PagePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return "PagePool(<closed>)"
        where = f", shared={self._name!r}" if self._shm is not None else ""
        return f"PagePool(num_pages={self._num_pages}, num_free={self.num_free}{where})"


def _page_id(value, num_pages: int) -> int:
    """``value`` as a page id in ``0 .. num_pages - 1`` (``IndexError`` otherwise)."""
    if isinstance(value, bool):
        raise TypeError("a page id must be an integer")
    page = operator.index(value)
    if not 0 <= page < num_pages:
        raise IndexError(f"page {page} outside 0..{num_pages - 1}")
    return page
