"""Unit tests of the private kernel helpers, one concern at a time, against small Python models.

The public-API tests (``test_semantics``, ``test_stateful``...) drive whole calls; a bug in a
helper there shows up as a wrong block table several layers away, or not at all when another
helper happens to compensate. Here each helper is driven directly, in the spirit of stumpy's
tests of its private kernels:

- the prefix table (:mod:`kvnumba._kernels.prefix`): insert, find with token verification,
  eviction marks and their backward-shift purge, plus the chained hash itself;
- the intrusive list helper (:mod:`kvnumba._kernels.links`), with and without a tail, and its
  "dancing links" property;
- the undo log (:mod:`kvnumba._kernels.undo`) and :func:`rollback`, for every logged field;
- the page buckets (:mod:`kvnumba._kernels.virtual_pages`): which block ``take_from_pages`` picks.

Notes
-----
The drivers are ``@njit(_nrt=False)`` and allocate nothing: calling the out-of-line ``views``
from an NRT-compiled function corrupts reference counts (see ``docs/design.md``). They are not
cached on purpose: they inline helpers from other modules, and numba keys a cached function by
its own file only, so a cached driver could keep testing an old kernel. Under
``NUMBA_DISABLE_JIT=1`` they run as plain Python, which is how CI measures coverage.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import kvnumba
from kvnumba import BlockManager, PagePool
from kvnumba._kernels.links import LinkedList, list_push_back, list_push_front, list_unlink
from kvnumba._kernels.prefix import (
    chain_hash,
    root_hash,
    table_find,
    table_insert,
    table_mark_evicted,
    table_purge_evicted,
)
from kvnumba._kernels.rollback import rollback
from kvnumba._kernels.undo import NOT_LOGGED, U_TOKROW, log_write, set_logged
from kvnumba._kernels.views import views
from kvnumba._kernels.virtual_pages import free_in_page, take_from_pages
from kvnumba._layout import (
    EMPTY,
    FIELD,
    HEADER_BYTES,
    HEADER_SLOTS,
    M_BUCKET_MIN,
    M_CO_COUNT,
    M_FREE_MAPPED,
    M_LRU_HEAD,
    M_LRU_TAIL,
    M_MAPPED,
    M_REGISTERED,
    M_USED,
    M_VTOP,
    NIL,
    S_EV_N,
    S_LOG_N,
    S_LOG_ON,
    S_MAP_N,
    S_UNMAP_N,
    STATE_FIELDS,
)

_LRU = (FIELD.lru_prev, FIELD.lru_next)
_MASK64 = (1 << 64) - 1

# --- drivers: thin NRT-free wrappers that build the views and call one helper -------------------


@njit(_nrt=False)
def _table_op(arena, scratch, op, b, h, record):
    v = views(arena, scratch, scratch)
    if op == 0:
        table_insert(v, b, h)
    elif op == 1:
        table_mark_evicted(v, b, h, record)
    else:
        table_purge_evicted(v)


@njit(_nrt=False)
def _find_all(arena, scratch, hashes, salts, probes, out):
    v = views(arena, scratch, scratch)
    for q in range(hashes.shape[0]):
        out[q] = table_find(v, hashes[q], salts[q], probes[q])


@njit(_nrt=False)
def _chain(parent, salt, block_tokens, hash_bits):
    return chain_hash(parent, salt, block_tokens, hash_bits)


@njit(_nrt=False)
def _root():
    return root_hash()


@njit(_nrt=False)
def _list_op(arena, scratch, op, node, tailed):
    # One list on the LRU arrays, ends in meta; ``tailed`` selects the helpers of a list with a
    # tail (push_back, the LRU and cache-only lists) or without (push_front, the buckets).
    v = views(arena, scratch, scratch)
    tail_i = M_LRU_TAIL if tailed else -1
    lst = LinkedList(v.lru_prev, v.lru_next, _LRU, v.meta, NOT_LOGGED, M_LRU_HEAD, tail_i)
    if op == 0:
        if tailed:
            list_push_back(v, node, lst)
        else:
            list_push_front(v, node, lst)
    else:
        list_unlink(v, node, lst)


@njit(_nrt=False)
def _logged_write(arena, scratch, code, index, value):
    """``set_logged`` on element ``index`` (flat) of state field ``code``, whatever its dtype."""
    v = views(arena, scratch, scratch)
    header = arena[:HEADER_BYTES].view(np.int64)
    offset = header[HEADER_SLOTS * code]
    data = arena[offset : offset + header[HEADER_SLOTS * code + 1]]
    itemsize = header[HEADER_SLOTS * code + 2]
    if itemsize == 8:
        set_logged(v, data.view(np.int64), code, index, value)
    elif itemsize == 4:
        set_logged(v, data.view(np.int32), code, index, value)
    else:
        set_logged(v, data, code, index, value)


@njit(_nrt=False)
def _rollback(arena, scratch, pool):
    # Helpers have no Python wrapper (see kvnumba._kernels.jit): reached through a driver.
    rollback(arena, scratch, pool)


@njit(_nrt=False)
def _log_entry(arena, scratch, code, index, old):
    v = views(arena, scratch, scratch)
    log_write(v, code, index, old)


@njit(_nrt=False)
def _page_op(arena, scratch, pool, op, b):
    v = views(arena, scratch, pool)
    if op == 0:
        return take_from_pages(v)
    free_in_page(v, b)
    return NIL


def _log_on(mgr) -> None:
    """Start a logged call as the kernels do: log switched on, empty, ``meta`` saved whole."""
    x = mgr._arenas.x
    x["scr"][S_LOG_ON] = 1
    x["scr"][S_LOG_N] = 0
    x["meta_save"][:] = mgr._arenas.s.meta


# --- 1. the prefix table ------------------------------------------------------------------------

# Hashes whose homes (h & 63 in a 64-slot table) pile up at both ends of the table, so clusters
# wrap around and the backward-shift purge meets its cyclic case; some are >= 2**63.
_HASHES = (0, 1, 5, 62, 63, 64, 127, 2**63, 2**63 + 63, _MASK64)


def _pick_hash(rng) -> int:
    # Not ``rng.choice(_HASHES)``: it converts the tuple to float64 and loses the low bits.
    return _HASHES[int(rng.integers(len(_HASHES)))]


class _TableModel:
    """The prefix table as a dict, and the kernel's table checked against it."""

    def __init__(self, mgr):
        self.mgr = mgr
        self.live = {}  # block -> (hash, salt, tokens)
        self.marks = {}  # eviction record -> hash

    def content_of(self, key):
        return next((b for b, c in self.live.items() if c == key), NIL)

    def insert(self, b, h, salt, tokens, write=True):
        if write:  # the block's content (written by the registration, not by the table)
            self.write(b, h, salt, tokens)
        _table_op(self.mgr._arenas.arena, self.mgr._arenas.scratch, 0, b, np.uint64(h), 0)
        self.live[b] = (h, salt, tuple(tokens))

    def write(self, b, h, salt, tokens):
        s = self.mgr._arenas.s
        s.block_hash[b] = np.uint64(h)
        s.block_salt[b] = salt
        s.tokens[b] = tokens

    def mark(self, b):
        # As ``evict_block`` does: record k keeps the hash, then the entry becomes the mark.
        k = len(self.marks)
        h = self.live.pop(b)[0]
        self.mgr._arenas.x["ev_hash"][k] = np.uint64(h)
        self.mgr._arenas.x["scr"][S_EV_N] = k + 1
        _table_op(self.mgr._arenas.arena, self.mgr._arenas.scratch, 1, b, np.uint64(h), k)
        self.marks[k] = h

    def purge(self):
        _table_op(self.mgr._arenas.arena, self.mgr._arenas.scratch, 2, 0, np.uint64(0), 0)
        self.mgr._arenas.x["scr"][S_EV_N] = 0  # what the committing call does after the purge
        self.marks.clear()

    def check(self, rng, block_size):
        s = self.mgr._arenas.s
        htab = s.htab.astype(np.int64)
        mask = htab.shape[0] - 1
        # Exactly the model's entries: live blocks once each, marks of pending records once each.
        assert sorted(htab[htab >= 0]) == sorted(self.live)
        assert sorted(htab[htab < EMPTY]) == sorted(-2 - k for k in self.marks)
        assert s.meta[M_REGISTERED] == len(self.live)
        # Linear probing: no empty slot between an entry's home and its slot.
        for i in np.flatnonzero(htab != EMPTY):
            e = htab[i]
            h = int(s.block_hash[e]) if e >= 0 else self.marks[-2 - e]
            j = h & mask
            while j != i:
                assert htab[j] != EMPTY, f"entry {e} at {i} unreachable from its home {h & mask}"
                j = (j + 1) & mask
        # Every live block is found by its content; colliding hashes with other tokens or salt
        # are not (token verification), and random contents find what the model holds.
        queries = list(self.live.values())
        for h, salt, tokens in self.live.values():
            queries.append((h, salt, tuple(1 - t for t in tokens)))
            queries.append((h, 1 - salt, tokens))
        for _ in range(8):
            tokens = tuple(int(t) for t in rng.integers(0, 2, block_size))
            queries.append((_pick_hash(rng), int(rng.integers(0, 2)), tokens))
        hashes = np.array([q[0] for q in queries], dtype=np.uint64)
        salts = np.array([q[1] for q in queries], dtype=np.int64)
        probes = np.array([q[2] for q in queries], dtype=np.int64).reshape(-1, block_size)
        out = np.empty(len(queries), dtype=np.int64)
        _find_all(self.mgr._arenas.arena, self.mgr._arenas.scratch, hashes, salts, probes, out)
        assert list(out) == [self.content_of(q) for q in queries]


