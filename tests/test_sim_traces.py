"""Trace parsing: Mooncake JSONL and Azure CSV, token expansion, malformed input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvnumba.sim.traces import (
    MOONCAKE_BLOCK,
    default_trace_path,
    load_azure,
    load_mooncake,
    load_trace,
    output_tokens,
)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def row(ts, n_in, n_out, ids):
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def test_mooncake_fields_and_lazy_tokens(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [row(0, 1000, 5, [7, 8]), row(250, 600, 0, [7, 9])])
    a, b = load_mooncake(path)
    assert (a.index, a.arrival_ms, a.prompt_len, a.output_len) == (0, 0.0, 1000, 5)
    assert (b.index, b.arrival_ms, b.prompt_len, b.output_len) == (1, 250.0, 600, 0)
    ta, tb = a.prompt_tokens(), b.prompt_tokens()
    assert ta.dtype == np.int64 and ta.shape == (1000,) and tb.shape == (600,)
    assert ta.min() >= 0  # never the manager's "unknown token" -1
    # Equal hash id: equal first 512 tokens; different hash id: different content after it.
    assert np.array_equal(ta[:MOONCAKE_BLOCK], tb[:MOONCAKE_BLOCK])
    assert np.mean(ta[MOONCAKE_BLOCK:600] == tb[MOONCAKE_BLOCK:600]) < 0.01
    # Deterministic, and positions inside one hash block are not all the same token.
    assert np.array_equal(ta, load_mooncake(path)[0].prompt_tokens())
    assert np.unique(ta[:MOONCAKE_BLOCK]).size > 500


def test_same_hash_id_same_tokens_at_any_offset_in_the_prompt(tmp_path):
    # Hash id 5 as the 2nd block of one prompt and (after the same first block) of another.
    path = write_jsonl(tmp_path / "t.jsonl", [row(0, 1024, 1, [4, 5]), row(0, 700, 1, [4, 5])])
    a, b = load_mooncake(path)
    assert np.array_equal(a.prompt_tokens()[:700], b.prompt_tokens())


def test_tokens_past_the_prompt_are_the_generated_tokens(tmp_path):
    (req,) = load_mooncake(write_jsonl(tmp_path / "t.jsonl", [row(0, 20, 4, [1])]))
    full = req.tokens(24)
    assert np.array_equal(full[:20], req.prompt_tokens())
    assert np.array_equal(full[20:], output_tokens(np.full(4, req.index), np.arange(20, 24)))
    with pytest.raises(ValueError):
        req.tokens(25)


def test_limit_and_blank_lines(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl", [row(0, 10, 1, [1]), "", row(5, 10, 1, [2]), row(9, 3, 1, [3])]
    )
    assert len(load_mooncake(path)) == 3
    assert [r.arrival_ms for r in load_mooncake(path, limit=2)] == [0.0, 5.0]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"timestamp": 1, "input_length": 10, "output_length": 1}), "hash_ids"),
        (json.dumps(row(1, 0, 1, [])), "input_length"),
        (json.dumps(row(-1, 10, 1, [1])), "timestamp"),
        (json.dumps(row(1, 10, -2, [1])), "output_length"),
        (json.dumps(row(1, 10, True, [1])), "output_length"),
        (json.dumps(row(1, 10, 1, [1, 2])), "expected ceil"),
        (json.dumps(row(1, 513, 1, [1])), "expected ceil"),
        (json.dumps(row(1, 10, 1, ["a"])), "hash_ids"),
    ],
)
def test_mooncake_malformed_line_names_its_number(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "t.jsonl", [row(0, 10, 1, [1]), "", bad, row(9, 10, 1, [3])])
    with pytest.raises(ValueError, match=rf"line 3: .*{message}"):
        load_mooncake(path)


def test_embedded_mooncake_trace():
    reqs = load_trace()  # default: the copy shipped in kvnumba/data
    assert default_trace_path().is_file()
    assert len(reqs) == 3993
    assert max(r.prompt_len for r in reqs) == 191_378
    assert all(len(r.hash_ids) == -(-r.prompt_len // MOONCAKE_BLOCK) for r in reqs)
    assert len(load_trace(limit=7)) == 7


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,0"""


def test_azure_fields_and_unique_content(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(AZURE)  # like the real file: no trailing newline
    reqs = load_azure(path)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(374, 44), (396, 109), (879, 0)]
    assert reqs[0].arrival_ms == 0.0
    assert reqs[1].arrival_ms == pytest.approx(4314.579)
    assert reqs[2].arrival_ms == pytest.approx(4541.876)
    assert all(r.hash_ids is None for r in reqs)
    a, b = reqs[0].prompt_tokens(), reqs[1].prompt_tokens()
    assert a.shape == (374,) and a.min() >= 0
    assert np.mean(a[:16] == b[:16]) < 0.2  # nothing shared between requests
    assert len(load_trace(path, limit=2)) == 2


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        ("TIME,Ctx,Gen\n2023-11-16 18:15:46.6805900,374,44", 1),
        (AZURE + "\n2023-11-16 18:15:52.0,12", 5),
        (AZURE + "\n2023-11-16 18:15:52.0,12,x", 5),
        (AZURE + "\nyesterday,12,3", 5),
        (AZURE + "\n2023-11-16 18:15:52.0,0,3", 5),
        (AZURE + "\n2023-11-16 18:15:52.0,10,-3", 5),
    ],
)
def test_azure_malformed_line_names_its_number(tmp_path, text, lineno):
    path = tmp_path / "a.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"line {lineno}: "):
        load_azure(path)


def test_embedded_azure_trace():
    reqs = load_trace(default_trace_path().with_name("AzureLLMInferenceTrace_conv.csv"))
    assert len(reqs) == 19_366
    assert max(r.prompt_len for r in reqs) == 14_050
    assert reqs[-1].arrival_ms == pytest.approx(3_501_721.937)


def test_unknown_extension(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(path)
