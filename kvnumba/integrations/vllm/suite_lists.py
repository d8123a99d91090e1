"""The test lists of the vLLM runs (``scripts/vllm-VERSION/*.txt``), read by their pytest plugins.

A list has one test a line (``path::name``, or ``path::name[param]`` where a plugin takes
single parametrizations), then ``#`` and the reason; other ``#`` lines are comments. This module
imports no engine, so the plugin that deselects tests in a native run loads no kvnumba adapter.
"""

from __future__ import annotations


def read_test_list(path: str) -> dict[str, str]:
    """Entries of a test list file: test id to reason (the text after ``#``).

    Parameters
    ----------
    path : str
        The list file.

    Returns
    -------
    dict of str to str
        One entry per listed test, in file order.
    """
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, _, reason = line.partition("#")
            if name.strip():
                out[name.strip()] = reason.strip()
    return out
