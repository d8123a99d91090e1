"""A shared pool's segment in POSIX shared memory, and the name that locates it."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time

# A shared pool's name is one portable file name: it becomes /dev/shm/<name> and the lock file
# /dev/shm/<name>.kvnumba-lock, so a separator, a dot name or a NUL would put files elsewhere.
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")
MAX_NAME_LENGTH = 200  # the lock file's suffix must still fit a 255-byte file name


def check_name(name) -> str:
    """``name`` if it is a valid shared pool name, else ``ValueError`` (see ``PagePool.shared``)."""
    if not isinstance(name, str):
        raise ValueError(f"a shared pool name must be a str, got {type(name).__name__}")
    if not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"a shared pool name must have 1 to {MAX_NAME_LENGTH} characters, got {len(name)}"
        )
    if not _NAME_CHARS.fullmatch(name) or name.startswith("."):
        raise ValueError(
            f"shared pool name {name!r} is not a portable file name: use only letters, digits, "
            "'.', '_' and '-', not starting with '.'"
        )
    return name


def lock_path(name: str) -> str:
    """The lock file of the shared pool ``name``: next to the segment in /dev/shm if it exists."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(directory, f"{name.lstrip('/')}.kvnumba-lock")


def open_shm(name: str, create: bool, size: int = 0):
    """Create or attach a ``SharedMemory`` segment.

    An attaching process must not register the segment with its ``resource_tracker`` (before
    Python 3.13 it does): the tracker would unlink the segment when that process exits, under the
    feet of every other process. Only the creator keeps the registration.
    """
    from multiprocessing import resource_tracker, shared_memory

    if create:
        return shared_memory.SharedMemory(name=name, create=True, size=size)
    for attempt in range(100):
        try:
            if sys.version_info >= (3, 13):
                return shared_memory.SharedMemory(name=name, track=False)
            register = resource_tracker.register
            resource_tracker.register = lambda *args, **kwargs: None
            try:
                return shared_memory.SharedMemory(name=name)
            finally:
                resource_tracker.register = register
        except ValueError:
            # Opened between the creator's shm_open and its ftruncate, the segment is empty for
            # a moment: give the creator a little time.
            if attempt == 99:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")  # pragma: no cover
