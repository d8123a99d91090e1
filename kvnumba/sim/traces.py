"""Request traces: parse public LLM serving traces into :class:`Request` records.

Formats (each detected from its first line, :func:`detect_format`; details, sources and
licences in ``kvnumba/data/README.md``):

* ``mooncake``: JSON Lines with ``timestamp`` (ms), ``input_length``, ``output_length`` and
  ``hash_ids`` (kvcache-ai/Mooncake, ``FAST25-release``: the synthetic, conversation and
  tool&agent traces and the earlier arxiv trace all have these four fields);
* ``azure``: CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure/AzurePublicDataset, the
  LLM inference traces 2023 and 2024, code and conversation);
* ``burstgpt``: CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
  (HPMLL/BurstGPT; the later release's extra columns are ignored).

Token ids are never stored: a request carries just enough to regenerate its prompt (and the
tokens it will generate) on demand, because the Mooncake trace holds ~61M prompt tokens in
total (one prompt alone has 191k).

Token content rules (all ids are in ``[0, 2**31)``, so never the manager's "unknown" -1):

* Mooncake: the trace names each 512-token prompt block by a ``hash_id``; two requests with the
  same leading hash ids share that prefix. Token ``j`` of hash block ``h`` is
  ``mix(h, j)``, so equal hash ids give equal tokens at every position and the sharing survives
  any manager block size (16, 48, ...).
* Azure and BurstGPT: no prefix information; every request gets its own content
  ``mix(request, position)`` in a separate domain, so nothing is shared.
* Generated (output) tokens: ``mix(request, position)`` in a third domain, so decode output
  never matches anybody's prompt, yet a preempted request recomputes exactly what it had.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

#: Tokens per ``hash_id`` block in the Mooncake trace.
MOONCAKE_BLOCK = 512

# Domain tags keep the three token families (shared prompt, unique prompt, output) disjoint.
_DOMAIN_MOONCAKE = np.uint64(0x9E3779B97F4A7C15)
_DOMAIN_UNIQUE = np.uint64(0xC2B2AE3D27D4EB4F)
_DOMAIN_OUTPUT = np.uint64(0x165667B19E3779F9)

#: Header of the Azure LLM inference traces (2023 and 2024).
AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]

#: Header of the BurstGPT trace files of release v1.1 (``BurstGPT_1.csv`` ...).
BURSTGPT_HEADER = [
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
]

#: The BurstGPT columns kvnumba reads; a header may hold others, in any order.
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")

#: Values of ``fmt`` of :func:`load_trace` (and of ``kvnumba simulate --trace-format``).
TRACE_FORMATS = ("auto", "mooncake", "azure", "burstgpt")


def _mix(key: np.ndarray, pos: np.ndarray, domain: np.uint64) -> np.ndarray:
    """Deterministic token ids from ``(key, pos)`` pairs (splitmix64 finalizer, vectorized).

    uint64 array arithmetic wraps silently, which is exactly the modular arithmetic we want.
    """
    z = key.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + pos.astype(np.uint64) + domain
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(33)).astype(np.int64)


def output_tokens(request_index: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Token ids a request generates at absolute sequence positions (vectorized).

    Parameters
    ----------
    request_index : numpy.ndarray of int
        :attr:`Request.index` of each token's request.
    position : numpy.ndarray of int
        Absolute position of each token in its sequence (``>= prompt_len``).

    Returns
    -------
    numpy.ndarray of int64
        One token id per input pair.
    """
    return _mix(np.asarray(request_index), np.asarray(position), _DOMAIN_OUTPUT)


