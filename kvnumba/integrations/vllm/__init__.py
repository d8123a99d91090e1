"""kvnumba as the KV cache manager of vLLM 0.32.x and 0.33.x.

:class:`KVNumbaKVCacheManager` has the constructor and the scheduler-facing interface of vLLM's
``KVCacheManager`` for one full-attention KV cache group, backed by a
:class:`kvnumba.BlockManager`; :class:`KVNumbaGroupsKVCacheManager` the same for sliding-window
and chunked-local groups and hybrid models (several groups over one pool); :class:`KVNumbaScheduler` is vLLM's ``Scheduler`` building it
(``--scheduler-cls kvnumba.integrations.vllm.KVNumbaScheduler``) and falling back to vLLM's own
manager, with a warning, for what it does not support; with async scheduling on it builds a
:class:`KVNumbaAsyncScheduler`, vLLM's ``AsyncScheduler`` with the same manager.
``docs/vllm.md`` maps vLLM's calls to kvnumba's. Importing this package with a vLLM outside
those release lines raises ``ImportError`` (:mod:`kvnumba.integrations.vllm_version`).
"""

from __future__ import annotations

from kvnumba.integrations.vllm_version import SUPPORTED_RANGE, check_vllm_version

try:
    import vllm as _vllm
except ImportError as exc:  # say which vLLM is needed, keep the cause
    raise ImportError(
        f"kvnumba.integrations.vllm needs vLLM {SUPPORTED_RANGE}, which is not importable "
        "(a CPU-only build: scripts/vllm_env.sh build, see docs/vllm.md)"
    ) from exc

check_vllm_version(getattr(_vllm, "__version__", None))

from kvnumba.integrations.vllm.groups import KVNumbaGroupsKVCacheManager  # noqa: E402
from kvnumba.integrations.vllm.manager import KVNumbaKVCacheManager  # noqa: E402
from kvnumba.integrations.vllm.scheduler import (  # noqa: E402
    KVNumbaAsyncScheduler,
    KVNumbaScheduler,
    kvnumba_enabled,
)

__all__ = [
    "KVNumbaAsyncScheduler",
    "KVNumbaGroupsKVCacheManager",
    "KVNumbaKVCacheManager",
    "KVNumbaScheduler",
    "kvnumba_enabled",
]
