"""The vLLM release ``kvnumba.integrations.vllm`` is written against, and the check of it.

The adapter reaches into vLLM's scheduler-facing interface (``KVCacheManager``'s constructor,
its ``coordinator`` and ``block_pool``, the event and stats types), which changes between vLLM
releases without notice, so any other version is refused at import time rather than
misbehaving at run time.
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.33.0"

# Set to 1 to import the adapter under another vLLM version anyway (at your own risk: for
# trying a new release, never for serving).
OVERRIDE_ENV = "KVNUMBA_VLLM_ANY_VERSION"


def base_version(version: str) -> str:
    """``version`` without a local part (``0.33.0+cpu`` -> ``0.33.0``)."""
    return version.split("+", 1)[0]


def check_vllm_version(version: str | None) -> None:
    """Raise ``ImportError`` unless ``version`` is the supported vLLM release.

    Parameters
    ----------
    version : str or None
        ``vllm.__version__`` (None: vLLM is not importable).

    Raises
    ------
    ImportError
        With a message naming the supported version, the found one and the override.
    """
    if version is None:
        raise ImportError(
            f"kvnumba.integrations.vllm needs vLLM {SUPPORTED_VLLM}, which is not installed "
            "(install it the CPU way: scripts/vllm_env.sh build, see docs/vllm.md)"
        )
    if base_version(version) == SUPPORTED_VLLM:
        return
    if os.environ.get(OVERRIDE_ENV) == "1":
        return
    raise ImportError(
        f"kvnumba.integrations.vllm supports vLLM {SUPPORTED_VLLM} only, found vLLM {version}: "
        f"its KVCacheManager interface is version-specific. Install vllm=={SUPPORTED_VLLM}, or "
        f"set {OVERRIDE_ENV}=1 to try this version anyway (untested)."
    )