@dataclass(frozen=True, eq=False)
class Request:
    """One request of a trace.

    Attributes
    ----------
    index : int
        Position in the trace (0-based); also the key of its unique and generated tokens.
    arrival_ms : float
        Arrival time in milliseconds from the start of the trace.
    prompt_len : int
        Prompt tokens (>= 1).
    output_len : int
        Tokens to generate (>= 0).
    hash_ids : numpy.ndarray of int64 or None
        Mooncake 512-token prompt block ids; ``None`` for traces without prefix information.
    """

    index: int
    arrival_ms: float
    prompt_len: int
    output_len: int
    hash_ids: np.ndarray | None = field(default=None, repr=False)

    def tokens(self, length: int | None = None) -> np.ndarray:
        """Materialize the first ``length`` tokens of this request's full sequence.

        Parameters
        ----------
        length : int, optional
            Tokens wanted, at most ``prompt_len + output_len``; default ``prompt_len``.
            Positions past the prompt are the generated tokens (see :func:`output_tokens`),
            which is what a preempted request recomputes.

        Returns
        -------
        numpy.ndarray of int64, shape (length,)
        """
        length = self.prompt_len if length is None else int(length)
        if not 0 <= length <= self.prompt_len + self.output_len:
            raise ValueError(f"length {length} outside 0..{self.prompt_len + self.output_len}")
        n_prompt = min(length, self.prompt_len)
        pos = np.arange(n_prompt, dtype=np.int64)
        if self.hash_ids is None:
            prompt = _mix(np.full(n_prompt, self.index, dtype=np.int64), pos, _DOMAIN_UNIQUE)
        else:
            keys = self.hash_ids[pos // MOONCAKE_BLOCK]
            prompt = _mix(keys, pos % MOONCAKE_BLOCK, _DOMAIN_MOONCAKE)
        if length == n_prompt:
            return prompt
        out_pos = np.arange(n_prompt, length, dtype=np.int64)
        return np.concatenate([prompt, output_tokens(np.full_like(out_pos, self.index), out_pos)])

    def prompt_tokens(self) -> np.ndarray:
        """The prompt's token ids (int64, ``prompt_len`` of them), computed on demand."""
        return self.tokens(self.prompt_len)


def _bad(path: Path, lineno: int, why: str) -> ValueError:
    return ValueError(f"{path}: line {lineno}: {why}")


_LINE_END = re.compile(r"\r\n|\r|\n")


def _text_lines(path: Path):
    """Yield ``(lineno, line)`` for each line of a UTF-8 text file, without its line end.

    The file is read as bytes and decoded one line at a time, so that a file that is not UTF-8
    text (a binary file, another encoding) is reported with its name and the line where decoding
    failed: a text-mode reader decodes whole chunks ahead of the line being parsed, and its
    ``UnicodeDecodeError`` names neither. A UTF-8 byte-order mark (spreadsheet exports write
    one) is dropped; ``\n``, ``\r\n`` and a lone ``\r`` all end a line (universal newlines).
    """
    lineno = 0
    with path.open("rb") as fh:
        for raw in fh:  # binary files split at b"\n" only; a lone \r is split below
            try:
                text = raw.decode("utf-8-sig" if lineno == 0 else "utf-8")
            except UnicodeDecodeError as exc:
                line = lineno + 1 + raw[: exc.start].count(b"\r")
                raise _bad(
                    path,
                    line,
                    f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); is it a binary file?",
                ) from None
            parts = _LINE_END.split(text)
            if parts[-1] == "":  # the chunk ended with a line end
                parts.pop()
            for part in parts:
                lineno += 1
                yield lineno, part


def _int_field(obj: dict, key: str, lo: int, path: Path, lineno: int) -> int:
    value = obj.get(key)
    # bool is an int subclass; a JSON true is not a length.
    if type(value) is not int or value < lo:
        raise _bad(path, lineno, f"{key!r} must be an integer >= {lo}, got {value!r}")
    return value


