"""Trace parsing: Mooncake JSONL, Azure and BurstGPT CSV, format detection, token expansion,
malformed input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvnumba.sim.cli import main as simulate_main
from kvnumba.sim.traces import (
    MOONCAKE_BLOCK,
    TRACE_FORMATS,
    default_trace_path,
    detect_format,
    load_azure,
    load_burstgpt,
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


# --- Azure LLM inference trace 2024 (and 2023 code) --------------------------------------

# The 2024 files write six fractional digits and a UTC offset, and no fraction on a whole
# second (the form quoted in AzurePublicDataset's analysis notebook of the 2024 traces).
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-12 00:00:00+00:00,1452,3
2024-05-12 00:00:00.041683+00:00,584,3
2024-05-12 00:00:01.157988+00:00,862,38
"""

# The 2023 code trace: the conversation trace's form (seven fractional digits, no offset).
AZURE_2023_CODE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8"""


def test_azure_2024_timestamps_with_offset_and_without_fraction(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv_1week.csv"
    path.write_text(AZURE_2024)
    assert detect_format(path) == "azure"
    reqs = load_trace(path)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(1452, 3), (584, 3), (862, 38)]
    assert [r.arrival_ms for r in reqs] == pytest.approx([0.0, 41.683, 1157.988])
    assert all(r.hash_ids is None for r in reqs)
    code = tmp_path / "AzureLLMInferenceTrace_code.csv"
    code.write_text(AZURE_2023_CODE)
    assert [r.arrival_ms for r in load_trace(code)] == pytest.approx([0.0, 52.0])


def test_azure_offsets_are_applied(tmp_path):
    # 01:00:00.5+01:00 is 00:00:00.5 UTC; a time without an offset is taken as UTC.
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-12 00:00:00+00:00,10,1\n"
        "2024-05-12 01:00:00.5+01:00,10,1\n"
        "2024-05-11 23:00:01-01:00,10,1\n"
        "2024-05-12T00:00:02Z,10,1\n"
        "2024-05-12 00:00:03.123456789,10,1\n"
    )
    assert [r.arrival_ms for r in load_azure(path)] == pytest.approx(
        [0.0, 500.0, 1000.0, 2000.0, 3123.456789]
    )


@pytest.mark.parametrize(
    "row",
    [
        "2024-05-12 00:00:01+0000x,10,1",  # trailing text after the offset
        "2024-05-12 00:00:01 UTC,10,1",  # a zone name, not an offset
        "2024-13-12 00:00:01+00:00,10,1",  # month 13
        "2024-05-12,10,1",  # a date without a time
        "2024-05-11 23:59:59+00:00,10,1",  # before the first row
        "2024-05-12 00:00:01+00:00,0,1",  # no prompt
    ],
)
def test_azure_2024_malformed_row_names_file_and_line(tmp_path, row):
    path = tmp_path / "a.csv"
    path.write_text(AZURE_2024 + row + "\n")
    with pytest.raises(ValueError, match=r"a\.csv: line 5: "):
        load_trace(path)


# --- BurstGPT ----------------------------------------------------------------------------

# The first rows of BurstGPT_1.csv (release v1.1), with a failed request (0 response tokens)
# and an empty one (no tokens at all), as the file has them.
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
118,GPT-4,417,276,693,Conversation log
1106,ChatGPT,0,0,0,Conversation log
1129,ChatGPT,1305,0,1305,API log
1278,ChatGPT,17,382,399,API log
"""


def test_burstgpt_fields_seconds_and_failures(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    assert detect_format(path) == "burstgpt"
    reqs = load_trace(path)
    # Failures (0 response tokens) and empty rows are skipped; times are ms since the first.
    assert [(r.index, r.prompt_len, r.output_len) for r in reqs] == [
        (0, 472, 18),
        (1, 1087, 230),
        (2, 417, 276),
        (3, 17, 382),
    ]
    assert [r.arrival_ms for r in reqs] == [0.0, 40_000.0, 113_000.0, 1_273_000.0]
    assert all(r.hash_ids is None for r in reqs)
    a, b = reqs[0].prompt_tokens(), reqs[1].prompt_tokens()
    assert a.shape == (472,) and a.min() >= 0 and np.mean(a[:16] == b[:16]) < 0.2
    # limit counts the requests kept, not the rows read.
    assert [r.prompt_len for r in load_burstgpt(path, limit=4)] == [472, 1087, 417, 17]
    # The same trace without its failures replays the same requests.
    clean = tmp_path / "BurstGPT_without_fails_1.csv"
    clean.write_text("\n".join(x for x in BURSTGPT.splitlines() if ",0," not in x))
    assert [(r.arrival_ms, r.prompt_len, r.output_len) for r in load_trace(clean)] == [
        (r.arrival_ms, r.prompt_len, r.output_len) for r in reqs
    ]


def test_burstgpt_columns_by_name_float_times_and_crlf(tmp_path):
    # The later release adds Session ID and Elapsed time; columns are found by name.
    path = tmp_path / "BurstGPT_3.csv"
    path.write_bytes(
        b"\xef\xbb\xbfTimestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
        b"Total tokens,Log Type\r\n"
        b"10.5,a1b2,3,GPT-4,100,20,120,Conversation log\r\n"
        b"12,,0,ChatGPT,50,5,55,API log\r\n"
    )
    reqs = load_trace(path)
    assert [(r.arrival_ms, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 100, 20),
        (1500.0, 50, 5),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("7,ChatGPT,10,2,12", "expected 6 comma-separated fields"),
        ("7,ChatGPT,ten,2,12,API log", "cannot parse"),
        ("7,ChatGPT,10,2.5,12,API log", "cannot parse"),
        ("-1,ChatGPT,10,2,12,API log", "Timestamp >= 0"),
        ("nan,ChatGPT,10,2,12,API log", "Timestamp >= 0"),
        ("7,ChatGPT,-10,2,12,API log", "Request tokens >= 0"),
    ],
)
def test_burstgpt_malformed_row_names_file_and_line(tmp_path, row, message):
    path = tmp_path / "b.csv"
    path.write_text(BURSTGPT + "\n" + row + "\n")  # a blank line 8, the bad row on line 9
    with pytest.raises(ValueError, match=rf"b\.csv: line 9: .*{message}"):
        load_trace(path)


