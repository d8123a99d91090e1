"""The compiled entry kernels: their signatures, loading, and compiling ahead of time.

A numba dispatcher works out the argument types of every call before it runs the machine code;
for the hot calls that is a large part of a one-sequence call. The facade always passes the
same types (C-contiguous int64 vectors, Python ints and bools, the two uint8 arenas), so it
compiles (or loads from the cache) exactly that signature once and calls its entry point. This
also means that a read-only input array never triggers a second compilation.
"""

from __future__ import annotations

import logging
import time
from operator import itemgetter
from typing import NamedTuple

import numpy as np
from numba.core import config, types

from kvnumba._kernels import _cache_dirs, check_cache_once, ensure_fresh_cache, entry
from kvnumba._kernels.jit import compile_twins
from kvnumba._kernels.versions import (
    STATE_ARENA,
    VIEWS_PAGED,
    VIEWS_POLICY,
    VIEWS_POLICY_PAGED,
    state_arena,
)

log = logging.getLogger("kvnumba")
_announced = False

_VEC = types.Array(types.int64, 1, "C")
_INT = types.int64
_BOOL = types.boolean
# Engine keys: any strides, so that admit_one's facade needs no contiguity test (its kernel
# checks the row width itself); one type for every keyed kernel, which share their workers.
_KEYS = types.Array(types.uint64, 2, "A")

SIGNATURES = {
    "k_new_sequences": (_INT,),
    "k_append": (_VEC, _VEC, _VEC, _BOOL, _BOOL, _INT),
    "k_can_append": (_VEC, _VEC),
    "k_admit": (_VEC, _VEC, _VEC, _BOOL),
    "k_fork": (_VEC, _INT),
    "k_release": (_VEC,),
    "k_block_tables": (_VEC,),
    "k_seq_lens": (_VEC,),
    "k_check": (),
    "k_rollback": (),
    # Engine conveniences: compiled on first use only (never by the quick start).
    "k_truncate": (_VEC, _VEC),
    "k_release_window": (_VEC, _VEC),
    "k_evict": (_VEC,),
    "k_reset_prefix_cache": (),
    # Engine keys, hit caps and lookups (``block_keys``; ``kvnumba.integrations.vllm``).
    "k_admit_keys": (_VEC, _VEC, _VEC, _BOOL, _BOOL, _KEYS, _VEC, _VEC),
    "k_lookup": (_VEC, _VEC, _VEC, _VEC),
    "k_lookup_keys": (_VEC, _VEC, _VEC, _BOOL, _KEYS, _VEC, _VEC),
    "k_set_keys": (_VEC, _VEC, _VEC, _KEYS),
    # One request at a time: scalars in and out (``append_one``, ``admit_one``).
    "k_append_one": (_INT, _INT),
    "k_append_one_keys": (_INT, _INT, _INT, _KEYS),
    "k_admit_one": (_VEC, _INT, _INT),
    "k_admit_one_keys": (_INT, _INT, _KEYS, _INT),
    "k_lookup_one": (_VEC, _INT, _INT),
    "k_lookup_one_keys": (_INT, _INT, _KEYS, _INT),
    # Managers on a page pool: the pool's arena is a third arena argument.
    "k_append_paged": (_VEC, _VEC, _VEC, _BOOL, _BOOL, _INT),
    "k_can_append_paged": (_VEC, _VEC),
    "k_admit_paged": (_VEC, _VEC, _VEC, _BOOL),
    "k_release_paged": (_VEC,),
    "k_give_up": (_INT, _BOOL),
    "k_commit_give_up": (),
    "k_rollback_paged": (),
    "k_check_paged": (),
    "k_truncate_paged": (_VEC, _VEC),
    "k_release_window_paged": (_VEC, _VEC),
    "k_evict_paged": (_VEC,),
    "k_reset_prefix_cache_paged": (),
    "k_admit_keys_paged": (_VEC, _VEC, _VEC, _BOOL, _BOOL, _KEYS, _VEC, _VEC),
    # The simulator's hindsight policy (``oracle``): the next use of given blocks.
    "k_set_next_use": (_VEC, _VEC),
    # A priority policy's per-block tags.
    "k_set_tags": (_VEC, _VEC),
    # ... and per-sequence tags, given to the blocks a sequence's release caches.
    "k_set_sequence_tags": (_VEC, _VEC),
}
# ---------------------------------------------------------------------------------- results
# An entry kernel returns a plain tuple: boxing a named tuple at the Python boundary would cost
# every call. Each layout is named once, below, by a NamedTuple of its fields, and the facade
# reads a result only through the getters made from those names (``operator.itemgetter``, a C
# call as cheap as indexing the tuple).


