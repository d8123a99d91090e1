"""Adapters that put kvnumba under an inference engine's own scheduler.

``kvnumba.integrations.vllm`` is the ``KVCacheManager`` of vLLM 0.32.x-0.33.x, backed by a
:class:`kvnumba.BlockManager`. Importing it imports vLLM, checks its version and patches vLLM's
scheduler modules, so what must load without an engine sits beside it, not in it:

- :mod:`.block_hashes`: an engine's block hashes as kvnumba block keys, and back;
- :mod:`.vllm_version`: the vLLM releases the adapter supports, and their check;
- :mod:`.vllm_compile`: vLLM's plugin entry point that compiles the engine kernels while vLLM
  loads the model;
- :mod:`.vllm_lists`: the test lists of the vLLM test runs, read by their pytest plugins.

None of these imports an engine, so kvnumba's own tests check them anywhere.
"""