def load_mooncake(path: str | Path, limit: int | None = None) -> list[Request]:
    """Parse a Mooncake trace (JSON Lines with ``hash_ids``).

    The format of every trace kvcache-ai/Mooncake publishes under ``FAST25-release``
    (``traces/synthetic_trace.jsonl``, ``traces/conversation_trace.jsonl``,
    ``traces/toolagent_trace.jsonl`` and the earlier ``arxiv-trace/mooncake_trace.jsonl``;
    Qin et al., "Mooncake", USENIX FAST 2025 and arXiv:2407.00079; Apache-2.0): the four fields
    below, shown in ``FAST25-release/README.md``.

    Parameters
    ----------
    path : str or path-like
        One JSON object a line: ``timestamp`` (integer ms from the start of the trace, taken
        as is), ``input_length``, ``output_length``, ``hash_ids`` (``ceil(input_length /
        512)`` ints; equal leading ids are an equal prompt prefix); other keys are ignored.
        Blank lines are ignored; a UTF-8 byte-order mark and CRLF line ends are accepted.
    limit : int, optional
        Stop after this many requests.

    Returns
    -------
    list of Request

    Raises
    ------
    ValueError
        On the first malformed or undecodable line, naming the file and the (1-based) line.
    """
    path = Path(path)
    requests: list[Request] = []
    for lineno, line in _text_lines(path):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _bad(path, lineno, f"invalid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise _bad(path, lineno, "expected a JSON object")
        ts = _int_field(obj, "timestamp", 0, path, lineno)
        n_in = _int_field(obj, "input_length", 1, path, lineno)
        n_out = _int_field(obj, "output_length", 0, path, lineno)
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(type(h) is int and h >= 0 for h in ids):
            raise _bad(path, lineno, "'hash_ids' must be a list of integers >= 0")
        if len(ids) != math.ceil(n_in / MOONCAKE_BLOCK):
            raise _bad(
                path,
                lineno,
                f"{len(ids)} hash_ids for input_length {n_in} "
                f"(expected ceil({n_in}/{MOONCAKE_BLOCK}) = {math.ceil(n_in / MOONCAKE_BLOCK)})",
            )
        requests.append(
            Request(len(requests), float(ts), n_in, n_out, np.asarray(ids, dtype=np.int64))
        )
    return requests


def _header(lines) -> tuple[int, str]:
    """The first non-blank line of a CSV file and its number; ``(1, "")`` if there is none."""
    for lineno, line in lines:
        if line.strip():
            return lineno, line
    return 1, ""


# The Azure traces write wall-clock times: "2023-11-16 18:15:46.6805900" (2023, 7 fractional
# digits) and "2024-05-12 00:00:00.001163+00:00" (2024, 6 digits and a UTC offset; a time on
# the second has no fraction: "2024-05-12 00:00:00+00:00").
_WALL_CLOCK = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?) ?(Z|[+-]\d{2}:?\d{2})?"
)


def _parse_azure_time(text: str) -> np.datetime64:
    """A wall-clock time as UTC nanoseconds; a time without an offset is taken as UTC."""
    m = _WALL_CLOCK.fullmatch(text.strip())
    if m is None:
        raise ValueError("expected YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM]")
    # numpy parses up to 9 fractional digits at ns precision (datetime.fromisoformat on
    # Python 3.10 takes neither 7 digits nor every offset form), but warns on an offset, so
    # the offset is applied here.
    t = np.datetime64(f"{m[1]}T{m[2]}", "ns")
    offset = m[3]
    if offset and offset != "Z":
        minutes = int(offset[1:3]) * 60 + int(offset[-2:])
        t -= np.timedelta64(minutes if offset[0] == "+" else -minutes, "m")
    return t


