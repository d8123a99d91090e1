"""Request traces: parse the Mooncake JSONL and Azure CSV formats into :class:`Request` records.

Token ids are never stored: a request carries just enough to regenerate its prompt (and the
tokens it will generate) on demand, because the Mooncake trace holds ~61M prompt tokens in
total (one prompt alone has 191k).

Token content rules (all ids are in ``[0, 2**31)``, so never the manager's "unknown" -1):

* Mooncake: the trace names each 512-token prompt block by a ``hash_id``; two requests with the
  same leading hash ids share that prefix. Token ``j`` of hash block ``h`` is
  ``mix(h, j)``, so equal hash ids give equal tokens at every position and the sharing survives
  any manager block size (16, 48, ...).
* Azure: no prefix information; every request gets its own content ``mix(request, position)``
  in a separate domain, so nothing is shared.
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

AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


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

    Parameters
    ----------
    path : str or path-like
        One JSON object a line: ``timestamp`` (ms), ``input_length``, ``output_length``,
        ``hash_ids`` (``ceil(input_length / 512)`` ints). Blank lines are ignored; a UTF-8
        byte-order mark and CRLF line ends are accepted.
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


def _parse_azure_time(text: str) -> np.datetime64:
    # numpy parses "YYYY-MM-DD HH:MM:SS.fffffff" (7 fractional digits) at ns precision;
    # datetime.fromisoformat on Python 3.10 does not.
    return np.datetime64(text.strip().replace(" ", "T"), "ns")


def load_azure(path: str | Path, limit: int | None = None) -> list[Request]:
    """Parse an Azure LLM inference trace (CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Parameters
    ----------
    path : str or path-like
        CSV with that exact header; timestamps are wall-clock and become milliseconds since
        the first row. Every request gets unique prompt content (the trace has no sharing).
        A UTF-8 byte-order mark and CRLF line ends are accepted.
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
    _, header = next(lines, (1, ""))
    if [h.strip() for h in header.split(",")] != AZURE_HEADER:
        raise _bad(path, 1, f"expected header {','.join(AZURE_HEADER)!r}, got {header.strip()!r}")
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
        if np.isnat(ts) or n_in < 1 or n_out < 0:
            raise _bad(
                path,
                lineno,
                f"need a timestamp, ContextTokens >= 1, GeneratedTokens >= 0: {line.strip()!r}",
            )
        if t0 is None:
            t0 = ts
        arrival_ms = (ts - t0) / np.timedelta64(1, "us") / 1000.0
        requests.append(Request(len(requests), float(arrival_ms), n_in, n_out))
    return requests


def default_trace_path() -> Path:
    """Path of the Mooncake synthetic trace shipped inside the package (``kvnumba/data``)."""
    return Path(str(resources.files("kvnumba") / "data" / "mooncake_synthetic_trace.jsonl"))


def load_trace(path: str | Path | None = None, limit: int | None = None) -> list[Request]:
    """Load a trace, choosing the parser by file extension.

    Parameters
    ----------
    path : str or path-like, optional
        ``.jsonl`` (Mooncake) or ``.csv`` (Azure); default: the embedded Mooncake trace.
    limit : int, optional
        Keep only the first ``limit`` requests.

    Returns
    -------
    list of Request

    Raises
    ------
    ValueError
        Unknown extension or a malformed line (with its line number).
    OSError
        The file cannot be read.
    """
    path = default_trace_path() if path is None else Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return load_mooncake(path, limit)
    if suffix == ".csv":
        return load_azure(path, limit)
    raise ValueError(f"{path}: unknown trace format {suffix!r} (expected .jsonl or .csv)")
