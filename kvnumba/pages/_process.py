"""Processes that share a page pool: is a process alive, and who am I after a fork.

A page's owner record holds the owner's pid and process start time (a pid alone may be reused);
``process_start_time`` reads it. Pool objects and managers stamp the identity of the process
using them on every page they map, so after ``os.fork`` the child must re-read its own: objects
that stamp pages join ``FORK_AWARE`` and get ``_after_fork(pid, start)`` in a forked child.
"""

from __future__ import annotations

import os
import weakref


def process_start_time(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks since boot), or ``None`` if it is not running.

    Reads field 22 of ``/proc/<pid>/stat``; a zombie (killed, not yet reaped) counts as not
    running. Without ``/proc`` the start time is 0 and liveness comes from ``os.kill(pid, 0)``.

    Parameters
    ----------
    pid : int
        Process id.

    Returns
    -------
    int or None
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # pragma: no cover - no procfs (or no permission): fall back to kill(0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    # The command name (field 2) is in parentheses and may itself contain ") ", so split after
    # the last one: the fields from 3 (state) on follow.
    rest = stat[stat.rindex(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])


# Pool objects and managers on a pool in this process, to re-read the identity they stamp on
# pages after a fork (weak: the registry must not keep them alive).
FORK_AWARE: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Give every pool object and paged manager of a forked child the child's own identity."""
    if not FORK_AWARE:
        return
    pid = os.getpid()
    start = process_start_time(pid)
    start = 0 if start is None else start
    for obj in list(FORK_AWARE):
        obj._after_fork(pid, start)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