def load_azure(path: str | Path, limit: int | None = None) -> list[Request]:
    """Parse an Azure LLM inference trace (CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``).

    The format of the Azure LLM inference traces 2023 (``AzureLLMInferenceTrace_code.csv``,
    ``_conv.csv``; Patel et al., "Splitwise", ISCA 2024) and 2024
    (``AzureLLMInferenceTrace_code_1week.csv``, ``_conv_1week.csv``; Stojkovic et al.,
    "DynamoLLM", arXiv:2408.00741), Azure/AzurePublicDataset ``AzureLLMInferenceDataset2023.md``
    and ``AzureLLMInferenceDataset2024.md``, CC-BY-4.0.

    Parameters
    ----------
    path : str or path-like
        CSV with that exact header (blank lines before it are skipped). ``TIMESTAMP`` is wall-clock time,
        ``YYYY-MM-DD HH:MM:SS.fffffff`` (2023) or ``YYYY-MM-DD HH:MM:SS.ffffff+00:00`` (2024; no
        fraction on a whole second); an offset is applied (a time without one is taken as UTC)
        and the times become milliseconds since the first row. ``ContextTokens`` >= 1 is the
        prompt, ``GeneratedTokens`` >= 0 the output (0 is kept: a prefill-only request). Every
        request gets unique prompt content (the traces have no sharing). A UTF-8 byte-order
        mark and CRLF line ends are accepted.
    limit : int, optional
        Stop after this many requests.

    Returns
    -------
    list of Request

    Raises
    ------
    ValueError
        On a wrong header or the first malformed or undecodable row, naming the file and the
        (1-based) line.
    """
    path = Path(path)
    requests: list[Request] = []
    t0: np.datetime64 | None = None
    lines = _text_lines(path)
    head_line, header = _header(lines)
    if [h.strip() for h in header.split(",")] != AZURE_HEADER:
        raise _bad(
            path, head_line, f"expected header {','.join(AZURE_HEADER)!r}, got {header.strip()!r}"
        )
    for lineno, line in lines:
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != 3:
            raise _bad(path, lineno, f"expected 3 comma-separated fields, got {len(parts)}")
        try:
            ts = _parse_azure_time(parts[0])
            n_in, n_out = int(parts[1]), int(parts[2])
        except ValueError as exc:
            raise _bad(path, lineno, f"cannot parse {line.strip()!r} ({exc})") from None
        if n_in < 1 or n_out < 0:
            raise _bad(
                path,
                lineno,
                f"need ContextTokens >= 1 and GeneratedTokens >= 0: {line.strip()!r}",
            )
        if t0 is None:
            t0 = ts
        arrival_ms = (ts - t0) / np.timedelta64(1, "us") / 1000.0
        if arrival_ms < 0:
            raise _bad(path, lineno, f"TIMESTAMP before the first row's: {line.strip()!r}")
        requests.append(Request(len(requests), float(arrival_ms), n_in, n_out))
    return requests


def load_burstgpt(path: str | Path, limit: int | None = None) -> list[Request]:
    """Parse a BurstGPT trace (CSV: ``Timestamp,Model,Request tokens,Response tokens,...``).

    BurstGPT (HPMLL/BurstGPT, ``README.md``: ``BurstGPT_1.csv``, ``BurstGPT_2.csv`` and their
    ``_without_fails`` variants; Wang et al., "BurstGPT: A Real-world Workload Dataset to
    Optimize LLM Serving Systems", arXiv:2401.17644, KDD 2025; CC-BY-4.0) logs ChatGPT and
    GPT-4 requests of an Azure OpenAI service.

    Parameters
    ----------
    path : str or path-like
        CSV whose header (its first non-blank line) names ``Timestamp`` (seconds from 0:00:00 on the trace's first day),
        ``Request tokens`` and ``Response tokens``, in any order; other columns (``Model``,
        ``Total tokens``, ``Log Type``, and ``Session ID``, ``Elapsed time`` of the later
        release) are read past. Times become milliseconds since the earliest request kept.
        Rows with ``Response tokens`` 0 are the trace's failed requests (upstream describes
        the ``_without_fails`` files as the same trace without them) and are skipped, as are
        rows with ``Request tokens`` 0 (no prompt to admit); so a file replays as its
        ``_without_fails`` variant. Every request gets unique prompt content (the trace
        has no prefix information). A UTF-8 byte-order mark and CRLF line ends are accepted.
    limit : int, optional
        Stop after this many requests (skipped rows do not count).

    Returns
    -------
    list of Request

    Raises
    ------
    ValueError
        On a header without the three columns or the first malformed or undecodable row
        (wrong field count, a time that is not a finite number >= 0, a token count that is
        not an integer >= 0), naming the file and the (1-based) line.
    """
    path = Path(path)
    lines = _text_lines(path)
    head_line, header = _header(lines)
    names = [h.strip() for h in header.split(",")]
    missing = [c for c in BURSTGPT_COLUMNS if c not in names]
    if missing:
        raise _bad(
            path,
            head_line,
            f"expected a BurstGPT header ({','.join(BURSTGPT_HEADER)!r}), missing "
            f"{', '.join(missing)}: got {header.strip()!r}",
        )
    i_ts, i_in, i_out = (names.index(c) for c in BURSTGPT_COLUMNS)
    times: list[float] = []
    lengths: list[tuple[int, int]] = []
    for lineno, line in lines:
        if limit is not None and len(times) >= limit:
            break
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != len(names):
            raise _bad(
                path, lineno, f"expected {len(names)} comma-separated fields, got {len(parts)}"
            )
        try:
            ts = float(parts[i_ts])
            n_in, n_out = int(parts[i_in]), int(parts[i_out])
        except ValueError as exc:
            raise _bad(path, lineno, f"cannot parse {line.strip()!r} ({exc})") from None
        if not (math.isfinite(ts) and ts >= 0) or n_in < 0 or n_out < 0:
            raise _bad(
                path,
                lineno,
                "need Timestamp >= 0 (seconds), Request tokens >= 0 and Response tokens >= 0: "
                f"{line.strip()!r}",
            )
        if n_in == 0 or n_out == 0:  # a failed request, or nothing to admit
            continue
        times.append(ts)
        lengths.append((n_in, n_out))
    t0 = min(times, default=0.0)
    return [
        Request(i, (ts - t0) * 1000.0, n_in, n_out)
        for i, (ts, (n_in, n_out)) in enumerate(zip(times, lengths, strict=True))
    ]


