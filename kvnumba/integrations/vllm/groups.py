"""``KVNumbaGroupsKVCacheManager``: vLLM's ``KVCacheManager`` for hybrid and windowed models.

vLLM serves a model whose layers differ (full attention beside sliding-window or chunked local
attention) with one block pool shared by several KV cache groups, each with its own
single-type manager, and a hybrid coordinator that finds the longest prefix every group can
serve. kvnumba has the same thing in one manager: ``BlockManager(kv_cache_groups=...)``, one
sequence per group for every request, one free list, one prefix cache, one budget
(``docs/windows.md``). This adapter maps one vLLM request to one kvnumba admission with a
sequence per group, and vLLM's calls to kvnumba's:

- ``get_computed_blocks``: ``lookup_one`` (the hit every group can serve, positions below a
  group's window as ``NULL_BLOCK``, which is vLLM's null block here: block 0);
- ``allocate_slots``: ``release_window`` of the tokens vLLM has processed
  (``remove_skipped_blocks``), then ``admit_one`` of a new request or one ``append`` of all
  groups of a running one, then ``set_keys`` of the blocks that became full;
- ``free``: ``release`` of the request's sequences, group 0 first, each tail first (vLLM's
  coordinator order); a deferred free releases them in the reverse order, as vLLM's
  ``free_blocks(reversed(blocks))`` does.

The manager releases out-of-window blocks only when vLLM says so (``window_release=
"explicit"``), so block ids, hits, evictions and events follow vLLM's own manager step for
step. The counting of ``get_num_blocks_to_allocate`` is vLLM's, per group, so the scheduler's
decisions are the same too. Like :class:`~kvnumba.integrations.vllm.manager.
KVNumbaKVCacheManager`, the request's sequences hold whole blocks.
"""

from __future__ import annotations

import os

import numpy as np
from vllm.distributed.kv_events import MEDIUM_GPU, BlockRemoved
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import RequestStatus

import kvnumba
from kvnumba.eviction import policy_code
from kvnumba.integrations.block_hashes import KEY_BYTES, hash_from_key, keys_from_hashes
from kvnumba.integrations.vllm import _events
from kvnumba.integrations.vllm._maintenance import CacheMaintenance
from kvnumba.integrations.vllm._unserved import UnservedFeatureSteps
from kvnumba.integrations.vllm._views import BlockPoolView, GroupsCoordinatorView
from kvnumba.integrations.vllm.manager import EVICTION_ENV
from kvnumba.integrations.vllm.support import manager_fallback_reason
from kvnumba.kernels import ENGINE_GROUPED, compile_all
from kvnumba.state import BlockFlag, Meta, slot_mask
from kvnumba.windows import KVCacheGroup

logger = init_logger(__name__)

_NO_KEYS = np.zeros((0, 4), dtype=np.uint64)
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)

# The attention kind of a group, as vLLM's single-type managers count skipped tokens.
FULL, SLIDING, CHUNKED = 0, 1, 2


def skipped_tokens(kind: int, size: int, num_computed_tokens: int) -> int:
    """Tokens the next token of a sequence of ``num_computed_tokens`` cannot reach.

    vLLM's ``get_num_skipped_tokens``: none for full attention, ``n - W + 1`` for a sliding
    window of ``W`` tokens, the tokens before the current chunk of ``C`` for chunked local
    attention. kvnumba's ``first_needed`` is this divided by the block size.

    Parameters
    ----------
    kind : int
        ``FULL``, ``SLIDING`` or ``CHUNKED``.
    size : int
        The window or chunk in tokens (unused for full attention).
    num_computed_tokens : int
        Tokens computed.

    Returns
    -------
    int
        The skipped tokens.
    """
    if kind == SLIDING:
        return max(0, num_computed_tokens - size + 1)
    if kind == CHUNKED:
        return num_computed_tokens // size * size
    return 0