@pytest.mark.parametrize("seed", range(3))
def test_prefix_table_against_dict_model(seed):
    rng = np.random.default_rng(seed)
    n, bs = 16, 2
    mgr = BlockManager(n, bs, max_seqs=2)
    assert mgr._arenas.s.htab.shape[0] == 64  # the homes in _HASHES assume this size
    model = _TableModel(mgr)
    for _ in range(150):
        op = rng.random()
        idle = [b for b in range(n) if b not in model.live]
        if op < 0.5 and idle:
            # Blocks just marked may be registered again (a block evicted and reused in one call).
            b = int(rng.choice(idle))
            h, salt = _pick_hash(rng), int(rng.integers(0, 2))
            tokens = tuple(int(t) for t in rng.integers(0, 2, bs))
            if model.content_of((h, salt, tokens)) == NIL:  # the caller's precondition
                model.insert(b, h, salt, tokens)
        elif op < 0.85 and model.live and len(model.marks) < 16:
            model.mark(int(rng.choice(list(model.live))))
        else:
            model.purge()
        model.check(rng, bs)
        if not model.marks and rng.random() < 0.2:
            # A logged batch of table writes rolls back byte for byte: every write is one element
            # (marks instead of deletions), and the records of the batch are forgotten.
            # The content of the blocks to register is written first: here only the table is
            # under test, and the registration logs those fields itself.
            idle = [b for b in range(n) if b not in model.live]
            fresh = [(b, _pick_hash(rng)) for b in idle[:2]]
            for b, h in fresh:
                model.write(b, h, 0, (7, 7))
            before, saved = mgr._arenas.arena.copy(), (dict(model.live), dict(model.marks))
            _log_on(mgr)
            for b in list(model.live)[:3]:
                model.mark(b)
            for b, h in fresh:
                if b not in model.live and model.content_of((h, 0, (7, 7))) == NIL:
                    model.insert(b, h, 0, (7, 7), write=False)
            _rollback(mgr._arenas.arena, mgr._arenas.scratch, mgr._arenas.scratch)
            assert mgr._arenas.x["scr"][S_EV_N] == 0
            model.live, model.marks = saved
            assert mgr._arenas.arena.tobytes() == before.tobytes()
            model.check(rng, bs)
    model.purge()
    model.check(rng, bs)