class HeadLayout(NamedTuple):
    """``k_release``, ``k_can_append``: the head every state-changing kernel returns first."""

    status: int  #: 0, or the failure's ``kvnumba.errors.ST_*`` code
    bad: int  #: index of the offending input, -1 for none
    needed: int  #: blocks needed (``PoolExhausted``), or record rows (``ST_NEED_BUFFERS``)
    available: int  #: blocks available (``PoolExhausted``)


class CountLayout(NamedTuple):
    """``k_truncate`` (0 blocks), ``k_release_window``, ``k_evict``, ``k_reset_prefix_cache``,
    ``k_set_keys``: the head, then the blocks released, evicted or registered."""

    status: int
    bad: int
    needed: int
    available: int
    blocks: int


class AppendLayout(NamedTuple):
    """``k_append``: the head, then the fields of :class:`kvnumba.AppendResult`."""

    status: int
    bad: int
    needed: int
    available: int
    slot_mapping: np.ndarray
    cow_src: np.ndarray
    cow_dst: np.ndarray
    ok: np.ndarray


class AdmitLayout(NamedTuple):
    """``k_admit``, ``k_admit_keys``: the head, then the fields of :class:`kvnumba.AdmitResult`."""

    status: int
    bad: int
    needed: int
    available: int
    ids: np.ndarray
    num_cached_tokens: np.ndarray
    slot_mapping: np.ndarray
    ok: np.ndarray


class AppendOneLayout(NamedTuple):
    """``k_append_one``, ``k_append_one_keys``: the head, then what ``append_one`` returns and
    the sequence's slot; -1 for no block copy."""

    status: int
    bad: int
    needed: int
    available: int
    blocks_before: int
    blocks_after: int
    cow_src: int
    cow_dst: int
    slot: int


class AdmitOneLayout(NamedTuple):
    """``k_admit_one``, ``k_admit_one_keys``: what ``admit_one`` returns, after the status
    (a failed call is served again by the batched ``admit``, which names the failure)."""

    status: int
    seq_id: int
    num_cached_tokens: int


class ReadLayout(NamedTuple):
    """``k_block_tables``, ``k_seq_lens``, ``k_fork`` (the children), ``k_lookup_one`` and
    ``k_lookup_one_keys`` (the hit blocks): status, offending input, the array read or made."""

    status: int
    bad: int
    values: np.ndarray


class LookupLayout(NamedTuple):
    """``k_lookup``, ``k_lookup_keys``: status, offending input, the fields of
    :class:`kvnumba.LookupResult`."""

    status: int
    bad: int
    num_cached_tokens: np.ndarray
    block_ids: np.ndarray


class NewSequencesLayout(NamedTuple):
    """``k_new_sequences``: status and the new ids."""

    status: int
    ids: np.ndarray


class CheckLayout(NamedTuple):
    """``k_check``: 0 or the first violation's code, and its two numbers (``MESSAGES``)."""

    code: int
    a: int
    b: int


class SequenceIdsLayout(NamedTuple):
    """``k_set_sequence_tags``: the status and the index of the offending sequence id."""

    status: int
    bad: int


class StatusLayout(NamedTuple):
    """``k_set_next_use``, ``k_set_tags``: the status alone."""

    status: int


class NoneLayout(NamedTuple):
    """``k_rollback``, ``k_commit_give_up``: nothing (they cannot fail)."""


class CountOnlyLayout(NamedTuple):
    """``k_give_up``: a bare count, the pages unmapped (not a tuple)."""

    pages: int


