"""``append_one`` / ``admit_one`` / ``table_row``: the one-request calls do exactly what the
batched calls do (twin managers end byte-identical), raise the same typed errors and change
nothing when they fail."""

import copy
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvnumba
from kvnumba import PagePool, PoolExhausted, SequenceReleased, SequenceTooLong
from kvnumba._kernel_set import Lazy
from kvnumba._layout import CALL_ROOM_INPUTS, CALL_ROOM_MAX_HITS, M_ID_TAG
from kvnumba.ids import ID_TAG_SHIFT


def _key(i):
    return np.frombuffer(hashlib.sha256(str(i).encode()).digest(), dtype=np.uint64)


KEYS = np.stack([_key(i) for i in range(64)])


def _twins(**kwargs):
    evicted = ([], [])
    managers = [
        kvnumba.BlockManager(
            24,
            4,
            max_seqs=16,
            max_seq_len=64,
            on_evict=lambda b, h, t, out=out: out.append(b.tolist()),
            **kwargs,
        )
        for out in evicted
    ]
    return managers, evicted


def _same_state(a, b):
    """Byte-identical but for the id tag (every manager has its own)."""
    for name, x, y in zip(a.state._fields, a.snapshot(), b.snapshot(), strict=True):
        if name == "meta":
            x, y = x.copy(), y.copy()
            x[M_ID_TAG] = y[M_ID_TAG] = 0
        assert np.array_equal(x, y), name


def _untagged(outcome):
    """An outcome with its sequence id's tag removed (ids of twins differ in the tag only)."""
    if isinstance(outcome, tuple):
        return (outcome[0] & (1 << ID_TAG_SHIFT) - 1, *outcome[1:])
    return outcome


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 20), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("append"), st.integers(0, 15), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 15), st.just(0), st.just(0)),
        st.tuples(st.just("fork"), st.integers(0, 15), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, keyed=st.booleans())
