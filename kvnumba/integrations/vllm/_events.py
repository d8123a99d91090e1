"""kvnumba block events as vLLM KV cache events.

kvnumba records, per call, a row for every block it registers under a key (stored) and every
registered block it evicts or unregisters (removed), in the order they happened. vLLM publishes
``BlockStored`` (a run of consecutive blocks of one request, with their tokens, parent hash and
extra keys), ``BlockRemoved`` (one hash) and ``AllBlocksCleared``. A stored row is only ever
produced by a call made for one request, so the adapter translates right after that call, with
the request at hand; consecutive table positions become one ``BlockStored``.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.distributed.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)

from kvnumba.integrations.block_hashes import hash_from_key
from kvnumba.integrations.vllm import _compat

STORED = 1  # kvnumba's event kinds (take_events().kind)
REMOVED = 2


def block_stored(
    request,
    first: int,
    stop: int,
    block_size: int,
    kind: str,
    lookahead: int = 0,
    group: int = 0,
    positions: Sequence[int] | None = None,
) -> BlockStored:
    """``BlockStored`` for table positions ``first .. stop - 1`` of ``request`` in one group.

    Parameters
    ----------
    request : vllm.v1.request.Request
        The request whose blocks were registered.
    first, stop : int
        Block positions of the run in the request.
    block_size : int
        Tokens per block.
    kind : str
        ``KVCacheSpecKind`` value of the group, as vLLM annotates stored events.
    lookahead : int, default 0
        Tokens after each block that its hash covers (``num_hash_lookahead_tokens``).
    group : int, default 0
        The KV cache group (``group_idx``).
    positions : list of int, optional
        The positions of the run whose blocks were cached (default all): a sliding-window
        group leaves out its null blocks and, under sparse retention, the blocks no hit can
        reach. vLLM lists hashes and extra keys of those only, and the tokens of the whole run.

    Returns
    -------
    BlockStored
        The event as vLLM's block pool builds it for those blocks.
    """
    hashes = request.block_hashes
    extra, mm_idx = [], 0
    ahead: list[list[int]] = []  # the tokens each hash looks ahead at (only with lookahead)
    tokens = request.all_token_ids
    if positions is None:
        positions = range(first, stop)
    for pos in positions:
        start, end = pos * block_size, (pos + 1) * block_size
        if lookahead:
            keys, mm_idx = _compat.lookahead_extra_keys(
                request, start, end, end + lookahead, mm_idx
            )
            ahead.append(tokens[end : end + lookahead])
        else:
            keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
        extra.append(keys)
    lora = request.lora_request
    return BlockStored(
        block_hashes=[maybe_convert_block_hash(hashes[pos]) for pos in positions],
        parent_block_hash=maybe_convert_block_hash(hashes[first - 1]) if first > 0 else None,
        token_ids=request.all_token_ids[first * block_size : stop * block_size],
        block_size=block_size,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=to_event_extra_keys(extra),
        group_idx=group,
        kv_cache_spec_kind=kind,
        session_id=request.session_id,
        **_compat.stored_event_fields(ahead if lookahead else None),
    )


def translate(
    events, positions, request, block_size: int, width: int, kind: str, lookahead: int = 0
) -> list:
    """vLLM events for kvnumba's event rows, in order.

    Parameters
    ----------
    events : kvnumba BlockEvents
        ``kind``, ``block`` and ``key`` rows drained from the manager.
    positions : callable or None
        ``positions()`` maps block id to table position in ``request`` (built only if a stored
        row needs it); None when no request is at hand (then no stored row may appear).
    request : vllm.v1.request.Request or None
        The request the drained call was made for.
    block_size, width : int
        Tokens per block, digest length.
    kind : str
        ``KVCacheSpecKind`` value for stored events.
    lookahead : int, default 0
        ``num_hash_lookahead_tokens``.

    Returns
    -------
    list
        ``BlockStored`` / ``BlockRemoved`` events.
    """
    out: list = []
    where = None
    run_first = run_stop = -1
    for k, b, key in zip(events.kind.tolist(), events.block.tolist(), events.key, strict=True):
        if k == STORED:
            if where is None:
                if request is None:
                    raise RuntimeError("a block was registered outside a request's call")
                where = positions()
            pos = where[b]
            if pos == run_stop:
                run_stop += 1
                continue
            if run_first >= 0:
                out.append(block_stored(request, run_first, run_stop, block_size, kind, lookahead))
            run_first, run_stop = pos, pos + 1
        elif k == REMOVED:
            if run_first >= 0:
                out.append(block_stored(request, run_first, run_stop, block_size, kind, lookahead))
                run_first = run_stop = -1
            digest = hash_from_key(key, width)
            out.append(
                BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(digest)], medium=MEDIUM_GPU, group_idx=0
                )
            )
    if run_first >= 0:
        out.append(block_stored(request, run_first, run_stop, block_size, kind, lookahead))
    return out
