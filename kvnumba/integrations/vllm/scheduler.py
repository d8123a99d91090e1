"""``KVNumbaScheduler`` and the switch that puts kvnumba's manager under vLLM's scheduler.

vLLM's ``Scheduler.__init__`` builds its manager by calling the name ``KVCacheManager`` of its
own module. Importing this module rebinds that name (and the one in
``vllm.v1.core.kv_cache_manager``) to :class:`SwitchingKVCacheManager`, a subclass of vLLM's
class that changes nothing unless kvnumba is enabled for the current thread
(:func:`kvnumba_enabled`, entered by ``KVNumbaScheduler.__init__`` and by the pytest plugin).
When enabled, constructing it returns a :class:`KVNumbaKVCacheManager` if the configuration is
served, else it logs why and builds vLLM's own manager.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import vllm.v1.core.kv_cache_manager as _kv_cache_manager_module
import vllm.v1.core.sched.scheduler as _scheduler_module
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from kvnumba.integrations.vllm.groups import KVNumbaGroupsKVCacheManager
from kvnumba.integrations.vllm.manager import KVNumbaKVCacheManager
from kvnumba.integrations.vllm.support import (
    manager_fallback_reason,
    scheduler_fallback_reason,
    uses_groups_manager,
)

logger = init_logger(__name__)

_VLLM_KV_CACHE_MANAGER: Any = KVCacheManager


class _Switch(threading.local):
    """Per-thread switch: whether new managers are kvnumba's, and why not if declined."""

    def __init__(self) -> None:
        self.enabled = False
        self.declined: str | None = None  # a scheduler-level reason to keep vLLM's manager
        self.max_seqs: int | None = None


_switch = _Switch()

# Managers built since import, by kind: the pytest plugin reports which tests ran on kvnumba.
built = {"kvnumba": 0, "vllm": 0}
# Why vLLM's manager was kept, with counts (a plain constructor call while disabled is not
# counted here).
fallback_reasons: collections.Counter[str] = collections.Counter()
# The kvnumba managers alive, so that a test harness can check them (``KVNumbaKVCacheManager.check``).
live_managers: weakref.WeakSet = weakref.WeakSet()


@contextlib.contextmanager
def kvnumba_enabled(declined: str | None = None, max_seqs: int | None = None) -> Iterator[None]:
    """Within the block, ``KVCacheManager(...)`` builds kvnumba's manager when it can.

    Parameters
    ----------
    declined : str, optional
        A reason known before the manager is built (e.g. a KV connector) to keep vLLM's.
    max_seqs : int, optional
        ``max_seqs`` for the kvnumba manager (the scheduler's ``max_num_seqs`` bound).
    """
    saved = (_switch.enabled, _switch.declined, _switch.max_seqs)
    _switch.enabled, _switch.declined, _switch.max_seqs = True, declined, max_seqs
    try:
        yield
    finally:
        _switch.enabled, _switch.declined, _switch.max_seqs = saved


def set_default_enabled(enabled: bool) -> None:
    """Enable (or disable) kvnumba's manager for the current thread outside any block."""
    _switch.enabled = enabled


class SwitchingKVCacheManager(_VLLM_KV_CACHE_MANAGER):
    """vLLM's ``KVCacheManager`` that becomes kvnumba's where enabled and served.

    Constructing it returns a :class:`KVNumbaKVCacheManager` (not an instance of this class,
    so vLLM's ``__init__`` does not run) when kvnumba is enabled for the thread and the
    configuration is served; otherwise it is exactly vLLM's manager.
    """

    def __new__(cls, kv_cache_config, *args, **kwargs):
        if not _switch.enabled:
            built["vllm"] += 1
            return super().__new__(cls)
        reason = _switch.declined or _manager_reason(kv_cache_config, args, kwargs)
        if reason is not None:
            logger.warning("kvnumba: keeping vLLM's KV cache manager: %s", reason)
            built["vllm"] += 1
            fallback_reasons[reason] += 1
            return super().__new__(cls)
        built["kvnumba"] += 1
        cls = KVNumbaGroupsKVCacheManager
        if not uses_groups_manager(kv_cache_config):
            cls = KVNumbaKVCacheManager
        manager = cls(kv_cache_config, *args, **kwargs, max_seqs=_switch.max_seqs)
        # Numbered and kept (weakly), so that a test harness checks the managers a test built.
        manager.serial = built["kvnumba"]
        live_managers.add(manager)
        return manager


