"""A tqdm progress bar when tqdm is installed (the ``sim`` extra), a silent stand-in otherwise."""

from __future__ import annotations

import sys


class NoBar:
    """Stands in for tqdm when it is not installed: accepts the calls, shows nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        """Ignore progress."""

    def set_postfix_str(self, text):
        """Ignore the status text."""


def progress_bar(total: int, unit: str, desc: str, disable: bool | None = None):
    """A tqdm bar on stderr, by default shown only when stderr is a terminal.

    Parameters
    ----------
    total : int
        Units of work expected.
    unit : str
        Name of one unit ("req", "sim").
    desc : str
        Label in front of the bar.
    disable : bool or None
        tqdm's ``disable``: ``None`` shows the bar on a terminal only, so that logs and pipes
        stay clean; ``True`` never shows it.

    Returns
    -------
    tqdm.tqdm or NoBar
        A context manager with ``update(n)`` and ``set_postfix_str(text)``.
    """
    try:
        from tqdm import tqdm
    except ImportError:
        return NoBar()
    return tqdm(total=total, unit=unit, file=sys.stderr, disable=disable, desc=desc)
