"""What the kvnumba manager serves, and why it declines the rest.

kvnumba's manager serves exactly one full-attention KV cache group whose blocks are hashed at
their own size, with none of the features that make vLLM's manager keep state kvnumba has no
place for (KV connectors and their deferred frees, per-block metrics, KV cache zeroing, context
parallelism, HiSparse, retention intervals, encoder-decoder models). For anything else the caller builds vLLM's own manager; the reason is
logged once per construction.
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupRole, MLAAttentionSpec

# Spec classes served as plain full attention: every layer keeps every block until the request
# ends. Subclasses with other lifetimes (sink, RSWA, hidden-state caches) are not listed.
SERVED_SPECS = (FullAttentionSpec, MLAAttentionSpec)


def manager_fallback_reason(
    kv_cache_config,
    *,
    scheduler_block_size: int,
    hash_block_size: int,
    dcp_world_size: int = 1,
    pcp_world_size: int = 1,
    metrics_collector=None,
) -> str | None:
    """Why the kvnumba manager cannot serve this ``KVCacheManager`` configuration, or None.

    Parameters
    ----------
    kv_cache_config : vllm.v1.kv_cache_interface.KVCacheConfig
        The model's KV cache layout.
    scheduler_block_size, hash_block_size, dcp_world_size, pcp_world_size, metrics_collector
        The ``KVCacheManager`` constructor arguments of the same names.

    Returns
    -------
    str or None
        A short reason, or None when the configuration is served.
    """
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return f"{len(groups)} KV cache groups (hybrid model); kvnumba serves one"
    group = groups[0]
    spec = group.kv_cache_spec
    if type(spec) not in SERVED_SPECS:
        return f"KV cache spec {type(spec).__name__}; kvnumba serves full attention only"
    if group.role != KVCacheGroupRole.DEFAULT or group.host_resident:
        return f"KV cache group role {group.role} (HiSparse)"
    if kv_cache_config.hisparse_host_num_blocks is not None:
        return "HiSparse host pool"
    if kv_cache_config.prefix_cache_retention_interval not in (None, 0):
        return "prefix cache retention interval"
    if kv_cache_config.needs_kv_cache_zeroing:
        return "KV cache zeroing of new blocks"
    if not (spec.block_size == scheduler_block_size == hash_block_size):
        return (
            f"block size {spec.block_size}, scheduler block size {scheduler_block_size} and "
            f"hash block size {hash_block_size} differ (partial-block hits)"
        )
    if dcp_world_size != 1 or pcp_world_size != 1:
        return "decode/prefill context parallelism"
    if metrics_collector is not None:
        return "KV cache residency metrics"
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
