"""Cache maintenance of the vLLM adapter: prefix-cache stats, KV events, reset, eviction, check.

A mixin of :class:`~kvnumba.integrations.vllm.manager.KVNumbaKVCacheManager` (the calls vLLM
makes outside a request's allocation), kept apart from the allocation path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from vllm.distributed.kv_events import AllBlocksCleared, BlockStored
from vllm.logger import init_logger
from vllm.v1.metrics.stats import PrefixCacheStats

import kvnumba
from kvnumba.integrations.vllm import _events
from kvnumba.state import Meta

logger = init_logger(__name__)


class CacheMaintenance:
    """Stats, events, reset, eviction and the consistency check of the adapter.

    The state it reads, set by the adapter that inherits it (``KVNumbaKVCacheManager`` or
    ``KVNumbaGroupsKVCacheManager``), is declared below.
    """

    kvnumba: kvnumba.BlockManager
    block_size: int
    enable_caching: bool
    log_stats: bool
    prefix_cache_stats: PrefixCacheStats | None
    kv_cache_event_metadata: tuple
    hash_width: int
    held: dict
    deferred: Any  # one request's blocks by id, or a list for the groups adapter
    pending_events: list
    _events_on: bool
    _hash_lookahead: int
    _table: np.ndarray  # kvnumba's block tables (State.seq_table)
    _ref: np.ndarray  # its reference counts
    _meta: np.ndarray  # its counters
    _blocks: list  # vLLM's KVCacheBlock objects, by block id

    def flush_keys(self) -> None:
        """Register the keys of the blocks filled since the last call (the adapter's own)."""
        raise NotImplementedError

    def _drain(self, request, held) -> None:
        """Translate the events kvnumba recorded in the call just made for ``request``."""
        if not self.kvnumba.pending_events:
            return
        events = self.kvnumba.take_events()
        if events.kind.shape[0] == 0:
            return

        def positions() -> dict[int, int]:
            row = self._table[held.slot, : held.nblocks].tolist()
            return {b: i for i, b in enumerate(row)}

        self.pending_events += _events.translate(
            events,
            positions if held is not None else None,
            request,
            self.block_size,
            self.hash_width,
            self.kv_cache_event_metadata[0][0],
            self._hash_lookahead,
        )

    # -------------------------------------------------------------------------- prefix stats
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take (and reset) the prefix cache stats; None unless ``log_stats``."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request) -> bool:
        """Whether ``request`` may read the prefix cache."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits: int) -> None:
        """Count one admitted request's lookup: its tokens as queries, ``num_hits`` as hits."""
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None  # made with log_stats
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    # ------------------------------------------------------------------ cache maintenance
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM does: only when no request holds a block.

        Returns
        -------
        bool
            False (and nothing changes) while requests hold blocks.
        """
        self.flush_keys()
        used = int(self._meta[Meta.USED])
        if used:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet", used
            )
            return False
        self.kvnumba.reset_prefix_cache()
        if self._events_on:
            # vLLM reports one AllBlocksCleared, not a removal per block.
            self.kvnumba.take_events()
            self.pending_events.append(AllBlocksCleared())
        if self.prefix_cache_stats is not None:  # log_stats
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids) -> None:
        """Evict the given blocks from the prefix cache (``kvnumba.evict``).

        Cached blocks (refcount 0) are evicted and freed. kvnumba cannot yet drop the key of a
        block a request still holds (vLLM can); such blocks are skipped with a warning.
        """
        ids = np.fromiter(block_ids, dtype=np.int64)
        if ids.shape[0] == 0:
            return
        self.flush_keys()
        if ids.min() < 0 or ids.max() >= self.kvnumba.num_blocks:
            raise AssertionError(f"Invalid block_id in {sorted(ids.tolist())}")
        held = ids[self._ref[ids] > 0]
        if held.shape[0]:
            logger.warning(
                "kvnumba cannot unregister blocks requests hold: %s", sorted(held.tolist())
            )
        self.kvnumba.evict(ids[self._ref[ids] == 0])
        if self._events_on:
            self._drain(None, None)

    def take_events(self) -> list:
        """Take the KV events translated since the last call (empty unless enabled)."""
        if not self._events_on:
            return []
        self.flush_keys()
        self._drain(None, None)
        events, self.pending_events = self.pending_events, []
        # Events queued by others (vLLM's connectors append to the pool's queue) get the
        # group's spec metadata here, as vLLM's take_events annotates them.
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(self.kv_cache_event_metadata):
                logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = (
                self.kv_cache_event_metadata[event.group_idx]
            )
        return events

    def check(self) -> None:
        """Verify kvnumba's invariants and the adapter's bookkeeping against them (O(pool)).

        Raises
        ------
        kvnumba.InvariantViolation
            From kvnumba's own ``check()``, or when a held request's sequence is not live, its
            table row, length or key count disagree with the adapter's record, its block list
            (what ``get_blocks`` returns) is not its table row, or the blocks the requests hold
            are not the blocks kvnumba counts as used.
        """
        self.flush_keys()
        self.kvnumba.check()
        held_blocks = set()
        popped = {f"(popped, sequence {q})": h for q, h in self.deferred.items()}
        for rid, held in (*self.held.items(), *popped.items()):
            row = self._table[held.slot]
            problem = None
            if not self.kvnumba.is_live(held.seq):
                problem = "its sequence is not live"
            elif int(self.kvnumba.seq_lens(held.ids)[0]) != held.nblocks * self.block_size:
                problem = "kvnumba's length is not its blocks times the block size"
            elif int(np.count_nonzero(row >= 0)) != held.nblocks:
                problem = f"its table row holds {int(np.count_nonzero(row >= 0))} blocks"
            elif not 0 <= held.ncached <= held.nblocks:
                problem = f"{held.ncached} keyed blocks of {held.nblocks}"
            elif [b.block_id for b in held.blocks] != row[: held.nblocks].tolist() or any(
                b is not self._blocks[b.block_id] for b in held.blocks
            ):
                problem = "its block list is not its table row"
            if problem is not None:
                raise kvnumba.InvariantViolation(f"vLLM request {rid}: {problem}")
            held_blocks.update(row[: held.nblocks].tolist())
        used = int(self._meta[Meta.USED])
        if len(held_blocks) != used or 0 in held_blocks:
            raise kvnumba.InvariantViolation(
                f"requests hold {len(held_blocks)} distinct blocks, kvnumba counts {used} used"
            )
