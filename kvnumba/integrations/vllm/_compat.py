"""What differs between the vLLM releases the adapter supports, in one place.

The adapter is written against vLLM's newest supported release. An older release lacks some
names; each difference is one entry of :class:`Release`, chosen by the imported vLLM's version
(under the version override, an unknown release gets the nearest entry: the newest for a newer
release, the oldest for an older one), and every other module reads the names it needs from
here instead of importing them conditionally.

====================  ====================================================================
difference            releases
====================  ====================================================================
hash lookahead        0.33: blocks may be hashed over tokens past their end
                      (``num_hash_lookahead_tokens``); ``BlockStored`` carries
                      ``lookahead_token_ids`` and event extra keys come from
                      ``generate_lookahead_block_hash_extra_keys``. 0.32: neither exists,
                      and vLLM never asks the manager for lookahead.
====================  ====================================================================
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvnumba.integrations.vllm.version import release_of, require_vllm

require_vllm()  # before anything of vLLM's: a clear error for a missing or unsupported vLLM

import vllm  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402


class Release(NamedTuple):
    """The interface differences of one vLLM release line."""

    name: str
    """``major.minor`` of the line."""
    hash_lookahead: bool
    """Whether blocks may be hashed over tokens past their end (and events say so)."""


RELEASES = {
    "0.32": Release("0.32", hash_lookahead=False),
    "0.33": Release("0.33", hash_lookahead=True),
}


def _nearest(release: str) -> Release:
    """The entry of ``release``, or of the nearest supported line (version override)."""
    if release in RELEASES:
        return RELEASES[release]
    key = tuple(int(part) for part in release.split(".") if part.isdigit())
    lines = sorted(RELEASES, key=lambda r: tuple(int(p) for p in r.split(".")))
    oldest, newest = lines[0], lines[-1]
    return RELEASES[oldest if key < tuple(int(p) for p in oldest.split(".")) else newest]


RELEASE: Release = _nearest(release_of(vllm.__version__))

# None where the release has no hash lookahead (block_stored never calls it there).
lookahead_extra_keys: Any = (
    kv_cache_utils.generate_lookahead_block_hash_extra_keys if RELEASE.hash_lookahead else None
)


def stored_event_fields(lookahead_token_ids: list[list[int]] | None) -> dict:
    """Keyword arguments of ``BlockStored`` that only some releases have.

    Parameters
    ----------
    lookahead_token_ids : list of list of int or None
        Tokens after each stored block covered by its hash (None: no lookahead hashing).

    Returns
    -------
    dict
        ``{"lookahead_token_ids": ...}`` on releases with hash lookahead, else empty.
    """
    if RELEASE.hash_lookahead:
        return {"lookahead_token_ids": lookahead_token_ids}
    if lookahead_token_ids is not None:
        raise ValueError(f"vLLM {RELEASE.name} has no hash lookahead to report")
    return {}
