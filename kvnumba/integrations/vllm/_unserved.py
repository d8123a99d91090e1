"""vLLM ``KVCacheManager`` steps of features the adapter does not serve, as the no-ops they are
for one full-attention group without KV connectors, Mamba or KV cache zeroing.

A mixin of :class:`~kvnumba.integrations.vllm.manager.KVNumbaKVCacheManager`: the scheduler
calls these every step or on every finished request; here they have nothing to do.
"""

from __future__ import annotations


class UnservedFeatureSteps:
    """The scheduler's calls for sliding windows, zeroing, copies, Mamba and cascade attention."""

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in vLLM (cascade attention is gone): always ``[0]``."""
        return [0]

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens=None
    ) -> None:
        """Full attention skips no tokens: nothing to remove."""

    def new_step_starts(self) -> None:
        """Nothing is kept per step."""

    def take_new_block_ids(self) -> list[int]:
        """No KV cache zeroing is served: always empty."""
        return []

    def take_kv_cache_block_copies(self) -> tuple[list, list]:
        """No partial-block hits, so no copies: always empty."""
        return [], []

    def take_boundary_state_offloads(self) -> dict:
        """No Mamba groups: always empty."""
        return {}

    def finalize_partial_tail_offloads(self, request) -> list:
        """No Mamba groups: always empty."""
        return []
