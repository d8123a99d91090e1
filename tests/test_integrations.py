"""The engine-independent parts of ``kvnumba.integrations``: hash/key conversion and the vLLM
version check (vLLM itself is not needed; ``scripts/vllm_env.sh compare`` tests the adapter)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvnumba._engine_keys import hash_to_key
from kvnumba.integrations.block_hashes import hash_from_key, keys_from_hashes, keys_from_runs
from kvnumba.integrations.vllm.version import (
    OVERRIDE_ENV,
    SUPPORTED_RANGE,
    check_vllm_version,
    release_of,
)


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


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.3", "0.33.0", "0.33.1+cu130"])
def test_version_check_accepts_every_release_of_the_supported_lines(monkeypatch, version):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "0.3.3"])
def test_version_check_names_the_range_the_version_and_the_override(monkeypatch, version):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    with pytest.raises(ImportError) as info:
        check_vllm_version(version)
    message = str(info.value)
    assert SUPPORTED_RANGE in message and version in message and OVERRIDE_ENV in message
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    check_vllm_version(version)


def test_release_line_of_a_version():
    assert release_of("0.32.0+cpu") == "0.32"
    assert release_of("0.33.12") == "0.33"
    assert release_of("0.33") == "0.33"


def test_version_check_without_vllm():
    with pytest.raises(ImportError, match="not installed"):
        check_vllm_version(None)


def test_importing_the_adapter_without_vllm_says_which_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        import kvnumba.integrations.vllm as adapter  # the package loads: its names do not

        for name in adapter.__all__:
            with pytest.raises(ImportError, match="needs vLLM 0.32.x-0.33.x"):
                getattr(adapter, name)
        with pytest.raises(ImportError, match="needs vLLM 0.32.x-0.33.x"):
            from kvnumba.integrations.vllm import KVNumbaScheduler  # noqa: F401
        with pytest.raises(AttributeError, match="no attribute 'Missing'"):
            adapter.Missing  # noqa: B018
    else:
        pytest.skip("vLLM is installed here; the adapter is tested by scripts/vllm_env.sh compare")