#: The layout of what each entry kernel returns (a page variant returns its plain twin's).
RESULTS: dict[str, type] = {
    "k_new_sequences": NewSequencesLayout,
    "k_append": AppendLayout,
    "k_can_append": HeadLayout,
    "k_admit": AdmitLayout,
    "k_fork": ReadLayout,
    "k_release": HeadLayout,
    "k_block_tables": ReadLayout,
    "k_seq_lens": ReadLayout,
    "k_check": CheckLayout,
    "k_rollback": NoneLayout,
    "k_truncate": CountLayout,
    "k_release_window": CountLayout,
    "k_evict": CountLayout,
    "k_reset_prefix_cache": CountLayout,
    "k_admit_keys": AdmitLayout,
    "k_lookup": LookupLayout,
    "k_lookup_keys": LookupLayout,
    "k_set_keys": CountLayout,
    "k_append_one": AppendOneLayout,
    "k_append_one_keys": AppendOneLayout,
    "k_admit_one": AdmitOneLayout,
    "k_admit_one_keys": AdmitOneLayout,
    "k_lookup_one": ReadLayout,
    "k_lookup_one_keys": ReadLayout,
    "k_give_up": CountOnlyLayout,
    "k_commit_give_up": NoneLayout,
    "k_set_next_use": StatusLayout,
    "k_set_tags": StatusLayout,
    "k_set_sequence_tags": SequenceIdsLayout,
}


def getter(layout: type, *names: str) -> itemgetter:
    """A decoder of ``layout``'s fields ``names`` (one name: the field; several: a tuple)."""
    fields = layout._fields  # type: ignore[attr-defined]
    return itemgetter(*(fields.index(name) for name in names))


# The decoders the facade reads results with. ``status`` and the head come first in every
# layout that has them (``RESULTS`` and the import-time check below).
status_of = getter(HeadLayout, "status")
head_of = getter(HeadLayout, "status", "bad", "needed", "available")
needed_of = getter(HeadLayout, "needed")
count_of = getter(CountLayout, "blocks")
append_result_of = getter(AppendLayout, "slot_mapping", "cow_src", "cow_dst", "ok")
admit_result_of = getter(AdmitLayout, "ids", "num_cached_tokens", "slot_mapping", "ok")
append_one_result_of = getter(
    AppendOneLayout, "blocks_before", "blocks_after", "cow_src", "cow_dst"
)
admit_one_result_of = getter(AdmitOneLayout, "seq_id", "num_cached_tokens")
bad_of = getter(ReadLayout, "bad")
resolved_of = getter(SequenceIdsLayout, "status", "bad")
values_of = getter(ReadLayout, "values")
lookup_result_of = getter(LookupLayout, "num_cached_tokens", "block_ids")
new_ids_of = getter(NewSequencesLayout, "ids")
violation_of = getter(CheckLayout, "code", "a", "b")


def position(layout: type, name: str) -> int:
    """Where field ``name`` of ``layout`` is in a result tuple."""
    return layout._fields.index(name)  # type: ignore[attr-defined]


def span(layout: type, first: str, last: str) -> slice:
    """The fields ``first`` to ``last`` of ``layout``, as a slice of a result tuple."""
    return slice(position(layout, first), position(layout, last) + 1)


# The one-request calls and the decode step's append cost a few hundred nanoseconds, where a
# getter's call adds tens: their fast paths index the result with these, found by name in the
# layouts above as the getters are.
STATUS = position(HeadLayout, "status")
APPEND_RESULT = span(AppendLayout, "slot_mapping", "ok")
APPEND_ONE_RESULT = span(AppendOneLayout, "blocks_before", "cow_dst")
ADMIT_ONE_ID = position(AdmitOneLayout, "seq_id")
ADMIT_ONE_CACHED = position(AdmitOneLayout, "num_cached_tokens")


def _check_results() -> None:
    """Every kernel has a layout, and every layout with a status starts with it (and with the
    whole head, if it names ``needed``): the shared getters above read any of them."""
    plain = {name for name in SIGNATURES if not name.endswith("_paged")}
    if set(RESULTS) != plain:
        raise ImportError(f"kernels without a result layout: {sorted(plain ^ set(RESULTS))}")
    for layout in RESULTS.values():
        fields = layout._fields  # type: ignore[attr-defined]
        if "status" in fields and fields[0] != "status":
            raise ImportError(f"{layout.__name__}: status is not its first field")
        if "needed" in fields and fields[:4] != HeadLayout._fields:
            raise ImportError(f"{layout.__name__}: its head differs from HeadLayout's")


