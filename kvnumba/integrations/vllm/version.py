"""The vLLM releases ``kvnumba.integrations.vllm`` is written against, and the check of them.

The adapter reaches into vLLM's scheduler-facing interface (``KVCacheManager``'s constructor,
its ``coordinator`` and ``block_pool``, the event and stats types), which changes between vLLM
releases without notice. The supported release lines are each proven by their own vLLM tests;
any other version is refused when the adapter loads (:func:`require_vllm`) rather than
misbehaving at run time. What differs
between the supported lines lives in ``kvnumba.integrations.vllm._compat``.
"""

from __future__ import annotations

import os

SUPPORTED_RELEASES = ("0.32", "0.33")
"""``major.minor`` of the supported vLLM release lines (any patch release of each)."""

SUPPORTED_RANGE = "0.32.x-0.33.x"
"""The supported lines as one phrase for messages."""

# Set to 1 to import the adapter under another vLLM version anyway (at your own risk: for
# trying a new release, never for serving).
OVERRIDE_ENV = "KVNUMBA_VLLM_ANY_VERSION"


def release_of(version: str) -> str:
    """The release line (``major.minor``) of ``version`` (``0.32.1+cpu`` -> ``0.32``).

    Parameters
    ----------
    version : str
        A vLLM version string.

    Returns
    -------
    str
    """
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def check_vllm_version(version: str | None) -> None:
    """Raise ``ImportError`` unless ``version`` is of a supported vLLM release line.

    Parameters
    ----------
    version : str or None
        ``vllm.__version__`` (None: vLLM is not importable).

    Raises
    ------
    ImportError
        With a message naming the supported range, the found version and the override.
    """
    if version is None:
        raise ImportError(
            f"kvnumba.integrations.vllm needs vLLM {SUPPORTED_RANGE}, which is not installed "
            "(a CPU-only build: scripts/vllm_env.sh build, see docs/vllm.md)"
        )
    if release_of(version) in SUPPORTED_RELEASES:
        return
    if os.environ.get(OVERRIDE_ENV) == "1":
        return
    raise ImportError(
        f"kvnumba.integrations.vllm supports vLLM {SUPPORTED_RANGE}, found vLLM {version}: "
        f"its KVCacheManager interface is release-specific. Install a supported release, or "
        f"set {OVERRIDE_ENV}=1 to try this version anyway (untested)."
    )


def require_vllm() -> None:
    """Import vLLM and check its version (:func:`check_vllm_version`); the adapter's modules
    call it before they import anything of vLLM's.

    Raises
    ------
    ImportError
        vLLM is not importable, or not of a supported release line.
    """
    try:
        import vllm
    except ImportError as exc:  # say which vLLM is needed, keep the cause
        raise ImportError(
            f"kvnumba.integrations.vllm needs vLLM {SUPPORTED_RANGE}, which is not importable "
            "(a CPU-only build: scripts/vllm_env.sh build, see docs/vllm.md)"
        ) from exc
    check_vllm_version(getattr(vllm, "__version__", None))