class _HeldGroups:
    """A request's kvnumba sequences, one per group: ids, table rows, blocks held (table
    positions, the same in every group), leading blocks with keys, leading positions of each
    group that hold the null block, and the block lists vLLM sees (``req_to_blocks``, changed
    in place as vLLM changes its own)."""

    __slots__ = ("ids", "slots", "nblocks", "ncached", "nulls", "blocks", "view")

    def __init__(self, ids: np.ndarray, slots: list, nblocks: int, ncached: int, blocks) -> None:
        self.ids = ids
        self.slots = slots
        self.nblocks = nblocks
        self.ncached = ncached
        self.nulls = [sum(1 for b in group if b.is_null) for group in blocks]
        self.blocks = blocks
        self.view = KVCacheBlocks(blocks)


class KVNumbaGroupsKVCacheManager(CacheMaintenance, UnservedFeatureSteps):
    """vLLM's ``KVCacheManager`` for full-attention, sliding-window and chunked-local groups
    over one pool, backed by kvnumba's KV cache groups.

    The constructor takes ``KVCacheManager``'s arguments; a configuration kvnumba does not
    serve (:func:`~kvnumba.integrations.vllm.support.manager_fallback_reason`) raises
    ``ValueError`` (``KVNumbaScheduler`` checks first and keeps vLLM's manager instead).

    Parameters
    ----------
    kv_cache_config : vllm.v1.kv_cache_interface.KVCacheConfig
        One to eight groups of ``FullAttentionSpec``, ``MLAAttentionSpec``,
        ``SlidingWindowSpec`` or ``ChunkedLocalAttentionSpec`` of one block size.
    max_model_len, scheduler_block_size, hash_block_size, max_in_flight_tokens, enable_caching,
    use_eagle, num_hash_lookahead_tokens, num_prefill_lookahead, log_stats,
    enable_kv_cache_events, dcp_world_size, pcp_world_size, metrics_collector, watermark,
    enable_mamba_shared_prefix_checkpoint
        As for vLLM's ``KVCacheManager``.
    max_seqs : int, optional
        Requests that may hold blocks at once; default ``min(num_blocks - 1, 1024)``.
    eviction : str, optional
        kvnumba's eviction policy; default ``KVNUMBA_EVICTION``, else ``"lru"``.

    Notes
    -----
    Single-threaded, as vLLM's scheduler is. Every call goes through kvnumba's batched
    kernels (the windowed ones), compiled or loaded here, not while serving.
    """

    def __init__(
        self,
        kv_cache_config,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector=None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        *,
        max_seqs: int | None = None,
        eviction: str | None = None,
    ) -> None:
        reason = manager_fallback_reason(
            kv_cache_config,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            metrics_collector=metrics_collector,
            use_eagle=use_eagle,
            num_prefill_lookahead=num_prefill_lookahead,
        )
        if reason is not None:
            raise ValueError(f"kvnumba's vLLM manager does not serve this model: {reason}")
        if watermark < 0.0:
            raise ValueError("watermark must be non-negative")
        specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
        num_blocks = kv_cache_config.num_blocks
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.block_size = bs = specs[0].block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = None
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.num_kv_cache_groups = groups = len(specs)
        self.retained_hit_group_ids = ()
        self.mamba_shared_prefix_checkpoint = False
        self.watermark_blocks = int(watermark * num_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(s).value, get_kv_cache_spec_sliding_window(s)) for s in specs
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in specs))
        self._hash_lookahead = num_hash_lookahead_tokens
        # Each group's kind, window or chunk, and vLLM's per-request admission cap (the
        # recycling-aware bound of windowed groups under full_sequence_must_fit).
        self._kinds: list[tuple[int, int, int | None]] = []
        for spec in specs:
            if isinstance(spec, SlidingWindowSpec):
                kind, size = SLIDING, spec.sliding_window
            elif isinstance(spec, ChunkedLocalAttentionSpec):
                kind, size = CHUNKED, spec.attention_chunk_size
            else:
                self._kinds.append((FULL, 0, None))
                continue
            cap = spec.max_admission_blocks_per_request(
                max_in_flight_tokens=max_in_flight_tokens, max_model_len=max_model_len
            )
            self._kinds.append((kind, size, cap))
        self._windowed = [g for g, (kind, _, _) in enumerate(self._kinds) if kind != FULL]
        # vLLM's default retention interval 0 caches a sliding-window group's blocks only where
        # a later hit can end: the window's blocks before a prompt's last token (a resend or an
        # extension of the prompt) and before a shared-prefix junction. None caches densely;
        # full-attention and chunked groups always do. (A positive interval falls back.)
        retention = kv_cache_config.prefix_cache_retention_interval
        self._sparse = [
            g for g in self._windowed if self._kinds[g][0] == SLIDING and retention == 0
        ]
        # Groups searched together first by vLLM's hybrid coordinator (full attention first,
        # groups of equal specs jointly): their hit alone is the longest hit of a lookup, and
        # what it exceeds the reconciled hit by is the junction a sparse group must cache.
        first = next((g for g, (kind, _, _) in enumerate(self._kinds) if kind == FULL), 0)
        self._lead = [g for g, spec in enumerate(specs) if spec == specs[first]]
        # Registered digests and their groups (a bit each), from kvnumba's block events: the
        # lead groups' own hit needs them (see get_computed_blocks).
        self._registered: dict[bytes, int] = {}
        self._copies: dict[tuple[bytes, int], int] = {}  # blocks registered per digest and group
        self._lead_mask = sum(1 << g for g in self._lead)
        self._track = enable_caching and len(specs) > 1
        if max_seqs is None:
            max_seqs = min(num_blocks - 1, 1024)
        if eviction is None:
            eviction = os.environ.get(EVICTION_ENV) or "lru"
        policy_code(eviction)  # a bad name fails here, before any compile
        # A windowed or grouped manager runs the kernels' extended versions: compiled (or
        # loaded) now, not at the first step.
        compile_all(ENGINE_GROUPED, policy=True)
        self.kvnumba = kvnumba.BlockManager(
            num_blocks,
            bs,
            max_seqs=max(1, max_seqs) * groups,
            max_seq_len=-(-max_model_len // bs) * bs,
            prefix_caching=enable_caching,
            reserved_blocks=1,
            block_keys=True,
            block_events=enable_caching and (len(specs) > 1 or enable_kv_cache_events),
            eviction=eviction,
            window_release="explicit",
            # vLLM caches a block computed again beside the cached one of its hash.
            cache_duplicates=True,
            kv_cache_groups=[
                KVCacheGroup(
                    sliding_window=size if kind == SLIDING else None,
                    attention_chunk_size=size if kind == CHUNKED else None,
                )
                for kind, size, _ in self._kinds
            ],
        )
        state = self.kvnumba.state
        self._table = state.seq_table
        self._ref = state.ref
        self._meta = state.meta
        self._flags = state.block_flags
        self._slot_mask = slot_mask(self.kvnumba.max_seqs)
        self._usable = num_blocks - 1
        self.held: dict[str, _HeldGroups] = {}
        # Requests whose blocks pop_blocks_for_free handed out, until free_blocks returns them.
        self.deferred: list[_HeldGroups] = []
        self.hash_width = KEY_BYTES
        self.pending_events: list = []
        self._events_on = enable_kv_cache_events and enable_caching
        # The group of each block, as of its last registration: kvnumba's removal events name
        # the block, and vLLM's name the group it was cached for.
        self._block_group = np.zeros(num_blocks, dtype=np.int64)
        self._last_hits: tuple[str, np.ndarray] | None = None
        self.block_pool = BlockPoolView(self)
        self._blocks = self.block_pool.blocks
        self._block_arr = np.empty(len(self._blocks), dtype=object)
        self._block_arr[:] = self._blocks
        self.coordinator = GroupsCoordinatorView(self, specs)

    # ------------------------------------------------------------------------------ helpers
    def _keys(self, hashes, start: int, stop: int) -> np.ndarray:
        """Keys of ``hashes[start:stop]``; learns the digest length from the first hash."""
        if stop <= start:
            return _NO_KEYS
        self.hash_width = len(hashes[start])
        return keys_from_hashes(hashes, start, stop)

    def _lists(self, rows: np.ndarray) -> tuple[list, ...]:
        """Block stand-in lists of table rows (``NULL_BLOCK`` and padding become block 0)."""
        return tuple(self._block_arr[np.maximum(row, 0)].tolist() for row in rows)

    def blocks_of(self, request_id: str, group: int = 0) -> list:
        """Block stand-ins of a held request in one group (``req_to_blocks``)."""
        return self.held[request_id].blocks[group]

    def flush_keys(self) -> None:
        """Keys are registered as blocks fill: nothing is queued."""

    def _num_free(self) -> int:
        return self._usable - int(self._meta[Meta.USED])

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks that requests reference."""
        return self.block_pool.get_usage()

    # ------------------------------------------------------------------------- the hot path
    def get_computed_blocks(
        self, request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The longest prefix every group can serve from the cache: kvnumba ``lookup_one``.

        Returns
        -------
        tuple
            ``(KVCacheBlocks, hit tokens, 0)``: per group the hit blocks, the null block at
            the positions a windowed group does not need.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        hashes = request.block_hashes
        n = min(max_cache_hit_length // self.block_size, len(hashes))
        if n <= 0:
            return self.empty_kv_cache_blocks, 0, 0
        found = self.kvnumba.lookup_one(
            length=n * self.block_size + 1, keys=self._keys(hashes, 0, n)
        ).reshape(self.num_kv_cache_groups, -1)
        hits = found.shape[1]
        # vLLM's shared-prefix boundary: where the lead groups alone would hit, when that is
        # past the hit every group serves (a sparse group then caches the junction).
        junction = 0
        if self._track and hits < n:
            self._drain(None, None)
            lead = self._lead_hit(hashes, n)
            if lead > hits:
                junction = lead * self.block_size
        if hits == 0:
            return self.empty_kv_cache_blocks, 0, junction
        self._last_hits = (request.request_id, found)
        if self._events_on and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            for g, (kind, _) in enumerate(self.kv_cache_event_metadata):
                self.pending_events.append(
                    _events.block_stored(
                        request, 0, hits, self.block_size, kind, self._hash_lookahead, g
                    )
                )
        return KVCacheBlocks(self._lists(found)), hits * self.block_size, junction

    def _lead_hit(self, hashes, n: int) -> int:
        """Blocks the lead groups alone hit among the first ``n`` (vLLM's rules per kind)."""
        registered, mask = self._registered, self._lead_mask
        kind, size, _ = self._kinds[self._lead[0]]
        if kind == FULL:
            k = 0
            while k < n and registered.get(hashes[k], 0) & mask == mask:
                k += 1
            return k
        cached = [registered.get(hashes[i], 0) & mask == mask for i in range(n)]
        bs = self.block_size
        if kind == CHUNKED:
            k = n * bs // size * size // bs
            while k < n and cached[k]:
                k += 1
            return k
        need, run = -(-(size - 1) // bs), 0
        for i in range(n - 1, -1, -1):
            if not cached[i]:
                run = 0
                continue
            run += 1
            if run >= need:
                return i + run
        return run

    def get_computed_blocks_for_connector(
        self, request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """:meth:`get_computed_blocks` plus ``hit_diverged`` (False: one hit for all groups)."""
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks=(),
        total_computed_tokens: int = 0,
        apply_admission_cap: bool = False,
    ) -> int:
        """Blocks vLLM counts against the free pool to give a request ``num_tokens`` slots.

        vLLM's per-group count, summed: a held request needs the positions it lacks; a new
        one the positions past its hits (or past the positions its window skips) plus every
        hit it takes off the free pool (refcount 0). With ``apply_admission_cap`` a windowed
        group counts at most its recycling-aware cap.
        """
        needed = -(-num_tokens // self.block_size)
        held = self.held.get(request_id)
        total = 0
        for g, (kind, size, cap) in enumerate(self._kinds):
            required = needed
            if apply_admission_cap and cap is not None and cap < required:
                required = cap
            if held is not None:
                total += max(required - held.nblocks, 0)
                continue
            hits = new_computed_blocks[g] if g < len(new_computed_blocks) else ()
            skipped = skipped_tokens(kind, size, total_computed_tokens) // self.block_size
            total += max(required - max(skipped, len(hits)), 0)
            if hits:
                ids = np.array([b.block_id for b in hits[skipped:]], dtype=np.int64)
                total += int(np.count_nonzero((self._ref[ids] == 0) & (ids != 0)))
        return total

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for its new (and lookahead) tokens; None if they do not fit.

        First the blocks the request's processed tokens no longer reach leave its windowed
        groups (``release_window``, kept even when the rest does not fit, as in vLLM); then a
        new request is admitted into every group (``admit_one``) or a held one grows in every
        group (one ``append``), and the keys of the blocks that became full are registered
        (``set_keys``). Arguments as vLLM's ``allocate_slots``; external tokens, delayed
        caching and encoder tokens are not served.

        Returns
        -------
        KVCacheBlocks or None
            The newly allocated blocks per group (hits excluded), or None.
        """
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            if num_external_computed_tokens == 0:
                raise ValueError(
                    "num_new_tokens must be greater than 0 when there are no "
                    "computed tokens to adopt"
                )
        if num_external_computed_tokens or delay_cache_blocks or num_encoder_tokens:
            raise NotImplementedError(
                "kvnumba's vLLM manager serves no KV connector or encoder-decoder model "
                "(KVNumbaScheduler keeps vLLM's manager for them)"
            )
        rid = request.request_id
        held = self.held.get(rid)
        hits = () if new_computed_blocks is None else new_computed_blocks.blocks
        num_hits = len(hits[0]) if hits else 0
        if held is not None and num_hits:
            raise ValueError(f"request {rid} already holds blocks; it takes no prefix hits")
        local = request.num_computed_tokens + num_new_computed_tokens
        computed = min(local, self.max_model_len)
        watermark = 0
        if self.watermark_blocks and has_scheduled_reqs and request.status in _ADMITTING:
            watermark = self.watermark_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = self.num_blocks_to_allocate(rid, full, hits, computed, True)
            if need + watermark > self._num_free():
                return None
        slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if held is not None:
            in_flight = getattr(request, "num_in_flight_tokens", 0)
            self._release_window(held, max(0, computed - in_flight))
        need = self.num_blocks_to_allocate(rid, slots, hits, local)
        if need + watermark > self._num_free() - reserved_blocks:
            return None
        to_cache = min(computed + num_new_tokens, request.num_tokens)
        if held is None:
            return self._admit(request, slots, num_hits, to_cache)
        return self._grow(held, request, slots, to_cache)

    def _admit(self, request, slots: int, num_hits: int, to_cache: int) -> KVCacheBlocks | None:
        """First allocation of a request: one ``admit_one`` of whole blocks in every group."""
        bs = self.block_size
        hashes = request.block_hashes
        nblocks = -(-slots // bs)
        num_keys = 0
        if self.enable_caching:
            num_keys = max(min(to_cache, len(hashes) * bs) // bs, num_hits)
        # The hits' keys find them; the other full blocks are registered after, group by
        # group (a sparse group registers only some of them).
        keys = self._keys(hashes, 0, num_hits)
        try:
            seqs, cached = self.kvnumba.admit_one(
                None, length=nblocks * bs, keys=keys, max_hit_blocks=num_hits
            )
        except (kvnumba.PoolExhausted, kvnumba.TooManySequences):
            return None
        ids = np.atleast_1d(np.array(seqs, dtype=np.int64))  # one group: a plain id
        if cached != num_hits * bs:
            self.kvnumba.release(ids)
            raise RuntimeError(
                f"request {request.request_id}: {num_hits} prefix-hit blocks were passed to "
                f"allocate_slots but only {cached // bs} are still cached (get_computed_blocks "
                "and allocate_slots must not be separated by calls that evict)"
            )
        slots_of = [int(s) & self._slot_mask for s in ids]
        lists = self._lists(self._table[slots_of, :nblocks])
        held = _HeldGroups(ids, slots_of, nblocks, num_hits, lists)
        self.held[request.request_id] = held
        self._last_hits = None
        self._cache_upto(held, request, num_keys * bs)
        if nblocks == num_hits:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple(group[num_hits:] for group in lists))

    def _grow(self, held: _HeldGroups, request, slots: int, to_cache: int):
        """A held request's new slots: one ``append`` of every group when it needs blocks."""
        bs = self.block_size
        nblocks = -(-slots // bs)
        old = held.nblocks
        if nblocks > old:
            counts = np.full(self.num_kv_cache_groups, (nblocks - old) * bs, dtype=np.int64)
            try:
                self.kvnumba.append(held.ids, counts)
            except kvnumba.PoolExhausted:
                return None
            held.nblocks = nblocks
        self._cache_upto(held, request, to_cache)
        if held.nblocks == old:
            return self.empty_kv_cache_blocks
        new = self._lists(self._table[held.slots, old : held.nblocks])
        for group, blocks in zip(held.blocks, new, strict=True):
            group += blocks  # in place: the lists get_blocks handed out grow, as vLLM's do
        return KVCacheBlocks(new)

    def _cache_upto(self, held: _HeldGroups, request, num_tokens: int) -> None:
        """Register the keys of the blocks full within ``num_tokens`` (``set_keys``): every
        such block of a dense group, the reachable ones of a sparse group."""
        if not self.enable_caching:
            return
        hashes = request.block_hashes
        full = min(min(num_tokens, len(hashes) * self.block_size) // self.block_size, held.nblocks)
        start = held.ncached
        runs = self._runs(held, request, start, full) if full > start else ()
        if runs:
            keys = self._keys(hashes, start, full)
            # One set_keys per round, a run of each group at most (a call names a sequence
            # once): one round unless a sparse group keeps two separate windows.
            todo = list(runs)
            while todo:
                now: list = []
                later: list = []
                seen = set()
                for run in todo:
                    (later if run[0] in seen else now).append(run)
                    seen.add(run[0])
                self.kvnumba.set_keys(
                    held.ids[[g for g, _, _ in now]],
                    np.array([a for _, a, _ in now], dtype=np.int64),
                    np.array([b - a for _, a, b in now], dtype=np.int64),
                    np.concatenate([keys[a - start : b - start] for _, a, b in now]),
                )
                todo = later
        held.ncached = max(held.ncached, full)
        if self._track or self._events_on:
            self._drain(request, held)
        if self._events_on and full > start:
            bs, lookahead = self.block_size, self._hash_lookahead
            for g, (kind, _) in enumerate(self.kv_cache_event_metadata):
                positions = [p for h, a, b in runs if h == g for p in range(a, b)]
                self.pending_events.append(
                    _events.block_stored(request, start, full, bs, kind, lookahead, g, positions)
                )

    def _runs(self, held: _HeldGroups, request, start: int, stop: int) -> list:
        """``(group, first, stop)`` runs of positions to register, in group order.

        A dense group registers ``start .. stop - 1`` but its null blocks; a sparse group (see
        ``_sparse``) only the window's blocks before each boundary a hit can end at: the
        prompt's last token and the request's shared-prefix junction (vLLM's
        ``reachable_block_mask`` with retention interval 0).
        """
        runs = []
        bs = self.block_size
        for g in range(self.num_kv_cache_groups):
            lo = max(start, held.nulls[g])
            if g not in self._sparse:
                if lo < stop:
                    runs.append((g, lo, stop))
                continue
            need = -(-(self._kinds[g][1] - 1) // bs)
            ends = {(request.num_prompt_tokens - 1) // bs}
            junction = getattr(request, "shared_prefix_boundary", 0)
            if junction:
                ends.add(junction // bs)
            keep = sorted(
                (max(lo, end - need), min(stop, end))
                for end in ends
                if max(lo, end - need) < min(stop, end)
            )
            for a, b in keep:
                if runs and runs[-1][0] == g and a <= runs[-1][2]:
                    runs[-1] = (g, runs[-1][1], max(b, runs[-1][2]))
                else:
                    runs.append((g, a, b))
        return runs

    def _drain(self, request, held) -> None:
        """vLLM's ``BlockRemoved`` events for kvnumba's removals of the last call, in order.

        Registrations update each block's group; their ``BlockStored`` events are built by
        :meth:`_stored` from the request, as vLLM builds them.
        """
        if not self.kvnumba.pending_events:
            return
        events = self.kvnumba.take_events()
        salt = self.kvnumba.state.block_salt
        groups, width = self.num_kv_cache_groups, self.hash_width
        out = self.pending_events if self._events_on else None
        registered, copies = self._registered, self._copies
        for k, b, key in zip(events.kind.tolist(), events.block.tolist(), events.key, strict=True):
            digest = hash_from_key(key, width)
            if k == _events.STORED:
                g = self._block_group[b] = int(salt[b]) % groups
                registered[digest] = registered.get(digest, 0) | (1 << g)
                copies[digest, g] = copies.get((digest, g), 0) + 1
            elif k == _events.REMOVED:
                g = int(self._block_group[b])
                if copies[digest, g] > 1:  # another block of the group holds the digest
                    copies[digest, g] -= 1
                else:
                    del copies[digest, g]
                    left = registered[digest] & ~(1 << g)
                    if left:
                        registered[digest] = left
                    else:
                        del registered[digest]
                if out is not None:
                    out.append(
                        BlockRemoved(
                            block_hashes=[maybe_convert_block_hash(digest)],
                            medium=MEDIUM_GPU,
                            group_idx=g,
                        )
                    )

    def _release_window(self, held: _HeldGroups | None, processed: int) -> None:
        """vLLM's ``remove_skipped_blocks``: the windowed groups' blocks that the tokens after
        the first ``processed`` cannot reach leave the request (``release_window``), highest
        position first, group by group; their entries become the null block."""
        if held is None or not self._windowed:
            return
        bs, nblocks = self.block_size, held.nblocks
        firsts = {}
        for g in self._windowed:
            kind, size, _ = self._kinds[g]
            first = min(skipped_tokens(kind, size, processed) // bs, nblocks)
            if first > held.nulls[g]:
                firsts[g] = first
        if not firsts:
            return
        length = min(processed, nblocks * bs)
        self.kvnumba.release_window(held.ids, np.full(held.ids.shape[0], length, dtype=np.int64))
        null = self._blocks[0]
        for g, first in firsts.items():
            blocks = held.blocks[g]
            for i in range(held.nulls[g], first):
                blocks[i] = null
            held.nulls[g] = first
        if self._track or self._events_on:
            self._drain(None, held)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM does: only when no request holds a block."""
        if not super().reset_prefix_cache():
            return False
        if self.kvnumba.pending_events:
            self.kvnumba.take_events()  # the removals of the reset: AllBlocksCleared says it
        self._registered.clear()
        self._copies.clear()
        return True

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens=None
    ) -> None:
        """Release the blocks the request's processed tokens no longer reach (windowed
        groups); see :meth:`allocate_slots`."""
        self._release_window(self.held.get(request_id), processed_computed_tokens)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        """Register the keys of the blocks full within ``num_computed_tokens``."""
        held = self.held.get(request.request_id)
        if held is not None:
            self._cache_upto(held, request, num_computed_tokens)

    def free(self, request) -> None:
        """Release the request's sequences: group 0 first, each tail first (vLLM's order)."""
        held = self.held.pop(request.request_id, None)
        if held is not None:
            self.kvnumba.release(held.ids)

    def pop_blocks_for_free(self, request) -> list:
        """Drop ``request``'s bookkeeping but keep its blocks: vLLM's deferred free.

        Returns
        -------
        list
            The request's blocks, group after group (null blocks included, as vLLM's).
        """
        held = self.held.pop(request.request_id, None)
        if held is None:
            return []
        self.deferred.append(held)
        return [b for group in held.blocks for b in group]

    def free_popped(self, blocks) -> None:
        """Release the blocks one :meth:`pop_blocks_for_free` returned.

        vLLM frees them reversed, so the last group's tail goes first: kvnumba releases the
        sequences in reverse group order, each tail first.

        Raises
        ------
        ValueError
            If ``blocks`` are not exactly the blocks of one popped request.
        """
        ids = sorted(b.block_id for b in blocks if not b.is_null)
        for i, held in enumerate(self.deferred):
            mine = sorted(b.block_id for group in held.blocks for b in group if not b.is_null)
            if ids == mine:
                del self.deferred[i]
                self.kvnumba.release(held.ids[::-1].copy())
                return
        raise ValueError(
            "block_pool.free_blocks takes the blocks of one request that pop_blocks_for_free "
            "returned (kvnumba's pool offers no other free)"
        )

    # ------------------------------------------------------------------------- block access
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks per group (the empty ``KVCacheBlocks`` if it holds none)."""
        held = self.held.get(request_id)
        if held is None or not held.nblocks:
            return self.empty_kv_cache_blocks
        return held.view

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids, one list per group (0 for the null block)."""
        held = self.held.get(request_id)
        if held is None:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple(np.maximum(self._table[held.slots, : held.nblocks], 0).tolist())

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the first ``num_computed_tokens`` tokens, per group."""
        n = -(-num_computed_tokens // self.block_size)
        return tuple(ids[:n] for ids in self.get_block_ids(request_id))

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Deprecated in vLLM (cascade attention is gone): 0 for every group."""
        return [0] * self.num_kv_cache_groups

    def estimate_cached_tokens(self, request) -> int:
        """Tokens of the request's prefix covered by keyed blocks, the least over groups."""
        held = self.held.get(request.request_id)
        if held is None:
            return 0
        rows = self._table[held.slots, : held.nblocks]
        keyed = (rows >= 0) & (self._flags[np.maximum(rows, 0)] & BlockFlag.HASHED != 0)
        last = np.where(keyed.any(axis=1), held.nblocks - np.argmax(keyed[:, ::-1], axis=1), 0)
        return int(last.min()) * self.block_size

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        """``KVCacheBlocks(blocks)``, or the shared empty one when there are none."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int):
        """The first ``num_computed_tokens`` tokens' worth of a lookup result, per group."""
        assert num_computed_tokens % self.block_size == 0
        n = num_computed_tokens // self.block_size
        return self.create_kv_cache_blocks(tuple(list(group[:n]) for group in blocks.blocks))

    def check(self) -> None:
        """Verify kvnumba's invariants and the adapter's bookkeeping against them (O(pool)).

        Raises
        ------
        kvnumba.InvariantViolation
            From kvnumba's own ``check()``, or when a held request's sequences are not live,
            their lengths or block lists disagree with the table rows, or the blocks the
            requests hold are not the blocks kvnumba counts as used.
        """
        self.kvnumba.check()
        held_blocks = set()
        records = [*self.held.items(), *((f"(popped {i})", h) for i, h in enumerate(self.deferred))]
        bs = self.block_size
        for rid, held in records:
            rows = self._table[held.slots, : held.nblocks]
            problem = None
            lens = (
                self.kvnumba.seq_lens(held.ids)
                if all(self.kvnumba.is_live(int(s)) for s in held.ids)
                else None
            )
            if lens is None:
                problem = "a sequence is not live"
            elif (lens != held.nblocks * bs).any():
                problem = "kvnumba's lengths are not its blocks times the block size"
            elif not 0 <= held.ncached <= held.nblocks:
                problem = f"{held.ncached} keyed blocks of {held.nblocks}"
            else:
                for g, (row, blocks) in enumerate(zip(rows, held.blocks, strict=True)):
                    ids = np.maximum(row, 0).tolist()
                    if [b.block_id for b in blocks] != ids or any(
                        b is not self._blocks[b.block_id] for b in blocks
                    ):
                        problem = f"its block list of group {g} is not its table row"
                    elif held.nulls[g] != int(np.count_nonzero(row == kvnumba.NULL_BLOCK)):
                        problem = f"group {g}: {held.nulls[g]} null blocks recorded"
            if problem is not None:
                raise kvnumba.InvariantViolation(f"vLLM request {rid}: {problem}")
            held_blocks.update(rows[rows > 0].tolist())
        used = int(self._meta[Meta.USED])
        if len(held_blocks) != used:
            raise kvnumba.InvariantViolation(
                f"requests hold {len(held_blocks)} distinct blocks, kvnumba counts {used} used"
            )
