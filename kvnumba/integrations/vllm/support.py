"""What the kvnumba managers serve, and why they decline the rest.

kvnumba serves KV cache layouts of full-attention, sliding-window and chunked-local attention
groups of one block size, hashed at that size: one full-attention group with
:class:`~kvnumba.integrations.vllm.manager.KVNumbaKVCacheManager`, anything else (several
groups, or one windowed group) with
:class:`~kvnumba.integrations.vllm.groups.KVNumbaGroupsKVCacheManager`. It declines the
features that make vLLM's manager keep state kvnumba has no place for (KV connectors and their
deferred frees, per-block metrics, KV cache zeroing, context parallelism, HiSparse, retention
intervals above 0, encoder-decoder models), Mamba and cross-attention groups, and EAGLE/MTP drafting
beside windowed or several groups. For anything else the caller builds vLLM's own manager; the
reason is logged once per construction.
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupRole,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from kvnumba.windows import MAX_GROUPS

# Spec classes served as plain full attention: every layer keeps every block until the request
# ends. Subclasses with other lifetimes (sink, RSWA, hidden-state caches) are not listed.
SERVED_SPECS = (FullAttentionSpec, MLAAttentionSpec)
# Spec classes served with kvnumba's windowed attention kinds (docs/windows.md).
WINDOWED_SPECS = (SlidingWindowSpec, ChunkedLocalAttentionSpec)


def uses_groups_manager(kv_cache_config) -> bool:
    """Whether a served configuration needs the groups manager (several groups, or a window).

    Parameters
    ----------
    kv_cache_config : vllm.v1.kv_cache_interface.KVCacheConfig
        The model's KV cache layout.

    Returns
    -------
    bool
        True unless the layout is one full-attention group.
    """
    groups = kv_cache_config.kv_cache_groups
    return len(groups) != 1 or type(groups[0].kv_cache_spec) in WINDOWED_SPECS


def manager_fallback_reason(
    kv_cache_config,
    *,
    scheduler_block_size: int,
    hash_block_size: int,
    dcp_world_size: int = 1,
    pcp_world_size: int = 1,
    metrics_collector=None,
    use_eagle: bool = False,
    num_prefill_lookahead: int = 0,
) -> str | None:
    """Why the kvnumba managers cannot serve this ``KVCacheManager`` configuration, or None.

    Parameters
    ----------
    kv_cache_config : vllm.v1.kv_cache_interface.KVCacheConfig
        The model's KV cache layout.
    scheduler_block_size, hash_block_size, dcp_world_size, pcp_world_size, metrics_collector, \
use_eagle, num_prefill_lookahead
        The ``KVCacheManager`` constructor arguments of the same names.

    Returns
    -------
    str or None
        A short reason, or None when the configuration is served.
    """
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return "no KV cache groups"
    if len(groups) > MAX_GROUPS:
        return f"{len(groups)} KV cache groups; kvnumba serves at most {MAX_GROUPS}"
    windowed = uses_groups_manager(kv_cache_config)
    for group in groups:
        spec = group.kv_cache_spec
        if type(spec) not in SERVED_SPECS + WINDOWED_SPECS:
            return (
                f"KV cache spec {type(spec).__name__}; kvnumba serves full, sliding-window and "
                "chunked local attention"
            )
        if group.role != KVCacheGroupRole.DEFAULT or group.host_resident:
            return f"KV cache group role {group.role} (HiSparse)"
        if not (spec.block_size == scheduler_block_size == hash_block_size):
            return (
                f"block size {spec.block_size}, scheduler block size {scheduler_block_size} "
                f"and hash block size {hash_block_size} differ (partial-block hits)"
            )
        if getattr(spec, "extra_retained_tokens", 0):
            return "sliding window with extra retained tokens (multi-module MTP)"
        if windowed and getattr(group, "is_eagle_group", False):
            return "EAGLE/MTP draft group beside windowed or several KV cache groups"
    if kv_cache_config.hisparse_host_num_blocks is not None:
        return "HiSparse host pool"
    # 0 (vLLM's default) keeps a sliding-window group's blocks at the boundaries a hit can
    # end at, which the groups manager does too; a positive interval adds periodic ones.
    if kv_cache_config.prefix_cache_retention_interval not in (None, 0):
        return "positive prefix cache retention interval"
    if kv_cache_config.needs_kv_cache_zeroing:
        return "KV cache zeroing of new blocks"
    if dcp_world_size != 1 or pcp_world_size != 1:
        return "decode/prefill context parallelism"
    if metrics_collector is not None:
        return "KV cache residency metrics"
    if windowed and (use_eagle or num_prefill_lookahead > 1):
        return "EAGLE/MTP drafting beside windowed or several KV cache groups"
    return None


def scheduler_fallback_reason(vllm_config) -> str | None:
    """Why a scheduler with this configuration must keep vLLM's own manager, or None.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine configuration the scheduler is built with.

    Returns
    -------
    str or None
        A short reason, or None when nothing at the scheduler level rules kvnumba out.
    """
    if vllm_config.kv_transfer_config is not None:
        # Connectors pop blocks for deferred frees, adopt external tokens and evict blocks
        # other requests hold: vLLM allocator internals kvnumba does not mirror.
        return "a KV connector is configured"
    if vllm_config.model_config is not None and vllm_config.model_config.is_encoder_decoder:
        return "encoder-decoder model (cross-attention blocks)"
    return None