def test_one_request_calls_match_the_batched_calls(ops, keyed):
    (one, batched), evicted = _twins(block_keys=keyed, block_events=True, reserved_blocks=1)
    live = []
    for op, a, b, c in ops:
        if op == "admit":
            length, prefix, cap = a, b, c
            tokens = (np.arange(length) % 7 + 10 * prefix).astype(np.int64)
            keys = KEYS[prefix * 5 : prefix * 5 + length // 4] if keyed else None
            outcomes = []
            for m, single in ((one, True), (batched, False)):
                try:
                    if single:
                        outcomes.append(m.admit_one(tokens, keys=keys, max_hit_blocks=cap))
                    else:
                        r = m.admit(tokens, [length], keys=keys, max_hit_blocks=cap)
                        outcomes.append((int(r.ids[0]), int(r.num_cached_tokens[0])))
                except kvnumba.KVNumbaError as error:
                    outcomes.append(type(error))
            assert _untagged(outcomes[0]) == _untagged(outcomes[1])
            if isinstance(outcomes[0], tuple):
                live.append((outcomes[0][0], outcomes[1][0]))
        elif op == "append" and live:
            pair, count = live[a % len(live)], b
            outcomes = []
            for m, single, seq in ((one, True, pair[0]), (batched, False, pair[1])):
                before = -(-int(m.seq_lens([seq])[0]) // 4)
                try:
                    if single:
                        outcomes.append(m.append_one(seq, count))
                    else:
                        r = m.append([seq], [count])
                        after = -(-int(m.seq_lens([seq])[0]) // 4)
                        copy = (
                            (int(r.cow_src[0]), int(r.cow_dst[0])) if len(r.cow_src) else (-1, -1)
                        )
                        outcomes.append((before, after, *copy))
                except kvnumba.KVNumbaError as error:
                    outcomes.append(type(error))
            assert outcomes[0] == outcomes[1]
            if isinstance(outcomes[0], tuple):
                row = one.table_row(pair[0])
                assert np.array_equal(row[: outcomes[0][1]], one.block_tables([pair[0]])[0])
        elif op == "fork" and live and len(live) < 12:
            pair = live[a % len(live)]
            live.append((int(one.fork([pair[0]])[0, 0]), int(batched.fork([pair[1]])[0, 0])))
        elif op == "release" and live:
            pair = live.pop(a % len(live))
            one.release([pair[0]])
            batched.release([pair[1]])
        one.check()
        _same_state(one, batched)
        assert evicted[0] == evicted[1]
        first, second = one.take_events(), batched.take_events()
        for x, y in zip(first, second, strict=True):
            assert np.array_equal(x, y)


def test_append_one_failure_changes_nothing_and_raises_typed_errors():
    m = kvnumba.BlockManager(4, 4, max_seqs=4, max_seq_len=32)
    seq, _ = m.admit_one(np.arange(9))
    before = m.snapshot()
    with pytest.raises(PoolExhausted) as error:
        m.append_one(seq, 12)
    assert (error.value.needed, error.value.available) == (3, 1)
    with pytest.raises(SequenceTooLong):
        m.append_one(seq, 40)
    with pytest.raises(ValueError, match="negative"):
        m.append_one(seq, -1)
    for bad in (1.0, True, "1", None):
        with pytest.raises(TypeError):
            m.append_one(seq, bad)
        with pytest.raises(TypeError):
            m.append_one(bad, 1)
    for x, y in zip(before, m.snapshot(), strict=True):
        assert np.array_equal(x, y)
    m.release([seq])
    with pytest.raises(SequenceReleased):
        m.append_one(seq, 1)
    with pytest.raises(SequenceReleased):
        m.table_row(seq)


def test_admit_one_failure_changes_nothing():
    m = kvnumba.BlockManager(4, 4, max_seqs=2, max_seq_len=32, block_keys=True)
    m.admit_one(None, length=9, keys=KEYS[:2])
    before = m.snapshot()
    with pytest.raises(PoolExhausted):
        m.admit_one(None, length=16, keys=KEYS[5:9])
    with pytest.raises(ValueError, match="key_counts"):
        m.admit_one(None, length=7, keys=KEYS[:2])  # two keys for one full block
    with pytest.raises(ValueError, match="negative"):
        m.admit_one(None, length=4, max_hit_blocks=-1)
    with pytest.raises(ValueError, match="tokens or a length"):
        m.admit_one()
    with pytest.raises(SequenceTooLong):
        m.admit_one(None, length=33)
    with pytest.raises(TypeError):
        m.admit_one(None, length=4.0)
    for x, y in zip(before, m.snapshot(), strict=True):
        assert np.array_equal(x, y)
    plain = kvnumba.BlockManager(4, 4)
    with pytest.raises(ValueError, match="block_keys"):
        plain.admit_one(None, length=4)


def test_a_failed_fast_admit_one_falls_back_without_a_second_fast_try():
    # One PoolExhausted costs the fast kernel's try and the batched call that raises: two runs.
    m = kvnumba.BlockManager(4, 4, max_seqs=2, max_seq_len=32, block_keys=True)
    m.admit_one(None, length=9, keys=KEYS[:2])
    runs = []
    for name in ("k_admit_one_keys", "k_admit_keys"):
        kernel = getattr(m._kernels, name)

        def counted(*args, _kernel=kernel, _name=name):
            runs.append(_name)
            return _kernel(*args)

        setattr(m._kernels, name, counted)
    with pytest.raises(PoolExhausted):
        m.admit_one(None, length=16, keys=KEYS[5:9])
    assert runs == ["k_admit_one_keys", "k_admit_keys"]


def test_admit_one_takes_strided_keys_and_refuses_keys_of_another_shape():
    # The keyed fast path passes any strides to the kernel, which checks the row width.
    wide = np.zeros((8, 8), dtype=np.uint64)
    wide[:, ::2] = KEYS[:8]
    (a, b), _ = _twins(block_keys=True)
    for length in (9, 13, 13):
        got = a.admit_one(None, length=length, keys=wide[: length // 4, ::2])
        want = b.admit_one(None, length=length, keys=KEYS[: length // 4].copy())
        assert _untagged(got) == _untagged(want)
    _same_state(a, b)
    before = a.snapshot()
    for bad, error in [
        (KEYS[:2, :3], ValueError),  # three words per key
        (wide[:2, :6:2], ValueError),  # three words per key, strided
        (KEYS[0], ValueError),  # one-dimensional
        (KEYS[:2].astype(np.float64), TypeError),
    ]:
        with pytest.raises(error):
            a.admit_one(None, length=9, keys=bad)
    for x, y in zip(before, a.snapshot(), strict=True):
        assert np.array_equal(x, y)
    a.check()


def _batched_refused(manager, *names):
    """Make ``manager``'s batched ``names`` raise: a one-request call must then not fall back."""

    def refuse(*args, **kwargs):
        raise AssertionError("the batched call ran")

    for name in names:
        setattr(manager, name, refuse)


def _batched_spied(manager, name):
    """Count ``manager``'s batched ``name`` calls (a one-request call that falls back)."""
    calls = []
    original = getattr(manager, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    setattr(manager, name, spy)
    return calls


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("length", [250, 256])
def test_one_request_calls_of_the_longest_prompt_with_one_sequence_slot(keyed, length):
    # The one-request kernels carve their inputs and a sequence's worth of hits out of the
    # scratch ``slots`` field, sized for max_seqs ids: with one sequence slot and 64 blocks per
    # sequence the field must still hold the longest prompt's hits (256 tokens: exactly full).
    def make():
        return kvnumba.BlockManager(
            200, 4, max_seqs=1, max_seq_len=256, block_keys=keyed, block_events=True
        )

    one, batched = make(), make()
    assert one._arenas.x["slots"].shape[0] == 64 + CALL_ROOM_INPUTS
    _batched_refused(one, "admit", "append")  # the fast path must serve every call
    tokens = np.arange(length, dtype=np.int64) % 11
    full = length // 4
    keys = KEYS[:full] if keyed else None
    for round_ in range(3):  # a cold prompt, then twice with its full blocks cached
        got = one.admit_one(None if keyed else tokens, length=length, keys=keys)
        r = batched.admit(None if keyed else tokens, [length], keys=keys)
        assert _untagged(got) == _untagged((int(r.ids[0]), int(r.num_cached_tokens[0])))
        # The last prompt token is always computed: a whole last block is not reused.
        assert got[1] == (0 if round_ == 0 else 4 * ((length - 1) // 4))
        if length < 256:
            assert one.append_one(got[0], 6) == (63, 64, -1, -1)  # up to max_seq_len
            batched.append(r.ids, [6])
        one.check()
        _same_state(one, batched)
        one.release([got[0]])
        batched.release(r.ids)
    for x, y in zip(one.take_events(), batched.take_events(), strict=True):
        assert np.array_equal(x, y)


def test_admit_one_of_more_blocks_than_the_call_room_holds_takes_the_batched_path():
    # The call room holds at most CALL_ROOM_MAX_HITS hits (absurd sequence lengths must not
    # double the scratch arena); a longer prompt is admitted by the batched call.
    blocks = CALL_ROOM_MAX_HITS + 10

    def make():
        return kvnumba.BlockManager(blocks + 1, 1, max_seqs=1, max_seq_len=blocks)

    one, batched = make(), make()
    assert one._arenas.x["slots"].shape[0] == CALL_ROOM_MAX_HITS + CALL_ROOM_INPUTS
    fallbacks = _batched_spied(one, "admit")
    tokens = np.arange(blocks, dtype=np.int64) % 5
    for round_ in range(2):  # the second admit reuses all but the last block
        got = one.admit_one(tokens)
        r = batched.admit(tokens, [blocks])
        assert _untagged(got) == _untagged((int(r.ids[0]), int(r.num_cached_tokens[0])))
        assert got[1] == (0 if round_ == 0 else blocks - 1)
        one.check()
        _same_state(one, batched)
        one.release([got[0]])
        batched.release(r.ids)
    assert fallbacks == ["admit", "admit"]
    assert one.admit_one(tokens[:CALL_ROOM_MAX_HITS])[1] == CALL_ROOM_MAX_HITS - 1
    assert fallbacks == ["admit", "admit"]  # a prompt that fits the room: no fallback


def test_append_one_beyond_a_block_runs_without_slots_and_matches_append():
    # append_one carves a slot mapping from the call room for at most block_size tokens; a
    # longer append runs with none. Both must do what the batched append does.
    def make():
        return kvnumba.BlockManager(80, 4, max_seqs=1, max_seq_len=256)

    one, batched = make(), make()
    _batched_refused(one, "append")
    a, b = one.new_sequences(1)[0], batched.new_sequences(1)[0]
    for count in (3, 1, 4, 66, 67, 115):  # in the tail, filling it, a fresh block; longer
        got = one.append_one(int(a), count)
        batched.append([b], [count])
        length = int(batched.seq_lens([b])[0])
        assert got == (-(-(length - count) // 4), -(-length // 4), -1, -1)
        one.check()
        _same_state(one, batched)


def test_append_one_of_a_whole_block_bigger_than_a_sequence_of_blocks():
    # Blocks of 64 tokens, one block per sequence: the room is block_size + 8 words (its
    # blocks_per_seq and max_seqs terms are smaller), enough for the in-block path's 64 slots.
    def make():
        return kvnumba.BlockManager(8, 64, max_seqs=1, max_seq_len=64)

    one, batched = make(), make()
    assert one._arenas.x["slots"].shape[0] == 64 + CALL_ROOM_INPUTS
    _batched_refused(one, "append")
    a, b = one.new_sequences(1)[0], batched.new_sequences(1)[0]
    assert one.append_one(int(a), 64) == (0, 1, -1, -1)
    batched.append([b], [64])
    one.check()
    _same_state(one, batched)


def test_a_manager_cannot_be_copied():
    # A copy would carry the arenas' addresses (the one-request calls') to memory it does not
    # own, and its state views would no longer alias its arena.
    m = kvnumba.BlockManager(8, 4)
    for copier in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="snapshot"):
            copier(m)


def test_table_row_is_a_live_read_only_view():
    m = kvnumba.BlockManager(16, 4, max_seqs=4, max_seq_len=32)
    seq, _ = m.admit_one(np.arange(5))
    row = m.table_row(seq)
    assert row.tolist()[:3] == [0, 1, -1]
    assert m.append_one(seq, 4) == (2, 3, -1, -1)
    assert row.tolist()[:3] == [0, 1, 2]  # the same view, grown
    with pytest.raises(ValueError):
        row[0] = 5


def test_one_request_calls_on_a_page_pool_take_the_batched_path():
    pool = PagePool(4)
    m = kvnumba.BlockManager(16, 4, max_seqs=4, page_pool=pool, blocks_per_page=4)
    seq, cached = m.admit_one(np.arange(6))
    assert cached == 0
    assert m.append_one(seq, 3) == (2, 3, -1, -1)
    child = int(m.fork([seq])[0, 0])
    shared_tail = int(m.block_tables([seq])[0, 2])
    before, after, cow_src, cow_dst = m.append_one(child, 1)  # a shared partial tail: copied
    assert (before, after, cow_src) == (3, 3, shared_tail)
    assert cow_dst == int(m.block_tables([child])[0, 2]) != shared_tail
    m.check()
    pool.check()


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(0, 9), max_size=30), paged=st.booleans())
def test_append_one_with_keys_matches_append_then_set_keys(steps, paged):
    def make():
        pool = PagePool(8) if paged else None
        return kvnumba.BlockManager(
            32,
            4,
            max_seqs=4,
            max_seq_len=128,
            block_keys=True,
            block_events=True,
            page_pool=pool,
            blocks_per_page=4 if paged else None,
        )

    one, batched = make(), make()
    a, _ = one.admit_one(None, length=3)
    b = int(batched.admit(None, [3]).ids[0])
    keyed = 0
    for count in steps:
        length = int(one.seq_lens([a])[0]) + count
        if length > 128:
            break
        full = length // 4
        keys = KEYS[keyed:full]
        outcome = one.append_one(a, count, key_start=keyed, keys=keys)
        batched.append([b], [count])
        batched.set_keys([b], [keyed], [full - keyed], keys)
        assert outcome[:2] == (-(-(length - count) // 4), -(-length // 4))
        keyed = full
        one.check()
        _same_state(one, batched)
        for x, y in zip(one.take_events(), batched.take_events(), strict=True):
            assert np.array_equal(x, y)


def test_append_one_with_bad_keys_changes_nothing():
    m = kvnumba.BlockManager(16, 4, max_seqs=2, block_keys=True)
    seq, _ = m.admit_one(None, length=6, keys=KEYS[:1])
    before = m.snapshot()
    with pytest.raises(ValueError, match="not all full blocks"):
        m.append_one(seq, 1, key_start=1, keys=KEYS[1:3])  # block 2 would not be full
    with pytest.raises(ValueError, match="another key"):
        m.append_one(seq, 2, key_start=0, keys=KEYS[5:7])  # block 0 has key 0
    with pytest.raises(ValueError, match="full blocks"):
        m.append_one(seq, 2, key_start=-1, keys=KEYS[:1])
    with pytest.raises(ValueError, match="shape"):
        m.append_one(seq, 2, key_start=1, keys=KEYS[1])
    for x, y in zip(before, m.snapshot(), strict=True):
        assert np.array_equal(x, y)
    plain = kvnumba.BlockManager(16, 4)
    other = plain.new_sequences(1)[0]
    with pytest.raises(ValueError, match="block_keys"):
        plain.append_one(other, 4, keys=KEYS[:1])


@settings(max_examples=80, deadline=None)
@given(ops=ops)
def test_the_model_answers_the_one_request_calls_as_the_kernels_do(ops):
    from kvnumba.reference import ReferenceBlockManager

    def make(cls):
        return cls(24, 4, max_seqs=16, max_seq_len=64, block_keys=True, reserved_blocks=1)

    kernels, model = make(kvnumba.BlockManager), make(ReferenceBlockManager)
    live = []
    for op, a, b, c in ops:
        outcomes = []
        if op == "admit":
            keys = KEYS[b * 5 : b * 5 + a // 4]
            for m in (kernels, model):
                try:
                    outcomes.append(m.admit_one(None, length=a, keys=keys, max_hit_blocks=c))
                except kvnumba.KVNumbaError as error:
                    outcomes.append(type(error))
            if isinstance(outcomes[0], tuple):
                live.append((outcomes[0][0], outcomes[1][0]))
            outcomes = [_untagged(x) for x in outcomes]
            hits = [m.lookup_one(length=a, keys=keys).tolist() for m in (kernels, model)]
            assert hits[0] == hits[1]
        elif op in ("append", "fork") and live:
            pair = live[a % len(live)]
            if op == "fork":
                live.append(
                    tuple(
                        int(m.fork([s])[0, 0]) for m, s in zip((kernels, model), pair, strict=True)
                    )
                )
                continue
            for m, seq in zip((kernels, model), pair, strict=True):
                try:
                    outcomes.append(m.append_one(seq, b))
                except kvnumba.KVNumbaError as error:
                    outcomes.append(type(error))
        elif op == "release" and live:
            pair = live.pop(a % len(live))
            for m, seq in zip((kernels, model), pair, strict=True):
                m.release([seq])
        assert len(outcomes) == 0 or outcomes[0] == outcomes[1]
        for pair in live:
            assert kernels.table_row(pair[0])[: len(model.table_row(pair[1]))].tolist() == (
                model.table_row(pair[1]).tolist()
            )
        kernels.check()


def test_lookup_one_by_tokens_matches_lookup_and_the_model():
    """A manager without engine keys looks one prompt up by its tokens in its own kernel: the
    hits of the batched ``lookup`` and of the reference model, with caps and salts."""
    from kvnumba.reference import ReferenceBlockManager

    managers = [
        cls(16, 2, max_seqs=8, max_seq_len=32)
        for cls in (kvnumba.BlockManager, ReferenceBlockManager)
    ]
    for m in managers:
        first = m.admit(list(range(9)), [9]).ids
        m.release(first)
        m.admit([50, 51, 52], [3], salts=[7])
    cases = [
        (list(range(9)), 0, None),
        (list(range(9)), 0, 2),
        (list(range(5)) + [99, 98], 0, None),
        ([50, 51, 52], 7, None),
        ([50, 51, 52], 0, None),
        ([1], 0, None),
    ]
    for tokens, salt, cap in cases:
        found = [m.lookup_one(tokens, salt=salt, max_hit_blocks=cap).tolist() for m in managers]
        batched = managers[0].lookup(tokens, [len(tokens)], salts=[salt], max_hit_blocks=cap)
        n = int(batched.num_cached_tokens[0]) // 2
        assert found[0] == found[1] == batched.block_ids[0][:n].tolist(), (tokens, salt, cap)
    assert managers[0].lookup_one(list(range(9))).tolist() == [0, 1, 2, 3]
    # The one-request kernel served them (loaded on first use), not the batched fallback.
    assert type(managers[0]._kernels.k_lookup_one) is not Lazy
    for m in managers:
        before = m.snapshot() if hasattr(m, "snapshot") else None
        with pytest.raises(ValueError, match="tokens, or a length and keys"):
            m.lookup_one()
        with pytest.raises(kvnumba.SequenceTooLong):
            m.lookup_one(list(range(33)))
        with pytest.raises(TypeError):
            m.lookup_one([1.5, 2.0])
        with pytest.raises(ValueError):
            m.lookup_one(list(range(4)), max_hit_blocks=-1)
        if before is not None:
            after = m.snapshot()
            assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
