"""What the parts of the reference model share, declared in one place.

:class:`~kvnumba.reference.ReferenceBlockManager` is composed of parts (``BlocksMixin``,
``CallsMixin``, ``KeysMixin``, ...), each a class of methods over one model state that
``ReferenceBlockManager.__init__`` sets. :class:`ModelState` declares that state and the methods
one part calls on another, so that a reader (and the type checker) finds each one's type and
owner here. It adds no behaviour: every part derives from it, and nothing else does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvnumba.reference.pool import ReferencePagePool

#: A method of one part that another calls (defined in the part named beside it).
Method = Callable[..., Any]


class ModelState:
    """The state of one reference model and the methods its parts call on each other."""

    # Geometry and switches (fixed at construction).
    _num_blocks: int
    _block_size: int
    _max_seqs: int
    _max_seq_len: int
    _reserved: int
    _prefix_caching: bool
    _block_keys: bool
    _block_events: bool
    _cache_duplicates: bool
    _explicit_release: bool
    _windowed: bool
    _groups: list[tuple[int, int]]  # (sliding window, attention chunk) per KV cache group
    _on_evict: Callable[..., Any] | None
    # Blocks.
    _ref: list[int]
    _tokens: list[list[int]]
    _key: list[tuple | None]
    _hash: list[int | None]
    _prefix: dict[tuple, int]
    _twins: dict[tuple, tuple[int, ...]]
    _lru: OrderedDict[int, None]
    _policy: Any  # kvnumba.reference.eviction: LruPolicy or one of its subclasses
    _free: list[int]
    _unknown: set[int]
    _trimmed: set[int]
    # Pages (a page pool only).
    _pool: ReferencePagePool | None
    _k: int
    _unmapped: list[int]
    _phys: list[int]
    _page_free: list[list[int]]
    _buckets: list[list[int]]
    _cache_only: OrderedDict[int, int]
    # Sequences.
    _live: list[bool]
    _table: list[list[int]]
    _len: list[int]
    _salt: list[int]
    _seq_tag: list[int]
    _anchor: list[int | None]
    _slots: list[int]
    # Counters and the current call's records.
    _counters: dict[str, int]
    _failed_calls: int
    _events: list[tuple[int, int, tuple]]
    _evicted: list[tuple[int, int | None, list[int]]]  # (block, hash, tokens)
    _unmapped_log: list[tuple[int, int]]
    _mapped_log: list[tuple[int, int]]

    # Methods of ReferenceBlockManager itself.
    _check_slots_free: Method
    _kind: Method
    _resolve: Method
    _resolve_all: Method
    _seq_id: Method
    _take_slot: Method
    block_tables: Method
    seq_lens: Method
    # BlocksMixin.
    _available: Method
    _cache: Method
    _drop_ref: Method
    _evict: Method
    _evict_to_free: Method
    _is_registered: Method
    _register: Method
    _registered_count: Method
    _scrub: Method
    _take_block: Method
    _uncache: Method
    _unregister: Method
    # CallsMixin.
    _begin_call: Method
    _commit_call: Method
    _drop_window: Method
    _window_drops: Method
    admit: Method
    append: Method
    # EngineMixin.
    _leading_nulls: Method
    _reclaim_tail: Method
    # KeysMixin.
    _check_keys: Method
    _event: Method
    _group_prompts: Method
    _hit_limit: Method
    _hits: Method
    _parse_prompts: Method
    _prompt_hits: Method
    _register_keys: Method
    lookup: Method
    set_keys: Method
    # PagesMixin.
    _ask_siblings: Method
    _cache_only_pages_of_siblings: Method
    _check_pages: Method
    _drop_last_paged: Method
    _enter_bucket: Method
    _leave_bucket: Method
    _page_blocks: Method
    _take_paged: Method
    _the_pool: Method
    _unmap_page: Method
    # PrefixMixin.
    _chain_prefix: Method
    _lookup_prefix: Method
    _register_if_full: Method
