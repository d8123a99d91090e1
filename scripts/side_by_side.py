"""Time this checkout against an earlier commit in one process, alternating round by round.

Usage: ``python scripts/side_by_side.py REF [--policies lru,t-lru] [--rounds 10]
[--measures decode,churn,evict,micro]``

The package as it was at ``REF`` (any name ``git`` knows: a commit, a tag, ``HEAD``) is
exported to ``.side_by_side/<commit>/`` and renamed ``kvnumba_ref`` (every word ``kvnumba`` in
its Python files), so that both versions load in one process with their own kernels and numba
cache entries. Each round times every measure of every policy once on each side, the side that
goes first alternating from round to round:

- ``decode``, ``churn``: microseconds per step of W-decode and W-churn (``kvnumba bench``'s
  workloads), the fastest of 3 replays; the replay harness is this checkout's for both sides,
  and the two sides' counters (evictions, hits, final block tables) must agree;
- ``evict``: nanoseconds per eviction, as ``scripts/policy_costs.py`` measures it;
- ``micro``: nanoseconds per block of W-micro at 4,096 blocks per call (one call allocating
  them, one freeing them), the fastest of 3 replays.

The table gives each side's fastest and median round and the ratio of the fastest (this
checkout over ``REF``). Two versions in one process share the machine's moment, so a ratio
holds where separate processes, alternated on a machine whose speed drifts, differ by more
than the change under test; run ``HEAD`` against itself to see the noise that is left.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF_NAME = "kvnumba_ref"
_LABELS = {
    "decode": "W-decode, us/step",
    "churn": "W-churn, us/step",
    "evict": "ns/eviction",
    "micro": "W-micro, ns/block (allocate + free)",
}
_MICRO_BLOCKS = 4096
_WORD = re.compile(r"\bkvnumba\b")


def rename_package(package: Path, new_name: str) -> None:
    """Rename the package at ``package`` (already in its new directory) to ``new_name``.

    Every whole word ``kvnumba`` in its Python files becomes ``new_name``: imports, module
    paths in strings (``importlib.import_module("kvnumba.x")``) and messages alike. Words that
    only start with it (``kvnumba_enabled``) stay.
    """
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        renamed = _WORD.sub(new_name, text)
        if renamed != text:
            path.write_text(renamed, encoding="utf-8")


def export_ref(ref: str, root: Path = ROOT / ".side_by_side") -> Path:
    """The directory holding the package at ``ref`` renamed :data:`REF_NAME`:
    ``root/<commit>/`` (exported once; later runs reuse it and its numba cache entries)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    home = root / commit
    if not (home / REF_NAME / "__init__.py").exists():
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, "kvnumba"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout
        home.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(home, filter="data")
        (home / "kvnumba").rename(home / REF_NAME)
        rename_package(home / REF_NAME, REF_NAME)
    return home


def _prepare(package, policy: bool) -> None:
    """Compile ``package``'s kernels before the first timed call."""
    kernels = importlib.import_module(f"{package.__name__}.kernels")
    if hasattr(kernels, "prepare"):  # older versions compile on first use
        kernels.prepare(stream=sys.stderr, policy=policy)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main() -> None:
    """Print one row per policy and measure: each side's fastest and median, and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit to compare with (HEAD~1, a tag, a hash)")
    parser.add_argument("--policies", default="lru", help="comma-separated (default lru)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (default 10)")
    parser.add_argument(
        "--measures",
        default="decode,churn,evict",
        help="of decode, churn, evict, micro (default decode,churn,evict)",
    )
    args = parser.parse_args()
    measures = args.measures.split(",")
    unknown = set(measures) - set(_LABELS)
    if unknown:
        parser.error(f"unknown measures: {', '.join(sorted(unknown))}")
    policies = args.policies.split(",")

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(export_ref(args.ref)))
    import policy_costs

    import kvnumba

    sides = {"this": kvnumba, "ref": importlib.import_module(REF_NAME)}
    for package in sides.values():
        _prepare(package, policy=policies != ["lru"])

    def once(package, policy: str, measure: str) -> tuple[float, object]:
        if measure == "evict":
            return policy_costs.evict_ns(policy, 3, package.BlockManager), None
        cls = functools.partial(package.BlockManager, eviction=policy)
        if measure == "micro":
            us, counters = policy_costs.step_us(f"micro-{_MICRO_BLOCKS}", cls, 3)
            return us * 1e3 / _MICRO_BLOCKS, counters
        return policy_costs.step_us(measure, cls, 3)

    times: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
        for policy in policies:
            for measure in measures:
                counters = {}
                for side, package in order:
                    t, counters[side] = once(package, policy, measure)
                    times.setdefault((policy, measure, side), []).append(t)
                if counters["this"] != counters["ref"]:
                    raise SystemExit(f"{policy} {measure}: the two versions did different work")
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)

    print(f"| policy | measure | {args.ref} fastest | median | this fastest | median | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for policy in policies:
        for measure in measures:
            ref, this = times[policy, measure, "ref"], times[policy, measure, "this"]
            print(
                f"| {policy} | {_LABELS[measure]} | {min(ref):.2f} | {_median(ref):.2f} "
                f"| {min(this):.2f} | {_median(this):.2f} | {min(this) / min(ref):.3f} |"
            )


if __name__ == "__main__":
    main()
