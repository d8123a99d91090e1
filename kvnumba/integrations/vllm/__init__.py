"""kvnumba as the KV cache manager of vLLM 0.32.x and 0.33.x.

:class:`KVNumbaKVCacheManager` has the constructor and the scheduler-facing interface of vLLM's
``KVCacheManager`` for one full-attention KV cache group, backed by a
:class:`kvnumba.BlockManager`; :class:`KVNumbaGroupsKVCacheManager` the same for sliding-window
and chunked-local groups and hybrid models (several groups over one pool);
:class:`KVNumbaScheduler` is vLLM's ``Scheduler`` building it (``--scheduler-cls
kvnumba.integrations.vllm.KVNumbaScheduler``) and falling back to vLLM's own manager, with a
warning, for what it does not support; with async scheduling on it builds a
:class:`KVNumbaAsyncScheduler`, vLLM's ``AsyncScheduler`` with the same manager.
``docs/vllm.md`` maps vLLM's calls to kvnumba's.

The package loads without vLLM; its adapter names load on first use (:pep:`562`): that imports
vLLM, refuses a vLLM outside those release lines with ``ImportError``
(:func:`.version.require_vllm`) and rebinds ``KVCacheManager`` in vLLM's scheduler modules
(:mod:`.scheduler`). Three modules never import vLLM, so they load anywhere and kvnumba's own
tests check them without an engine:

- :mod:`.version`: the vLLM releases the adapter supports, and their check;
- :mod:`.precompile`: vLLM's plugin entry point that compiles the engine kernels while vLLM
  loads the model;
- :mod:`.suite_lists`: the test lists of the vLLM test runs, read by their pytest plugins.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The adapter's names, and the module of each.
_ADAPTER = {
    "KVNumbaAsyncScheduler": "scheduler",
    "KVNumbaGroupsKVCacheManager": "groups",
    "KVNumbaKVCacheManager": "manager",
    "KVNumbaScheduler": "scheduler",
    "kvnumba_enabled": "scheduler",
}

__all__ = list(_ADAPTER)


def __getattr__(name: str) -> Any:
    """Load an adapter name on first use (vLLM's version checked first)."""
    module = _ADAPTER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from kvnumba.integrations.vllm.version import require_vllm

    require_vllm()
    importlib.import_module(f"{__name__}.scheduler")  # rebinds vLLM's KVCacheManager, once
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the same names for type checkers and readers, without importing vLLM
    from kvnumba.integrations.vllm.groups import (
        KVNumbaGroupsKVCacheManager as KVNumbaGroupsKVCacheManager,
    )
    from kvnumba.integrations.vllm.manager import KVNumbaKVCacheManager as KVNumbaKVCacheManager
    from kvnumba.integrations.vllm.scheduler import (
        KVNumbaAsyncScheduler as KVNumbaAsyncScheduler,
    )
    from kvnumba.integrations.vllm.scheduler import KVNumbaScheduler as KVNumbaScheduler
    from kvnumba.integrations.vllm.scheduler import kvnumba_enabled as kvnumba_enabled