def test_burstgpt_header_without_a_needed_column(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Total tokens\n5,ChatGPT,472,490\n")
    with pytest.raises(ValueError, match=r"b\.csv: line 1: unknown trace format"):
        load_trace(path)
    with pytest.raises(ValueError, match=r"b\.csv: line 1: .*missing Response tokens"):
        load_trace(path, fmt="burstgpt")


# --- Mooncake's other traces -------------------------------------------------------------

# Rows as kvcache-ai/Mooncake's FAST25-release/traces/conversation_trace.jsonl starts (every
# request opens with the shared block 0) and as the arxiv trace has them (two requests
# sharing 12 blocks): the same four fields as the synthetic trace.
CONVERSATION = [
    row(0, 6758, 500, list(range(14))),
    row(0, 2290, 316, [0, 42, 43, 44, 45]),
    row(3000, 915, 355, [0, 462]),
]
ARXIV = [
    row(27482, 6955, 52, [*range(46, 58), 2353, 2354]),
    row(30535, 6472, 26, [*range(46, 58), 2366]),
]


@pytest.mark.parametrize("rows", [CONVERSATION, ARXIV])
def test_other_mooncake_traces_load_with_their_prefixes(tmp_path, rows):
    path = write_jsonl(tmp_path / "trace.txt", rows)  # detected from the content, not the name
    assert detect_format(path) == "mooncake"
    reqs = load_trace(path)
    assert [r.arrival_ms for r in reqs] == [float(r["timestamp"]) for r in rows]
    assert [r.hash_ids.tolist() for r in reqs] == [r["hash_ids"] for r in rows]
    a, b = reqs[0].prompt_tokens(), reqs[1].prompt_tokens()
    shared = 1 if rows is CONVERSATION else 12
    n = shared * MOONCAKE_BLOCK
    assert np.array_equal(a[:n], b[:n]) and not np.array_equal(a[n : n + 16], b[n : n + 16])


def test_mooncake_extra_keys_are_ignored(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{**row(5, 10, 1, [3]), "session_id": "s0"}])
    (req,) = load_trace(path)
    assert (req.arrival_ms, req.prompt_len, req.hash_ids.tolist()) == (5.0, 10, [3])


# --- detection and the explicit format ---------------------------------------------------


def test_detection_reads_the_first_non_blank_line(tmp_path):
    burst = tmp_path / "burst.jsonl"  # a misleading suffix
    burst.write_text("\n" + BURSTGPT)
    assert detect_format(burst) == "burstgpt" and len(load_trace(burst)) == 4
    unknown = tmp_path / "u.csv"
    unknown.write_text("\n\ntime,prompt,output\n1,2,3\n")
    with pytest.raises(ValueError, match=r"u\.csv: line 3: unknown trace format"):
        detect_format(unknown)
    empty = tmp_path / "empty.csv"
    empty.write_text("\n")
    assert load_trace(empty) == []


def test_explicit_format_overrides_detection(tmp_path):
    assert TRACE_FORMATS == ("auto", "mooncake", "azure", "burstgpt")
    burst = tmp_path / "b.csv"
    burst.write_text(BURSTGPT)
    azure = tmp_path / "a.csv"
    azure.write_text(AZURE_2024)
    assert len(load_trace(burst, fmt="burstgpt")) == 4
    assert len(load_trace(azure, fmt="azure", limit=2)) == 2
    with pytest.raises(ValueError, match=r"b\.csv: line 1: expected header 'TIMESTAMP"):
        load_trace(burst, fmt="azure")
    with pytest.raises(ValueError, match=r"a\.csv: line 1: expected a BurstGPT header"):
        load_trace(azure, fmt="burstgpt")
    with pytest.raises(ValueError, match=r"a\.csv: line 1: invalid JSON"):
        load_trace(azure, fmt="mooncake")
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(azure, fmt="parquet")


def test_simulate_burstgpt_file_and_trace_format_flag(tmp_path, capsys):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    assert simulate_main(["--trace", str(path), "--blocks", "256", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["trace_format"] == "burstgpt" and doc["config"]["blocks"] == 256
    assert doc["results"]["requests"] == 4 and doc["results"]["served"] == 4
    assert doc["results"]["ideal_prefix_hit_rate"] is None  # no hash_ids: nothing shared
    argv = ["--trace", str(path), "--blocks", "256", "--trace-format"]
    assert simulate_main([*argv, "azure"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 1: expected header" in err and "Traceback" not in err
    assert simulate_main([*argv, "burstgpt", "--json", "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["served"] == 2
    assert simulate_main([*argv, "csv"]) == 2
    assert "invalid choice" in capsys.readouterr().err