#: The one-request kernels (``append_one``, ``admit_one``, ``lookup_one``): never run on a page
#: pool; they take each arena as its address and size.
ONE_REQUEST = frozenset(
    {
        "k_append_one",
        "k_append_one_keys",
        "k_admit_one",
        "k_admit_one_keys",
        "k_lookup_one",
        "k_lookup_one_keys",
    }
)
#: Kernels that exist only for a manager whose eviction policy is not LRU.
POLICY_ONLY = frozenset({"k_set_next_use", "k_set_tags", "k_set_sequence_tags"})
#: Kernels a manager loads on first use even on a page pool (``_kernel_set.Lazy``): rarely
#: called, they would lengthen every paged manager's first construction (the one-request
#: kernels and the policy-only ones among them).
LAZY = frozenset(
    {
        "k_truncate",
        "k_release_window",
        "k_evict",
        "k_reset_prefix_cache",
        "k_admit_keys",
        "k_lookup",
        "k_lookup_keys",
        "k_set_keys",
        *ONE_REQUEST,
        *POLICY_ONLY,
    }
)
#: Every kernel an LRU manager can call (``kvnumba compile``).
LRU = tuple(name for name in SIGNATURES if name not in POLICY_ONLY)
#: Kernels taking the page pool's arena after the manager's two.
PAGED = frozenset(name for name in SIGNATURES if "paged" in name or "give_up" in name)
#: Kernels whose workers are compiled with the page code (``entry.with_pages``): the paged
#: ones that take or release blocks, and the rarely used plain ones, which share their
#: workers with their paged twins. The rest (``check``, ``can_append``, the rollback) never
#: reach the page bookkeeping and share the plain workers on a page pool too.
WITH_PAGES = frozenset(
    {
        "k_append_paged",
        "k_admit_paged",
        "k_admit_keys_paged",
        "k_release_paged",
        "k_truncate_paged",
        "k_release_window_paged",
        "k_evict_paged",
        "k_reset_prefix_cache_paged",
        "k_give_up",
        "k_truncate",
        "k_release_window",
        "k_evict",
        "k_reset_prefix_cache",
    }
)


def compiled(name: str, policy: bool = False):
    """Entry point of the entry kernel ``name`` for the facade's argument types.

    Parameters
    ----------
    name : str
        A key of :data:`SIGNATURES`.
    policy : bool
        For a manager whose eviction policy is not LRU: the kernel's version with the policy
        code (its state arena typed apart; not for :data:`ONE_REQUEST`).

    Returns
    -------
    callable
        The compiled function; it takes the call's inputs followed by the two arenas (and the
        page pool's arena for the kernels of :data:`PAGED`).
    """
    dispatcher = getattr(entry, name)
    ensure_fresh_cache()
    # numba.config sets its options at run time, out of a type checker's sight.
    if config.DISABLE_JIT:  # type: ignore[attr-defined]  # plain Python kernels (coverage)
        return dispatcher
    if policy:
        compile_twins(VIEWS_POLICY_PAGED if name in WITH_PAGES else VIEWS_POLICY)
    elif name in WITH_PAGES:
        compile_twins(VIEWS_PAGED)  # the helpers' versions for views with the page code
    signature = (*SIGNATURES[name], *arena_types(name, policy))
    if signature not in dispatcher.overloads and not is_cached(name, policy):
        _announce()
    dispatcher.compile(signature)
    return dispatcher.overloads[signature].entry_point


def arena_types(name: str, policy: bool = False) -> tuple:
    """numba types of the arena arguments the entry kernel ``name`` takes after its inputs:
    the two arenas (and the page pool's for :data:`PAGED`; the state arena typed apart for a
    ``policy`` manager), or, for :data:`ONE_REQUEST`, each arena's address and size
    (``carve.arena_at``)."""
    if name in ONE_REQUEST:
        return (_INT,) * 4
    # Which version (plain, paged, policy) the types select: ``_kernels/versions.py``.
    return (state_arena(policy),) + (STATE_ARENA,) * (2 if name in PAGED else 1)


def is_cached(name: str, policy: bool = False) -> bool:
    """Whether numba's on-disk cache holds the entry kernel ``name`` (its index file); with
    ``policy``, whether it holds two versions (one data file each), as it does once the
    version for an eviction policy other than LRU was compiled after the LRU one."""
    if not policy:
        return any(any(d.glob(f"entry.{name}-*.nbi")) for d in _cache_dirs())
    return any(len(list(d.glob(f"entry.{name}-*.nbc"))) >= 2 for d in _cache_dirs())


