"""Run the README's quick start with a given Python, from a folder outside the checkout, and
check that it prints what the README says it prints.

    python3 scripts/readme_quickstart.py PYTHON

Used by ``scripts/check_package.sh`` (the wheel in a clean venv) and ``scripts/check_bounds.sh``
(the oldest and the newest versions allowed). Exits non-zero if the quick start fails or its
output differs from the README's account of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

#: What the README says the quick start prints: the copy pairs, then the cached tokens and a
#: prefix hit in the stats.
EXPECTED = (
    re.compile(r"^\[1 1 1\] \[3 4 5\]", re.M),
    re.compile(r"^\[16\] .*prefix_hits=1", re.M),
)


def quick_start_code(readme: Path = README) -> str:
    """The first ``python`` code block after the README's "## Quick start" heading."""
    section = readme.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    if match is None:
        raise SystemExit("README.md: no python block under '## Quick start'")
    return match.group(1)


def main(argv: list[str]) -> int:
    """Run the quick start with ``argv[0]`` (default: this Python); 0 if its output is right."""
    python = argv[0] if argv else sys.executable
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "quickstart.py"
        script.write_text(quick_start_code(), encoding="utf-8")
        run = subprocess.run(
            [python, str(script)], cwd=work, capture_output=True, text=True, check=False
        )
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        return run.returncode
    missing = [p.pattern for p in EXPECTED if not p.search(run.stdout)]
    if missing:
        print(f"the quick start's output lacks {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
