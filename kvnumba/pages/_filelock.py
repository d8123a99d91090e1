"""The cross-process lock of a shared pool: ``flock`` on a file next to its segment."""

from __future__ import annotations

import os

from kvnumba.pages._shm import lock_path

try:  # POSIX only; without it a shared pool cannot be created (a private one still works)
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX platforms
    fcntl = None  # type: ignore[assignment]


class FileLock:
    """The ``flock`` lock of one shared pool in this process: re-entrant, one per lock file.

    Every ``PagePool`` object of the same segment in a process shares it: two objects with their
    own descriptors would block each other (flock locks belong to the open file description),
    so holding one pool object's lock while calling another would deadlock. A forked child
    inherits the parent's descriptor and with it the open file description, which would make
    the parent's lock the child's too: the child opens its own.
    """

    _registry: dict[str, FileLock] = {}

    def __init__(self, path: str):
        self.path = path
        self.pid = os.getpid()
        self.file = open(path, "a+b")  # noqa: SIM115 - kept open for the life of the process
        self.depth = 0

    @classmethod
    def of(cls, name: str) -> FileLock:
        path = lock_path(name)
        lock = cls._registry.get(path)
        if lock is None or lock.pid != os.getpid():
            lock = cls._registry[path] = cls(path)
        return lock

    def __enter__(self) -> None:
        if self.depth == 0:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX)
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth == 0:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)

    @classmethod
    def forget(cls, name: str) -> None:
        """Close the descriptor of a lock file that is being removed (if not held)."""
        lock = cls._registry.get(lock_path(name))
        if lock is not None and lock.pid == os.getpid() and lock.depth == 0:
            del cls._registry[lock.path]
            lock.file.close()