def _mix64(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _chain_model(parent: int, salt: int, tokens, bits: int) -> int:
    """``chain_hash`` in Python integers (splitmix64 mixing, arithmetic mod 2**64)."""
    h = _mix64(parent ^ _mix64((salt & _MASK64) ^ 0xBB67AE8584CAA73B))
    for t in tokens:
        h = ((h ^ (t & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 29
    h = _mix64(h)
    return h & ((1 << bits) - 1) if bits < 64 else h


# Under NUMBA_DISABLE_JIT numpy warns about the (intended) uint64 wraparound of the mixing.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("bits", [64, 63, 4, 0])
def test_chain_hash_against_integer_model(bits):
    rng = np.random.default_rng(bits)
    parent = int(_root())
    assert parent == 0x6A09E667F3BCC908
    for _ in range(20):
        salt = int(rng.integers(-(2**63), 2**63 - 1))
        tokens = rng.integers(-1, 2**40, int(rng.integers(1, 5)))
        got = int(_chain(np.uint64(parent), np.int64(salt), tokens, bits))
        assert got == _chain_model(parent, salt, [int(t) for t in tokens], bits)
        assert got < 2**bits
        parent = got if bits == 64 else int(rng.integers(0, 2**63)) * 2 + 1


# --- 2. the intrusive list helper ---------------------------------------------------------------


def _walk(nxt, start, limit):
    out, node = [], start
    while node != NIL:
        out.append(int(node))
        assert len(out) <= limit, "cycle in the links"
        node = nxt[node]
    return out


def _check_list(mgr, model, tailed):
    s = mgr._arenas.s
    n = s.lru_next.shape[0]
    head = s.meta[M_LRU_HEAD]
    assert _walk(s.lru_next, head, n) == model
    if model:
        assert s.lru_prev[head] == NIL
    last = s.meta[M_LRU_TAIL] if tailed else (model[-1] if model else NIL)
    assert _walk(s.lru_prev, last, n) == model[::-1]
    if tailed and model:
        assert s.lru_next[last] == NIL


@pytest.mark.parametrize("tailed", [True, False])
def test_list_helpers_against_python_list(tailed):
    rng = np.random.default_rng(7 + tailed)
    n = 12
    mgr = BlockManager(n, 2, max_seqs=2)
    s, x = mgr._arenas.s, mgr._arenas.x
    model = []
    for step in range(300):
        outside = [b for b in range(n) if b not in model]
        if outside and (not model or rng.random() < 0.55):
            b = int(rng.choice(outside))
            _list_op(mgr._arenas.arena, mgr._arenas.scratch, 0, b, tailed)
            if tailed:
                model.append(b)
            else:
                model.insert(0, b)
        else:
            b = int(rng.choice(model))
            links = (s.lru_prev[b], s.lru_next[b])
            _list_op(mgr._arenas.arena, mgr._arenas.scratch, 1, b, tailed)
            model.remove(b)
            # Dancing links: the node keeps its own links, only the neighbours change.
            assert (s.lru_prev[b], s.lru_next[b]) == links
        _check_list(mgr, model, tailed)
        if step % 25 == 24:
            # Logged: an unlink costs one entry per neighbour (the ends live in meta, saved whole),
            # and the rollback restores every link.
            before, saved = mgr._arenas.arena.copy(), list(model)
            _log_on(mgr)
            for b in list(model[:3]):
                p, q = s.lru_prev[b], s.lru_next[b]
                logged = x["scr"][S_LOG_N]
                _list_op(mgr._arenas.arena, mgr._arenas.scratch, 1, b, tailed)
                model.remove(b)
                assert x["scr"][S_LOG_N] - logged == (p != NIL) + (q != NIL)
            for b in [b for b in range(n) if b not in model][:3]:
                _list_op(mgr._arenas.arena, mgr._arenas.scratch, 0, b, tailed)
            _rollback(mgr._arenas.arena, mgr._arenas.scratch, mgr._arenas.scratch)
            model = saved
            assert mgr._arenas.arena.tobytes() == before.tobytes()
            _check_list(mgr, model, tailed)


# --- 3. rollback of every logged field ----------------------------------------------------------

# Every state field a kernel writes through the undo log (``FIELD.<name>`` in their sources).
_LOGGED = (
    "ref",
    "lru_prev",
    "lru_next",
    "block_hash",
    "block_key",
    "block_salt",
    "block_flags",
    "htab",
    "seq_table",
    "seq_len",
    "seq_gen",
    "seq_salt",
    "seq_live",
    "seq_anchor",
    "page_phys",
    "page_free",
    "page_used",
    "page_head",
    "bucket_prev",
    "bucket_next",
    "co_prev",
    "co_next",
    "vstack",
    "page_stamp",
    "buckets",
    # Eviction policies other than LRU (their fields have no rows under LRU).
    "pol_words",
    "pol_links",
)


def test_logged_fields_list_is_complete():
    # A field that a kernel starts logging must get a rollback case below.
    kernels = Path(kvnumba.__file__).parent / "_kernels"
    used = set()
    for path in kernels.glob("*.py"):
        used |= set(re.findall(r"FIELD\.(\w+)", path.read_text()))
    assert used <= set(_LOGGED)
    assert set(_LOGGED) <= {f.name for f in STATE_FIELDS}


def _paged_manager(on_evict=None, block_keys=False, eviction="lru"):
    """A small paged manager with some state: two sequences, full and partial blocks."""
    mgr = BlockManager(
        16,
        2,
        max_seqs=4,
        page_pool=PagePool(4),
        blocks_per_page=4,
        on_evict=on_evict,
        block_keys=block_keys,
        eviction=eviction,
    )
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [5, 3], np.arange(8))
    return mgr


@pytest.mark.parametrize("name", _LOGGED)
def test_rollback_restores_each_logged_field(name):
    # Key rows exist with block_keys only, policy rows with a policy other than LRU.
    mgr = _paged_manager(
        block_keys=name == "block_key", eviction="leaf-lru" if name.startswith("pol_") else "lru"
    )
    field = getattr(mgr._arenas.s, name)
    flat = field.reshape(-1)  # a view: seq_table is 2-D and logged by flat index
    code = getattr(FIELD, name)
    i = field.shape[1] + 1 if field.ndim == 2 else 1  # seq_table[1, 1]
    j = flat.shape[0] - 1
    if name in ("block_hash", "block_key"):
        flat[i] = np.uint64(2**63 + 12345)  # the int64 log entry must keep the top bit
    before, meta_before = mgr._arenas.arena.copy(), mgr._arenas.s.meta.copy()
    old_i, old_j = flat[i].item(), flat[j].item()

    def as_arg(value):
        # The driver writes through a signed view of the field's width; pass that bit pattern.
        width = field.dtype.itemsize
        signed = {8: np.int64, 4: np.int32, 1: np.uint8}[width]
        return int(np.array([value % 2 ** (8 * width)], dtype=np.uint64).astype(signed)[0])

    _log_on(mgr)
    # Two writes to one element: only a backward replay restores the first old value.
    for value, at in ((old_i + 3, i), (old_i + 5, i), (old_j + 1, j)):
        _logged_write(mgr._arenas.arena, mgr._arenas.scratch, code, at, as_arg(value))
    assert mgr._arenas.x["scr"][S_LOG_N] == 3
    assert flat[i].item() == (old_i + 5) % 2 ** (8 * field.dtype.itemsize)
    assert flat[j].item() != old_j
    mgr._arenas.s.meta[M_USED] += 9  # meta needs no entries: it is saved whole
    _rollback(mgr._arenas.arena, mgr._arenas.scratch, mgr.page_pool.arena)
    assert mgr._arenas.x["scr"][S_LOG_ON] == 0 and mgr._arenas.x["scr"][S_LOG_N] == 0
    assert np.array_equal(mgr._arenas.s.meta, meta_before)
    assert mgr._arenas.arena.tobytes() == before.tobytes()


@pytest.mark.parametrize("row", [-1, 0])
def test_rollback_restores_token_rows(row):
    # U_TOKROW: a scrubbed block gets its payload back from its eviction record (row >= 0), or a
    # blank block that was written goes back to -1 (row -1).
    mgr = _paged_manager(on_evict=lambda *args: None)  # keeps eviction payloads
    tokens = mgr._arenas.s.tokens
    b = 0 if row >= 0 else tokens.shape[0] - 1
    assert (tokens[b] >= 0).all() if row >= 0 else (tokens[b] == -1).all()
    before = mgr._arenas.arena.copy()
    _log_on(mgr)
    if row >= 0:
        mgr._arenas.x["ev_tok"][row] = tokens[b]
    _log_entry(mgr._arenas.arena, mgr._arenas.scratch, U_TOKROW, b, row)
    tokens[b] = -1 if row >= 0 else 42
    _rollback(mgr._arenas.arena, mgr._arenas.scratch, mgr.page_pool.arena)
    assert mgr._arenas.arena.tobytes() == before.tobytes()


# --- 4. page buckets ------------------------------------------------------------------------------


class _PageModel:
    """The page policy of ``docs/design.md`` for takes and frees (no cached blocks)."""

    def __init__(self, pages, k, pool_pages):
        self.k = k
        self.unmapped = list(range(pages - 1, -1, -1))  # popped from the end: 0, 1, ...
        self.pool_free = pool_pages
        self.free = {}  # mapped page -> its free list, top last
        self.buckets = {c: [] for c in range(1, k)}  # front first

    def take(self):
        for c in range(1, self.k):
            if self.buckets[c]:
                page = self.buckets[c].pop(0)
                if c > 1:
                    self.buckets[c - 1].insert(0, page)
                return self.free[page].pop()
        if not self.unmapped or not self.pool_free:
            return NIL
        page = self.unmapped.pop()
        self.pool_free -= 1
        first = page * self.k
        self.free[page] = list(range(first + self.k - 1, first, -1))
        if self.k > 1:
            self.buckets[self.k - 1].insert(0, page)
        return first

    def give(self, b):
        page = b // self.k
        c = len(self.free[page])
        if c:
            self.buckets[c].remove(page)
        self.free[page].append(b)
        if c + 1 == self.k:
            del self.free[page]
            self.unmapped.append(page)
            self.pool_free += 1
        else:
            self.buckets[c + 1].insert(0, page)


def _check_pages(mgr, model):
    s, k = mgr._arenas.s, model.k
    for c in range(1, k):
        assert _walk(s.bucket_next, s.buckets[c], len(s.page_free)) == model.buckets[c], c
        front = model.buckets[c][0] if model.buckets[c] else NIL
        if front != NIL:
            assert s.bucket_prev[front] == NIL
        for p, q in pairwise(model.buckets[c]):
            assert s.bucket_prev[q] == p
    for page in range(len(s.page_free)):
        top_first = model.free.get(page, [])[::-1]
        assert _walk(s.lru_next, s.page_head[page], k) == top_first
        assert s.page_free[page] == len(top_first)
        assert (s.page_phys[page] >= 0) == (page in model.free)
        if page in model.free:
            assert s.page_used[page] == k - len(top_first)
    assert list(s.vstack[: s.meta[M_VTOP]]) == model.unmapped
    assert s.meta[M_FREE_MAPPED] == sum(len(f) for f in model.free.values())
    assert s.meta[M_MAPPED] == len(model.free)
    assert s.meta[M_CO_COUNT] == 0
    # The hint may lag low but never high: no bucket below it holds a page.
    assert all(s.buckets[c] == NIL for c in range(1, min(s.meta[M_BUCKET_MIN], k)))


@pytest.mark.parametrize("k", [1, 3, 4])
def test_take_from_pages_fullest_page_first(k):
    pages, pool_pages = 5, 3  # fewer pool pages than virtual pages: takes can fail
    rng = np.random.default_rng(k)
    pool = PagePool(pool_pages)
    mgr = BlockManager(pages * k, 2, max_seqs=2, page_pool=pool, blocks_per_page=k)
    model = _PageModel(pages, k, pool_pages)
    held = []
    for _ in range(200):
        if not held or rng.random() < 0.55:
            b = _page_op(mgr._arenas.arena, mgr._arenas.scratch, pool.arena, 0, 0)
            assert b == model.take()
            if b != NIL:
                held.append(int(b))
        else:
            b = held.pop(int(rng.integers(len(held))))
            _page_op(mgr._arenas.arena, mgr._arenas.scratch, pool.arena, 1, b)
            model.give(b)
        # Each op is a call of its own: the map records start empty again.
        mgr._arenas.x["scr"][S_MAP_N] = 0
        mgr._arenas.x["scr"][S_UNMAP_N] = 0
        assert pool.num_free == model.pool_free
        _check_pages(mgr, model)


def test_each_kernel_version_is_told_apart_by_its_arena_types():
    """The four versions of ``_kernels/versions.py``: plain, paged, policy, both; what the
    facade passes (``kernels.arena_types``) selects the one its manager needs."""
    from kvnumba import kernels
    from kvnumba._kernels import versions
    from kvnumba._kernels.views import VIEWS

    table = {
        VIEWS: (False, False),
        versions.VIEWS_PAGED: (True, False),
        versions.VIEWS_POLICY: (False, True),
        versions.VIEWS_POLICY_PAGED: (True, True),
    }
    assert len(set(table)) == 4  # four distinct numba types: four compiled versions
    for views_type, (paged, policy) in table.items():
        assert versions.is_paged(views_type) is paged
        assert versions.is_policy(views_type) is policy
        assert versions.is_policy_arena(views_type.types[-3]) is policy
    assert versions.state_arena(False) == versions.STATE_ARENA
    assert versions.state_arena(True) == versions.POLICY_ARENA
    assert kernels.arena_types("k_append", policy=True)[0] == versions.POLICY_ARENA
    assert kernels.arena_types("k_append")[0] == versions.STATE_ARENA
    assert not versions.is_policy_arena(versions.STATE_ARENA)
