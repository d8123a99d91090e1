"""``KVNumbaKVCacheManager``: the ``KVCacheManager`` interface of vLLM 0.32.x-0.33.x over kvnumba.

One vLLM request is one kvnumba sequence, created by ``admit`` on the request's first
``allocate_slots`` and released by ``free``. The sequence holds ``ceil(slots / block_size)``
whole blocks, where ``slots`` is the most token slots vLLM has asked for (computed + new +
lookahead tokens, capped at ``max_model_len``): vLLM's block count, which only grows while a
request runs. Its kvnumba length is that many blocks times the block size, so a decode step
whose tail block has room makes no kvnumba call at all. vLLM's block hashes (the request's
``block_hashes``) are kvnumba's block keys: the leading keys of a new request find its prefix
hits, and the keys of the blocks that become full and final are registered with ``admit`` /
``set_keys``. Block 0 is reserved: vLLM's null block. ``docs/vllm.md`` has the full mapping.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import RequestStatus

import kvnumba
from kvnumba.eviction import policy_code
from kvnumba.integrations.block_hashes import KEY_BYTES, keys_from_hashes, keys_from_runs
from kvnumba.integrations.vllm import _events
from kvnumba.integrations.vllm._maintenance import CacheMaintenance
from kvnumba.integrations.vllm._unserved import UnservedFeatureSteps
from kvnumba.integrations.vllm._views import BlockPoolView, CoordinatorView
from kvnumba.integrations.vllm.precompile import load_engine_kernels
from kvnumba.integrations.vllm.support import manager_fallback_reason, uses_groups_manager
from kvnumba.kernels import ENGINE_POLICY, compile_all
from kvnumba.state import BlockFlag, Meta, slot_mask

#: Names kvnumba's eviction policy when the scheduler builds the manager (vLLM's constructor
#: call has no place for it).
EVICTION_ENV = "KVNUMBA_EVICTION"

logger = init_logger(__name__)

_NO_KEYS = np.zeros((0, 4), dtype=np.uint64)
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
# Keys a lookup converts and looks at first: most lookups miss within them, and only a lookup
# whose every one hits needs the rest.
_FIRST_KEYS = 16


class _Held:
    """A request's kvnumba sequence: id (also as a one-item array, the form kvnumba's calls
    take without conversion), table row, blocks held, leading blocks with keys, and the block
    stand-ins of its table row.

    ``blocks`` is the request's block list as vLLM's ``req_to_blocks`` keeps it: one list,
    extended in place as the request grows, and ``view`` the ``KVCacheBlocks`` around it, so
    that ``get_blocks`` builds nothing. A held request's row only grows at its tail (the
    sequence never shrinks, and a reset or eviction never touches a held block), so the list
    stays the row; ``check()`` compares them.
    """

    __slots__ = ("seq", "ids", "slot", "nblocks", "ncached", "blocks", "view")

    def __init__(self, seq: int, slot: int, nblocks: int, ncached: int, blocks: list) -> None:
        self.seq = seq
        self.ids = np.array([seq], dtype=np.int64)
        self.slot = slot
        self.nblocks = nblocks
        self.ncached = ncached
        self.blocks = blocks
        self.view = KVCacheBlocks((blocks,))


class _RequestKeys:
    """The keys of a request's block hashes, each hash converted once.

    A waiting request is looked up again on every step it stays blocked, and admitted with the
    same leading keys: both take rows of this array, and only hashes not seen before are
    converted. vLLM only appends to ``request.block_hashes``, except for streaming sessions,
    whose list it clears or cuts and regrows: the last hash converted is kept and compared by
    identity, so a list cut below it, or rebuilt, is converted afresh.
    """

    __slots__ = ("request", "rows", "n", "last")

    def __init__(self, request) -> None:
        self.request = request
        self.rows = _NO_KEYS
        self.n = 0
        self.last = None

    def upto(self, hashes, stop: int) -> np.ndarray:
        """Keys of ``hashes[:stop]`` (``stop <= len(hashes)``), converting the new ones."""
        n = self.n
        if n and (len(hashes) < n or hashes[n - 1] is not self.last):
            n = self.n = 0  # cut or rebuilt: start again, in a new array
            self.rows = _NO_KEYS
        if stop > n:
            new = keys_from_hashes(hashes, n, stop)
            rows = self.rows
            if n == 0:
                rows = new  # the conversion itself (read-only for 32-byte digests)
            elif stop <= rows.shape[0] and rows.flags.writeable:
                rows[n:stop] = new
            else:
                rows = np.empty((max(stop, 2 * rows.shape[0]), 4), dtype=np.uint64)
                rows[:n] = self.rows[:n]
                rows[n:stop] = new
            self.rows = rows
            self.n = stop
            self.last = hashes[stop - 1]
        return self.rows[:stop]


class KVNumbaKVCacheManager(CacheMaintenance, UnservedFeatureSteps):
    """vLLM's ``KVCacheManager`` for one full-attention group, backed by kvnumba.

    The constructor takes ``KVCacheManager``'s arguments; a configuration kvnumba does not
    serve (:func:`~kvnumba.integrations.vllm.support.manager_fallback_reason`) raises
    ``ValueError`` (``KVNumbaScheduler`` checks first and keeps vLLM's manager instead).

    Parameters
    ----------
    kv_cache_config : vllm.v1.kv_cache_interface.KVCacheConfig
        One full-attention group; ``num_blocks`` blocks including the null block.
    max_model_len, scheduler_block_size, hash_block_size, max_in_flight_tokens, enable_caching,
    use_eagle, num_hash_lookahead_tokens, num_prefill_lookahead, log_stats,
    enable_kv_cache_events, dcp_world_size, pcp_world_size, metrics_collector, watermark,
    enable_mamba_shared_prefix_checkpoint
        As for vLLM's ``KVCacheManager``.
    max_seqs : int, optional
        Requests that may hold blocks at once (kvnumba's block tables are
        ``max_seqs x ceil(max_model_len / block_size)``); default ``min(num_blocks - 1, 1024)``.
        A new request beyond it gets no slots (``allocate_slots`` returns None) until one ends.
    eviction : str, optional
        kvnumba's eviction policy (``kvnumba.EVICTION_POLICIES``); default the environment
        variable ``KVNUMBA_EVICTION``, else ``"lru"`` (vLLM's own order). Another policy's
        kernels are compiled (or loaded) here, not while serving.

    Notes
    -----
    Single-threaded, as vLLM's scheduler is.
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
        )
        if reason is not None:
            raise ValueError(f"kvnumba's vLLM manager does not serve this model: {reason}")
        if uses_groups_manager(kv_cache_config):
            raise ValueError(
                "KVNumbaKVCacheManager serves one full-attention group; "
                "KVNumbaGroupsKVCacheManager serves windowed and several groups"
            )
        if watermark < 0.0:
            raise ValueError("watermark must be non-negative")
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        num_blocks = kv_cache_config.num_blocks
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.block_size = spec.block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = None
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.num_kv_cache_groups = 1
        self.retained_hit_group_ids = ()
        self.mamba_shared_prefix_checkpoint = False
        self.watermark_blocks = int(watermark * num_blocks)
        self.kv_cache_event_metadata = ((get_kv_cache_spec_kind(spec).value, None),)
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        self._hash_lookahead = num_hash_lookahead_tokens
        # Multi-module MTP re-prefills the last num_prefill_lookahead - 1 computed tokens, so
        # their KV is not final and their blocks are not cached yet (vLLM's coordinator).
        self._reprefill = max(0, num_prefill_lookahead - 1)
        eagle = use_eagle or kv_cache_config.kv_cache_groups[0].is_eagle_group
        if enable_caching and eagle and self.block_size < num_prefill_lookahead:
            raise ValueError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size"
                f" (={self.block_size}) >= num_speculative_tokens (={num_prefill_lookahead})."
            )
        if max_seqs is None:
            max_seqs = min(num_blocks - 1, 1024)
        if eviction is None:
            eviction = os.environ.get(EVICTION_ENV) or "lru"
        # Compiled or loaded now, not at the first step (see precompile).
        load_engine_kernels(logger)
        if eviction != "lru":
            policy_code(eviction)  # a bad name fails here, before any compile
            logger.info("kvnumba: eviction policy %s (loading its kernels)", eviction)
            compile_all(ENGINE_POLICY, policy=True)
        self.kvnumba = kvnumba.BlockManager(
            num_blocks,
            self.block_size,
            max_seqs=max(1, max_seqs),
            # Sequences hold whole blocks (see _admit): round the cap up to a block.
            max_seq_len=-(-max_model_len // self.block_size) * self.block_size,
            prefix_caching=enable_caching,
            reserved_blocks=1,
            block_keys=True,
            block_events=enable_kv_cache_events and enable_caching,
            eviction=eviction,
            # vLLM caches a block computed again beside the cached one of its hash.
            cache_duplicates=True,
        )
        state = self.kvnumba.state
        self._table = state.seq_table
        self._ref = state.ref
        self._meta = state.meta
        self._flags = state.block_flags
        self._slot_mask = slot_mask(self.kvnumba.max_seqs)
        self._usable = num_blocks - 1
        self.held: dict[str, _Held] = {}
        # Requests whose blocks pop_blocks_for_free handed out, by sequence id, until
        # block_pool.free_blocks returns them.
        self.deferred: dict[int, _Held] = {}
        self.hash_width = KEY_BYTES
        self.pending_events: list = []
        self._events_on = enable_kv_cache_events and enable_caching
        # The last lookup's hit ids, so that allocate_slots counts the hits at refcount 0
        # without reading them back from the block objects.
        self._last_hits: tuple[str, np.ndarray] | None = None
        # Keys of running requests' newly full blocks, registered in one call (flush_keys),
        # and their digests, which a lookup checks its first miss against.
        self._pending: dict[int, tuple[_Held, Any, int]] = {}  # (held, request, full)
        self._pending_digests: set[bytes] = set()
        # One-request argument arrays for set_keys, reused: kvnumba passes int64 arrays through.
        self._key_args = np.zeros((2, 1), dtype=np.int64)  # starts, counts
        # Keys of the requests looked up and not admitted yet (see _RequestKeys); dropped at
        # admission and free, and all at once past a bound (requests dropped unfreed).
        self._lookup_keys: dict[str, _RequestKeys] = {}
        self._lookup_keys_cap = 2 * self.kvnumba.max_seqs
        self.block_pool = BlockPoolView(self)
        self._blocks = self.block_pool.blocks
        # The stand-ins as an object array: a row of block ids becomes their list in one
        # numpy take, with no Python work per block.
        self._block_arr = np.empty(len(self._blocks), dtype=object)
        self._block_arr[:] = self._blocks
        self.coordinator = CoordinatorView(self, spec)

    # ------------------------------------------------------------------------------ helpers
    def _keys(self, hashes, start: int, stop: int) -> np.ndarray:
        """Keys of ``hashes[start:stop]``; learns the digest length from the first hash."""
        if stop <= start:
            return _NO_KEYS
        self.hash_width = len(hashes[start])
        return keys_from_hashes(hashes, start, stop)

    def _request_keys(self, request) -> _RequestKeys:
        """The key cache of a request not yet admitted (made on its first lookup)."""
        rk = self._lookup_keys.get(request.request_id)
        if rk is None or rk.request is not request:
            if len(self._lookup_keys) >= self._lookup_keys_cap:
                self._lookup_keys.clear()
            rk = self._lookup_keys[request.request_id] = _RequestKeys(request)
        return rk

    def _wrap(self, block_ids: np.ndarray) -> KVCacheBlocks:
        """``KVCacheBlocks`` of the stand-ins of ``block_ids`` (the empty one if none)."""
        if block_ids.shape[0] == 0:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks((self._block_arr[block_ids].tolist(),))

    def blocks_of(self, request_id: str, group: int = 0) -> list:
        """Block stand-ins of a held request: its block list (``req_to_blocks``; one group)."""
        return self.held[request_id].blocks

    def _num_free(self) -> int:
        return self._usable - int(self._meta[Meta.USED])

    # ------------------------------------------------------------------------- properties
    @property
    def usage(self) -> float:
        """Fraction of the usable blocks that requests reference."""
        return self.block_pool.get_usage()

    # ------------------------------------------------------------------------- the hot path
    def get_computed_blocks(
        self, request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The longest cached prefix of ``request``: kvnumba ``lookup`` (claims nothing).

        Parameters
        ----------
        request : vllm.v1.request.Request
            A request not yet holding blocks.
        max_cache_hit_length : int, optional
            Hit tokens at most; ``request.num_tokens - 1`` by default.

        Returns
        -------
        tuple
            ``(KVCacheBlocks of the hit blocks, hit tokens, 0)`` (no shared-prefix boundary:
            one group).
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        hashes = request.block_hashes
        n = min(max_cache_hit_length // self.block_size, len(hashes))
        if n <= 0:
            return self.empty_kv_cache_blocks, 0, 0
        self.hash_width = len(hashes[0])
        rk = self._request_keys(request)
        # A hit ends at the first block missed, so the first keys decide most lookups.
        k = n if n <= _FIRST_KEYS or rk.n >= n else _FIRST_KEYS
        while True:
            # Length k blocks + 1 token: kvnumba's last-token rule then allows k hits.
            found = self.kvnumba.lookup_one(length=k * self.block_size + 1, keys=rk.upto(hashes, k))
            hits = found.shape[0]
            # Keys queued by running requests (flush_keys) can only lengthen the hit if the
            # first missed block's hash is one of them; only then are they registered first.
            if hits < k and hashes[hits] in self._pending_digests:
                self.flush_keys()  # empties the queue: this is done at most once
                continue
            if hits < k or k == n:
                break
            k = n
        if self.use_eagle and hits:
            hits -= 1  # EAGLE recomputes the last hit block for its hidden states
        if hits == 0:
            return self.empty_kv_cache_blocks, 0, 0
        ids = found[:hits]
        self._last_hits = (request.request_id, ids)
        if self._events_on and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            kind = self.kv_cache_event_metadata[0][0]
            self.pending_events.append(
                _events.block_stored(request, 0, hits, self.block_size, kind, self._hash_lookahead)
            )
        return self._wrap(ids), hits * self.block_size, 0

    def get_computed_blocks_for_connector(
        self, request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """:meth:`get_computed_blocks` plus ``hit_diverged`` (always False: one group)."""
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks) -> int:
        """Blocks vLLM counts against the free pool to give a request ``num_tokens`` slots.

        A held request needs the blocks it lacks; a new one needs the blocks past its hits
        plus every hit at refcount 0 (a cached block it takes off the free pool).
        """
        needed = -(-num_tokens // self.block_size)
        held = self.held.get(request_id)
        if held is not None:
            return max(needed - held.nblocks, 0)
        num_hits = len(new_computed_blocks)
        if num_hits == 0:
            return needed
        last = self._last_hits
        if last is not None and last[0] == request_id and last[1].shape[0] == num_hits:
            ids = last[1]
        else:
            ids = np.array([b.block_id for b in new_computed_blocks], dtype=np.int64)
        return max(needed - num_hits, 0) + int(np.count_nonzero(self._ref[ids] == 0))

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

        A new request is admitted (``admit`` claims its hits, allocates the rest and registers
        the keys of its full blocks); a held one grows (``append``, only when it needs another
        block) and registers the keys of blocks that became full (``set_keys``). Only tokens
        up to ``request.num_tokens`` are cached (draft tokens are not final). Arguments as
        vLLM's ``allocate_slots``; external tokens, delayed caching and encoder tokens (KV
        connectors, encoder-decoder models) are not served.

        Returns
        -------
        KVCacheBlocks or None
            The newly allocated blocks (hits excluded), or None when they do not fit.
        """
        held = self.held.get(request.request_id)
        if (
            held is not None
            and num_new_tokens
            and not (
                num_new_computed_tokens
                or num_external_computed_tokens
                or delay_cache_blocks
                or num_encoder_tokens
                or full_sequence_must_fit
                or (new_computed_blocks is not None and new_computed_blocks.blocks[0])
            )
        ):
            # A running request: the scheduler's call for every request on every step.
            return self._grow(
                held,
                request,
                request.num_computed_tokens,
                num_new_tokens,
                num_lookahead_tokens,
                reserved_blocks,
                has_scheduled_reqs,
            )
        return self._allocate(
            held,
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
        )

    def _allocate(
        self,
        held: _Held | None,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
        num_encoder_tokens: int,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
    ) -> KVCacheBlocks | None:
        """``allocate_slots`` for a new request, or with any of the rarer arguments."""
        self.flush_keys()
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
        hit_blocks = () if new_computed_blocks is None else new_computed_blocks.blocks[0]
        computed = request.num_computed_tokens + num_new_computed_tokens
        if computed > self.max_model_len:
            computed = self.max_model_len
        rid = request.request_id
        if held is not None and hit_blocks:
            raise ValueError(f"request {rid} already holds blocks; it takes no prefix hits")
        watermark = 0
        if self.watermark_blocks and has_scheduled_reqs and request.status in _ADMITTING:
            watermark = self.watermark_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self.num_blocks_to_allocate(rid, full, hit_blocks) + watermark > self._num_free():
                return None
        slots = computed + num_new_tokens + num_lookahead_tokens
        if slots > self.max_model_len:
            slots = self.max_model_len
        to_cache = computed + num_new_tokens
        if to_cache > request.num_tokens:
            to_cache = request.num_tokens
        to_cache -= self._reprefill
        if held is None:
            needed = self.num_blocks_to_allocate(rid, slots, hit_blocks)
            if needed + watermark > self._num_free() - reserved_blocks:
                return None
            return self._admit(request, slots, len(hit_blocks), to_cache)
        return self._grow(
            held,
            request,
            computed,
            num_new_tokens,
            num_lookahead_tokens,
            reserved_blocks,
            has_scheduled_reqs,
        )

    def _grow(
        self,
        held: _Held,
        request,
        computed: int,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
    ) -> KVCacheBlocks | None:
        """A held request's new slots: usually its tail block has room, and then no kvnumba
        call is made at all (vLLM's manager allocates nothing either)."""
        bs = self.block_size
        if computed > self.max_model_len:
            computed = self.max_model_len
        slots = computed + num_new_tokens + num_lookahead_tokens
        if slots > self.max_model_len:
            slots = self.max_model_len
        nblocks = -(-slots // bs)
        needed = nblocks - held.nblocks  # < 0 after rejected drafts: vLLM keeps their blocks
        watermark = 0
        if self.watermark_blocks and has_scheduled_reqs and request.status in _ADMITTING:
            watermark = self.watermark_blocks
        if (needed > 0 or watermark or reserved_blocks) and max(
            needed, 0
        ) + watermark > self._usable - int(self._meta[Meta.USED]) - reserved_blocks:
            return None
        old = held.nblocks
        if needed > 0:
            self.kvnumba.append_one(held.seq, needed * bs)
            held.nblocks = nblocks
        if self.enable_caching:
            to_cache = computed + num_new_tokens
            num_tokens = request.num_tokens
            if to_cache > num_tokens:
                to_cache = num_tokens
            to_cache -= self._reprefill
            if to_cache >= (held.ncached + 1) * bs:
                if self._events_on:  # registered now: its events keep their order
                    self._cache_upto(held, request, to_cache)
                    self._drain(request, held)
                else:
                    self._defer_keys(held, request, to_cache)
        if held.nblocks == old:
            return self.empty_kv_cache_blocks
        if self._events_on:
            self._drain(request, held)  # evictions by the append
        new = self._block_arr[self._table[held.slot, old : held.nblocks]].tolist()
        held.blocks += new  # in place: the list get_blocks handed out grows, as vLLM's does
        return KVCacheBlocks((new,))

    def _admit(self, request, slots: int, num_hits: int, to_cache: int) -> KVCacheBlocks | None:
        """First allocation of a request: one kvnumba ``admit`` of its blocks.

        The kvnumba sequence holds whole blocks (``ceil(slots / block_size)`` of them): its
        length is a block multiple, so that later steps call kvnumba only when they need
        another block.
        """
        bs = self.block_size
        hashes = request.block_hashes
        nblocks = -(-slots // bs)
        num_keys = 0
        if self.enable_caching:
            num_keys = max(min(to_cache, len(hashes) * bs) // bs, num_hits)
        rk = self._lookup_keys.get(request.request_id)
        if rk is not None and rk.request is request and num_keys <= len(hashes):
            keys = rk.upto(hashes, num_keys)
        else:
            keys = self._keys(hashes, 0, num_keys)
        try:
            seq, cached = self.kvnumba.admit_one(
                None, length=nblocks * bs, keys=keys, max_hit_blocks=num_hits
            )
        except (kvnumba.PoolExhausted, kvnumba.TooManySequences):
            return None
        self._lookup_keys.pop(request.request_id, None)
        if cached != num_hits * bs:
            self.kvnumba.release([seq])
            raise RuntimeError(
                f"request {request.request_id}: {num_hits} prefix-hit blocks were passed to "
                f"allocate_slots but only {cached // bs} are still cached (get_computed_blocks "
                "and allocate_slots must not be separated by calls that evict)"
            )
        slot = seq & self._slot_mask
        blocks = self._block_arr[self._table[slot, :nblocks]].tolist()
        held = _Held(seq, slot, nblocks, num_keys, blocks)
        self.held[request.request_id] = held
        self._last_hits = None
        if self._events_on:
            self._drain(request, held)
        if nblocks == num_hits:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks((blocks[num_hits:],))

    def _cache_upto(self, held: _Held, request, num_tokens: int) -> None:
        """Register the keys of the request's blocks full within its first ``num_tokens``."""
        hashes = request.block_hashes
        full = min(num_tokens, len(hashes) * self.block_size) // self.block_size
        if full > held.nblocks:
            full = held.nblocks
        if full > held.ncached:
            self._set_keys_one(held, hashes, full)

    def _set_keys_one(self, held: _Held, hashes, full: int) -> None:
        """Register the keys of the request's blocks ``held.ncached`` to ``full - 1``."""
        arg = self._key_args
        arg[0, 0], arg[1, 0] = held.ncached, full - held.ncached
        self.kvnumba.set_keys(held.ids, arg[0], arg[1], self._keys(hashes, held.ncached, full))
        held.ncached = full

    def _defer_keys(self, held: _Held, request, num_tokens: int) -> None:
        """Queue the keys of the blocks full within ``num_tokens`` for :meth:`flush_keys`."""
        full = min(num_tokens, len(request.block_hashes) * self.block_size) // self.block_size
        if full > held.nblocks:
            full = held.nblocks
        queued = self._pending.get(held.seq)
        start = held.ncached if queued is None else queued[2]
        if full > start:
            self._pending_digests.update(request.block_hashes[start:full])
            self._pending[held.seq] = (held, request, full)

    def flush_keys(self) -> None:
        """Register the keys queued by running requests: one ``set_keys`` call.

        A decode step fills a block for about one request in ``block_size``; their keys are
        registered together (one kvnumba call instead of one per request) before anything can
        read them: every admission, reset, eviction, event drain, check or view flushes first; a
        lookup does when the first block it misses has a queued key (otherwise the queued keys
        cannot change its result); a free or an estimate of cached tokens does when the request
        has queued keys itself. The blocks are held by their requests meanwhile, so no
        allocation can evict them or see them cached.
        """
        pending = self._pending
        if not pending:
            return
        if len(pending) == 1:
            for held, request, full in pending.values():
                self._set_keys_one(held, request.block_hashes, full)
            pending.clear()
            self._pending_digests.clear()
            return
        items = list(pending.values())
        # ids, starts and counts as three contiguous rows of one array.
        args = np.array([(h.seq, h.ncached, f - h.ncached) for h, _, f in items], dtype=np.int64)
        args = args.T.copy()
        keys = keys_from_runs([(r.block_hashes, h.ncached, f) for h, r, f in items])
        self.kvnumba.set_keys(args[0], args[1], args[2], keys)
        for h, _, f in items:
            h.ncached = f
        pending.clear()
        self._pending_digests.clear()

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        """Register the keys of the blocks full within ``num_computed_tokens`` (``set_keys``)."""
        held = self.held.get(request.request_id)
        if not self.enable_caching or held is None:
            return
        self.flush_keys()
        self._cache_upto(held, request, num_computed_tokens - self._reprefill)
        if self._events_on:
            self._drain(request, held)

    def _forget(self, request) -> _Held | None:
        """Drop ``request``'s records; its sequence, if it holds one, with its keys registered."""
        self._lookup_keys.pop(request.request_id, None)
        held = self.held.pop(request.request_id, None)
        # Its own queued keys first, so that its full blocks stay cached once released; the
        # other requests' keys can wait (their blocks are held).
        if held is not None and held.seq in self._pending:
            self.flush_keys()
        return held

    def free(self, request) -> None:
        """Release the request's sequence (tail block first; keyed blocks stay cached)."""
        held = self._forget(request)
        if held is not None:
            self.kvnumba.release(held.ids)

    def pop_blocks_for_free(self, request) -> list:
        """Drop ``request``'s bookkeeping but keep its blocks: vLLM's deferred free.

        The scheduler defers a free while a step in flight may still write the blocks, and
        returns them later with ``block_pool.free_blocks`` (:meth:`free_popped`). Until then
        the blocks stay held (kvnumba's sequence stays live), as in vLLM's pool.

        Parameters
        ----------
        request : vllm.v1.request.Request
            A request that may hold blocks.

        Returns
        -------
        list
            The request's blocks in allocation order (empty if it holds none).
        """
        held = self._forget(request)
        if held is None:
            return []
        if not held.blocks:
            self.kvnumba.release(held.ids)
            return []
        self.deferred[held.seq] = held
        return list(held.blocks)

    def free_popped(self, blocks) -> None:
        """Release the blocks one :meth:`pop_blocks_for_free` returned (in any order).

        Parameters
        ----------
        blocks : iterable of block stand-ins
            Exactly the blocks of one popped request.

        Raises
        ------
        ValueError
            If ``blocks`` are not exactly the blocks of one popped request.
        """
        ids = sorted(b.block_id for b in blocks)
        # Few requests wait at once (those of the steps in flight): a scan finds the one.
        for seq, held in self.deferred.items():
            if ids == sorted(b.block_id for b in held.blocks):
                del self.deferred[seq]
                self.kvnumba.release(held.ids)
                return
        raise ValueError(
            "block_pool.free_blocks takes the blocks of one request that pop_blocks_for_free "
            "returned (kvnumba's pool offers no other free)"
        )

    # ------------------------------------------------------------------------- block access
    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks (the empty ``KVCacheBlocks`` if it holds none)."""
        held = self.held.get(request_id)
        if held is None or not held.blocks:
            return self.empty_kv_cache_blocks
        view = held.view
        if view.blocks[0] is not held.blocks:  # someone replaced the returned object's list
            view = held.view = KVCacheBlocks((held.blocks,))
        return view

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids, one list (one group)."""
        held = self.held.get(request_id)
        if held is None:
            return ([],)
        return (self._table[held.slot, : held.nblocks].tolist(),)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the first ``num_computed_tokens`` tokens."""
        (ids,) = self.get_block_ids(request_id)
        return (ids[: -(-num_computed_tokens // self.block_size)],)

    def estimate_cached_tokens(self, request) -> int:
        """Tokens of the request's prefix covered by keyed blocks."""
        held = self.held.get(request.request_id)
        if held is None:
            return 0
        if held.seq in self._pending:  # its own queued keys only: they are its blocks' flags
            self.flush_keys()
        row = self._table[held.slot, : held.nblocks]
        keyed = np.flatnonzero(self._flags[row] & BlockFlag.HASHED)
        return int(keyed[-1] + 1) * self.block_size if keyed.shape[0] else 0

    def create_kv_cache_blocks(self, blocks) -> KVCacheBlocks:
        """``KVCacheBlocks(blocks)``, or the shared empty one when there are none."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int):
        """The first ``num_computed_tokens`` tokens' worth of a lookup result (a slice)."""
        assert num_computed_tokens % self.block_size == 0
        return self.create_kv_cache_blocks(
            (list(blocks.blocks[0][: num_computed_tokens // self.block_size]),)
        )
