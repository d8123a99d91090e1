"""Adapters that put kvnumba under an inference engine's own scheduler.

``kvnumba.integrations.vllm`` is the ``KVCacheManager`` of vLLM 0.32.x-0.33.x, backed by a
:class:`kvnumba.BlockManager`. The helpers of this package itself (:mod:`.engine_keys`,
:mod:`.vllm_version`) import no engine, so kvnumba's own tests can check them anywhere.
"""
