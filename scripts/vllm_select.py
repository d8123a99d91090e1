"""pytest plugin: deselect the vLLM tests listed in a file (scripts/vllm-VERSION/not_applicable.txt).

Loaded by ``scripts/vllm_env.sh run`` as ``-p vllm_select`` with the list's path in
``KVNUMBA_VLLM_DESELECT``. A line names one test function (``path::name``, all its
parametrizations); text after ``#`` is its reason. A listed name that matches no collected test of
a collected file is an error, so the list cannot go stale silently.
"""

from __future__ import annotations

import os

import pytest

from kvnumba.integrations.vllm.suite_lists import read_test_list


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("KVNUMBA_VLLM_DESELECT")
    if not path:
        return
    listed = read_test_list(path)
    keep, drop, seen = [], [], set()
    files = {item.nodeid.split("::", 1)[0] for item in items}
    for item in items:
        key = item.nodeid.split("[", 1)[0]
        if key in listed:
            drop.append(item)
            seen.add(key)
        else:
            keep.append(item)
    stale = [k for k in listed if k not in seen and k.split("::", 1)[0] in files]
    if stale:
        raise pytest.UsageError(f"{path}: no collected test matches: {', '.join(stale)}")
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
