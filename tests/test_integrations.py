"""The engine-independent parts of ``kvnumba.integrations``: hash/key conversion and the vLLM
version check (vLLM itself is not needed; ``scripts/vllm_env.sh compare`` tests the adapter)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvnumba._engine_keys import hash_to_key
from kvnumba.integrations.engine_keys import hash_from_key, keys_from_hashes, keys_from_runs
from kvnumba.integrations.vllm_version import OVERRIDE_ENV, SUPPORTED_VLLM, check_vllm_version


def _digests(n: int, width: int) -> list[bytes]:
    return [hashlib.sha256(str(i).encode()).digest()[:width] for i in range(n)]


@pytest.mark.parametrize("width", [32, 16, 8, 1])
def test_keys_round_trip_and_match_the_core_conversion(width):
    hashes = _digests(5, width)
    keys = keys_from_hashes(hashes)
    assert keys.dtype == np.uint64 and keys.shape == (5, 4) and keys.flags.c_contiguous
    for row, digest in zip(keys, hashes, strict=True):
        assert hash_from_key(row, width) == digest
        assert np.array_equal(row, hash_to_key(digest))  # the core's one-hash conversion


def test_keys_of_a_slice():
    hashes = _digests(6, 32)
    assert np.array_equal(keys_from_hashes(hashes, 2, 5), keys_from_hashes(hashes)[2:5])
    assert keys_from_hashes(hashes, 4, 4).shape == (0, 4)


@pytest.mark.parametrize("width", [32, 8])
def test_keys_of_several_slices_in_one_array(width):
    a, b = _digests(6, width), _digests(9, width)[3:]
    got = keys_from_runs([(a, 1, 3), (b, 0, 0), (b, 2, 6)])
    assert np.array_equal(
        got, np.concatenate([keys_from_hashes(a, 1, 3), keys_from_hashes(b, 2, 6)])
    )
    assert keys_from_runs([]).shape == keys_from_runs([(a, 2, 2)]).shape == (0, 4)
    with pytest.raises(ValueError, match="block hashes must be"):
        keys_from_runs([(a, 0, 1), (_digests(2, width // 2), 0, 1)])


@pytest.mark.parametrize("bad", [[b"a" * 33], [b"ab", b"abc"], [b""]])
def test_keys_refuse_long_mixed_or_empty_digests(bad):
    with pytest.raises(ValueError, match="block hashes must be"):
        keys_from_hashes(bad)


def test_version_check_accepts_the_supported_release(monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    check_vllm_version(SUPPORTED_VLLM)
    check_vllm_version(SUPPORTED_VLLM + "+cpu")


def test_version_check_names_both_versions_and_the_override(monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    with pytest.raises(ImportError) as info:
        check_vllm_version("0.34.0")
    message = str(info.value)
    assert SUPPORTED_VLLM in message and "0.34.0" in message and OVERRIDE_ENV in message
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    check_vllm_version("0.34.0")


def test_version_check_without_vllm():
    with pytest.raises(ImportError, match="not installed"):
        check_vllm_version(None)


def test_importing_the_adapter_without_vllm_says_which_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs vLLM 0.33.0"):
            import kvnumba.integrations.vllm  # noqa: F401
    else:
        pytest.skip("vLLM is installed here; the adapter is tested by scripts/vllm_env.sh compare")