_ARGS = ("max_model_len", "scheduler_block_size", "hash_block_size")


def _manager_reason(kv_cache_config, args, kwargs) -> str | None:
    """:func:`manager_fallback_reason` for ``KVCacheManager``'s positional/keyword args."""
    named = dict(zip(_ARGS, args, strict=False)) | kwargs
    if len(args) > len(_ARGS):
        return "KVCacheManager called with more positional arguments than expected"
    return manager_fallback_reason(
        kv_cache_config,
        scheduler_block_size=named["scheduler_block_size"],
        hash_block_size=named["hash_block_size"],
        dcp_world_size=named.get("dcp_world_size", 1),
        pcp_world_size=named.get("pcp_world_size", 1),
        metrics_collector=named.get("metrics_collector"),
        use_eagle=named.get("use_eagle", False),
        num_prefill_lookahead=named.get("num_prefill_lookahead", 0),
    )


def install() -> None:
    """Rebind ``KVCacheManager`` in vLLM's scheduler and manager modules to the switch."""
    _scheduler_module.KVCacheManager = SwitchingKVCacheManager
    _kv_cache_manager_module.KVCacheManager = SwitchingKVCacheManager


def scheduler_max_seqs(vllm_config) -> int:
    """Requests that may hold blocks at once under this scheduler configuration."""
    # Running requests never exceed max_num_seqs; the slack covers a step that admits before
    # the finished requests of the previous one are freed.
    return 2 * vllm_config.scheduler_config.max_num_seqs


class KVNumbaScheduler(Scheduler):
    """vLLM's ``Scheduler`` with kvnumba's KV cache manager where it serves the model.

    Use as ``--scheduler-cls kvnumba.integrations.vllm.KVNumbaScheduler``. Same arguments as
    vLLM's ``Scheduler``; falls back to vLLM's manager, with a warning, for hybrid or
    non-full-attention models and for unsupported features (KV connectors, encoder-decoder
    models, context parallelism, ...; see :mod:`kvnumba.integrations.vllm.support`).

    Constructing this class with async scheduling on
    (``vllm_config.scheduler_config.async_scheduling``) returns a
    :class:`KVNumbaAsyncScheduler`, as vLLM itself picks ``AsyncScheduler`` over ``Scheduler``
    by that flag: one class name serves both modes. A subclass is constructed as itself.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's configuration; the rest of vLLM's ``Scheduler`` arguments follow.
    """

    def __new__(cls, vllm_config, *args, **kwargs):
        # vLLM's engine calls the configured class, so the choice it makes by this flag for its
        # own classes is made here; a returned subclass instance gets its own __init__ called.
        if cls is KVNumbaScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = KVNumbaAsyncScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config, *args, **kwargs) -> None:
        declined = scheduler_fallback_reason(vllm_config)
        with kvnumba_enabled(declined, scheduler_max_seqs(vllm_config)):
            super().__init__(vllm_config, *args, **kwargs)


class KVNumbaAsyncScheduler(KVNumbaScheduler, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` with kvnumba's KV cache manager where it serves the model.

    What ``KVNumbaScheduler(vllm_config, ...)`` builds when
    ``vllm_config.scheduler_config.async_scheduling`` is true; it may also be named directly
    (``--scheduler-cls kvnumba.integrations.vllm.KVNumbaAsyncScheduler``). The MRO is
    ``KVNumbaAsyncScheduler``, ``KVNumbaScheduler``, ``AsyncScheduler``, ``Scheduler``:
    ``KVNumbaScheduler.__init__`` enables kvnumba's manager around ``AsyncScheduler.__init__``,
    and the output placeholders of async scheduling are ``AsyncScheduler``'s own.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's configuration; the rest of vLLM's ``AsyncScheduler`` arguments follow.
    """


install()