def uncached(names) -> list[str]:
    """The kernels of ``names`` that must be compiled before they run in this process.

    A cache compiled from other sources is dropped first (once per process), so a kernel it
    held counts as uncached.

    Parameters
    ----------
    names : iterable of str
        Keys of :data:`SIGNATURES`.

    Returns
    -------
    list of str
        Those whose index file numba's cache lacks.
    """
    check_cache_once()
    return [name for name in names if not is_cached(name)]


def notice_given() -> None:
    """Say that the caller has told the user about the compile: no compile notice follows."""
    global _announced
    _announced = True


def _announce() -> None:
    """Say once per process that kernels are being compiled (a first run takes a while)."""
    global _announced
    if not _announced:
        _announced = True
        log.warning(
            "kvnumba: compiling kernels for this machine on first use (up to half a minute of "
            "CPU each on older numba releases; cached afterwards, and `kvnumba compile` "
            "compiles all of them ahead of time)"
        )


def compile_all(names=None, progress=None, policy: bool = False) -> dict[str, float]:
    """Compile (or load from numba's cache) every entry kernel; returns CPU seconds per kernel.

    Parameters
    ----------
    names : iterable of str, optional
        Kernels to compile; all of :data:`SIGNATURES` by default (those of
        :data:`POLICY_ONLY` only with ``policy``).
    progress : callable, optional
        Called as ``progress(name, seconds)`` after each kernel.
    policy : bool
        Compile the versions for managers whose eviction policy is not LRU (no
        :data:`ONE_REQUEST` kernel has one).
    """
    spent = {}
    for name in names or (SIGNATURES if policy else LRU):
        if policy and name in ONE_REQUEST:
            continue
        start = time.process_time()
        compiled(name, policy)
        spent[name] = time.process_time() - start
        if progress is not None:
            progress(name, spent[name])
    return spent


#: The kernels of a manager without a page pool (what the simulator and the benchmarks use).
PLAIN = tuple(name for name in SIGNATURES if name not in PAGED and name not in LAZY)
#: The kernels of a manager with another eviction policy that a simulation or a benchmark uses.
POLICY = (*PLAIN, "k_set_next_use")

#: The kernels an engine's one-request calls use (``kvnumba.integrations.vllm``): the lookup,
#: admission and growth of one request with engine keys, key registration, release, and the
#: batched calls a failed one-request call falls back to (so that the first preemption does not
#: compile), in two groups of about equal compile time that compile in parallel where there is
#: a core for each (``kvnumba compile --engine --group I``). The one-request admission carries
#: most of it (its worker also compiles the shared growth worker, which the second group
#: compiles again).
ENGINE_GROUPS = (
    ("k_admit_one_keys",),
    ("k_lookup_one_keys", "k_append_one", "k_set_keys", "k_release", "k_append", "k_admit_keys"),
)
#: Kernels of a group that share their worker with another group's kernel: compiled alone, a
#: group waits for that group's compile (its lock) and loads the worker from the cache.
ENGINE_AFTER = {"k_admit_keys": 0}
#: All of :data:`ENGINE_GROUPS`; ``kvnumba compile --engine`` compiles just these.
ENGINE = tuple(name for group in ENGINE_GROUPS for name in group)
#: What an engine's manager with an eviction policy other than LRU calls (its one-request
#: calls that change state take the batched kernels; lookups read the state with the LRU ones).
ENGINE_POLICY = ("k_admit_keys", "k_append", "k_set_keys", "k_release", "k_lookup_keys")
#: What vLLM's manager of windowed or several KV cache groups calls (the extended kernels).
ENGINE_GROUPED = (*ENGINE_POLICY, "k_release_window")


def prepare(names=PLAIN, stream=None, policy: bool = False) -> None:
    """Load ``names`` before a command starts its work, saying so on ``stream`` if they must be
    compiled first (a cold cache), so that no progress bar freezes on a compile.

    With ``policy``, the versions for managers whose eviction policy is not LRU.
    """
    global _announced
    missing = [name for name in names if not is_cached(name, policy)]
    if missing and stream is not None:
        _announced = True  # said here, not again through logging
        print(
            f"kvnumba: compiling {len(missing)} kernels for this machine (first run only; "
            f"`kvnumba compile{' --policies' if policy else ''}` does it ahead of time) ...",
            file=stream,
            flush=True,
        )
        start = time.process_time()
        compile_all(names, policy=policy)
        print(f"kvnumba: compiled in {time.process_time() - start:.0f} s of CPU", file=stream)
    else:
        compile_all(names, policy=policy)


_check_results()
