"""No tracked file names a path outside the repository.

A checkout must work wherever it is cloned: code, tests, scripts, CI and documentation may name
files of the repository (relative paths) and of the installed package, but no absolute path of
one machine, no folder beside the checkout and no notes that live only there. What counts as
such a reference, and why a per-user cache (``~/.cache/...``) does not, is documented in
``outside_paths.py``.

The files are those ``git ls-files`` lists (skipped, with the reason, where git or a git
checkout of this repository is missing), read as text. Left out:

- files that are not UTF-8 text (binary files);
- the data files of ``kvnumba/data`` (``*.csv``, ``*.jsonl``): trace rows, not prose or code
  (the folder's ``README.md`` is checked);
- the outputs of notebook cells: they hold what one run printed (e.g. the temporary folder a
  sweep wrote to) and are rewritten by every run; every cell's source is checked;
- the two files that spell out the forms searched for, ``outside_paths.py`` (the patterns)
  and this file (examples of each form).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from outside_paths import outside_references

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = (".csv", ".jsonl")
SELF = {"tests/outside_paths.py", "tests/test_repository_paths.py"}


def _tracked_files() -> list[str]:
    """Repository-relative paths of the tracked files, or skip the test."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    top = subprocess.run(
        [git, "-C", str(ROOT), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
        pytest.skip(f"{ROOT} is not the top of a git checkout: cannot list the tracked files")
    listed = subprocess.run(
        [git, "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    return sorted(p for p in listed.decode("utf-8").split("\0") if p)


def _texts(path: str) -> list[tuple[str, str]]:
    """``(where, text)`` pieces of a tracked file to search; none for files left out."""
    file = ROOT / path
    if path in SELF or not file.is_file():
        return []
    if path.startswith("kvnumba/data/") and path.endswith(DATA_SUFFIXES):
        return []
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return []
    if "\0" in text:
        return []
    if path.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        return [(f"{path} cell {i}", "".join(c["source"])) for i, c in enumerate(cells)]
    return [(path, text)]


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = _tracked_files()
    hits = []
    searched = 0
    for path in files:
        for where, text in _texts(path):
            searched += 1
            for number, rule, line in outside_references(text, where=path):
                hits.append(f"{where}:{number}: [{rule}] {line[:160]}")
    assert searched > 50  # the listing worked: the package, tests and docs were searched
    assert not hits, "names outside the repository:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("where", "text", "rule"),
    [
        ("benchmarks/x.py", 'DEFAULT = "/work/shared/traces/t.jsonl"', "absolute"),
        ("tests/x.py", "# notes: /home/someone/notes.md", "absolute"),
        ("x.md", "see /root/cache and /tmp/b.json", "absolute"),
        ("x.md", "file:///home/me/trace.jsonl", "absolute"),
        ("x.md", "/Users/me/kvnumba", "absolute"),
        ("x.py", r'TRACE = "C:\\data\\t.jsonl"', "absolute"),
        ("x.md", "cp ~/notes/spec.md .", "home"),
        ("x.sh", 'OUT="$HOME/results"', "home"),
        ("x.sh", 'OUT="${HOME}/results"', "home"),
        ("x.md", "recipe: shared/vllm-cpu-tests.md", "shared"),
        ("tests/x.py", 'p = Path(__file__).parents[1].parent / "shared" / "bench"', "shared"),
        ("README.md", "when ../shared/bench sits beside the checkout", "shared"),
        ("x.md", "the workloads of SPEC.md and WORKLOADS.md", "notes"),
        ("tests/x.py", "import gen_trace", "notes"),
        ("tests/x.py", 'open("../../elsewhere/file")', "parent"),
        ("README.md", "see ../sibling/README.md", "parent"),
    ],
)
def test_outside_references_are_found(where, text, rule):
    assert rule in {r for _, r, _ in outside_references(text, where=where)}


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("scripts/vllm_env.sh", "CACHE=${KVNUMBA_VLLM_CACHE:-$HOME/.cache/kvnumba-vllm}"),
        (".ci/run", "# downloads into ~/.cache/kvnumba-vllm"),
        ("tests/x.py", 'shm = "/dev/shm" if os.path.isdir("/dev/shm") else None'),
        ("x.md", "https://example.org/home/work/tmp/index.html"),
        ("x.py", 'files("kvnumba") / "data" / "mooncake_synthetic_trace.jsonl"'),
        ("x.py", "kvnumba/data/README.md, docs/workloads.md, benchmarks/vllm_bench.py"),
        ("docs/x.md", "[the README](../README.md)"),
        ("tests/x.py", 'BAD_NAMES = ["a/b", "../x", ".."]'),
        (".ci/run", 'cd "$(dirname "$0")/.."'),
        ("x.py", "shared_prefix = not_shared/2  # a shared pool, PagePool.shared(name)"),
        ("x.py", "def gen_traces(): workloads.to_trace()"),
    ],
)
def test_paths_inside_the_repository_and_caches_are_not_references(where, text):
    assert outside_references(text, where=where) == []
