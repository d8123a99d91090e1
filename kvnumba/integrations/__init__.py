"""Adapters that put kvnumba under an inference engine's own scheduler.

- :mod:`.vllm`: the ``KVCacheManager`` of vLLM 0.32.x-0.33.x, backed by a
  :class:`kvnumba.BlockManager`, with its scheduler, its version check, its plugin entry point
  and its test lists (the package loads without vLLM; the adapter's names import vLLM on first
  use).
- :mod:`.block_hashes`: an engine's block hashes as kvnumba block keys, and back.
"""