def default_trace_path() -> Path:
    """Path of the Mooncake synthetic trace shipped inside the package (``kvnumba/data``)."""
    return Path(str(resources.files("kvnumba") / "data" / "mooncake_synthetic_trace.jsonl"))


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its first non-blank line.

    A line that starts with ``{`` is a Mooncake JSON object; otherwise the line must be the
    header of an Azure (exactly :data:`AZURE_HEADER`) or a BurstGPT CSV (holding the columns
    :data:`BURSTGPT_COLUMNS`). The file name's suffix plays no part.

    Parameters
    ----------
    path : str or path-like
        The trace file.

    Returns
    -------
    str
        ``"mooncake"``, ``"azure"`` or ``"burstgpt"``; ``"mooncake"`` for a file with no
        non-blank line (it holds no requests in any format).

    Raises
    ------
    ValueError
        A first line of no known format (naming the file and the line), or a file that is
        not UTF-8 text.
    OSError
        The file cannot be read.
    """
    path = Path(path)
    for lineno, line in _text_lines(path):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            return "mooncake"
        names = [h.strip() for h in text.split(",")]
        if names == AZURE_HEADER:
            return "azure"
        if all(c in names for c in BURSTGPT_COLUMNS):
            return "burstgpt"
        raise _bad(
            path,
            lineno,
            "unknown trace format: expected a Mooncake JSON object or the header of an Azure "
            f"({','.join(AZURE_HEADER)}) or a BurstGPT CSV ({','.join(BURSTGPT_HEADER)}), got "
            f"{text[:120]!r} (or pass the format: --trace-format / fmt=)",
        )
    return "mooncake"


_LOADERS = {"mooncake": load_mooncake, "azure": load_azure, "burstgpt": load_burstgpt}


def load_trace(
    path: str | Path | None = None, limit: int | None = None, *, fmt: str = "auto"
) -> list[Request]:
    """Load a trace in any supported format.

    Parameters
    ----------
    path : str or path-like, optional
        A Mooncake JSONL, Azure CSV or BurstGPT CSV file, whatever its suffix; default: the
        embedded Mooncake trace.
    limit : int, optional
        Keep only the first ``limit`` requests.
    fmt : {"auto", "mooncake", "azure", "burstgpt"}, optional
        The format; ``"auto"`` (the default) detects it from the first line
        (:func:`detect_format`).

    Returns
    -------
    list of Request

    Raises
    ------
    ValueError
        An unknown ``fmt``, a first line of no known format, or a malformed line (with its
        line number).
    OSError
        The file cannot be read.
    """
    path = default_trace_path() if path is None else Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    loader = _LOADERS.get(fmt)
    if loader is None:
        raise ValueError(
            f"unknown trace format {fmt!r} (expected one of {', '.join(TRACE_FORMATS)})"
        )
    return loader(path, limit)
