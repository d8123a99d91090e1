"""``scripts/side_by_side.py`` loads an earlier version of the package next to this one.

Its timings are not tested (speed is the benchmarks' business); what is tested is that the
earlier version it times is the package as committed, renamed so that nothing of it resolves
to this checkout's ``kvnumba``.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "side_by_side", ROOT / "scripts" / "side_by_side.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_renaming_takes_every_whole_word_and_nothing_else(tmp_path):
    package = tmp_path / "kvnumba_ref"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import kvnumba\nfrom kvnumba.sub import thing\nNAME = 'kvnumba.priority'\n"
    )
    (package / "sub" / "__init__.py").write_text(
        "from kvnumba import x as kvnumba_enabled\nmykvnumba = 'kvnumba: compiling'\n"
    )
    (package / "data.csv").write_text("kvnumba\n")  # not Python: left as it is
    _script().rename_package(package, "kvnumba_ref")
    assert (package / "__init__.py").read_text() == (
        "import kvnumba_ref\nfrom kvnumba_ref.sub import thing\nNAME = 'kvnumba_ref.priority'\n"
    )
    assert (package / "sub" / "__init__.py").read_text() == (
        "from kvnumba_ref import x as kvnumba_enabled\nmykvnumba = 'kvnumba_ref: compiling'\n"
    )
    assert (package / "data.csv").read_text() == "kvnumba\n"


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_the_exported_version_is_the_committed_package_under_another_name(tmp_path):
    script = _script()
    home = script.export_ref("HEAD", root=tmp_path)
    package = home / script.REF_NAME
    committed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "HEAD", "kvnumba"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    exported = sorted(
        str(Path("kvnumba") / p.relative_to(package)) for p in package.rglob("*") if p.is_file()
    )
    assert exported == sorted(committed)
    for path in package.rglob("*.py"):
        assert not re.search(r"\bkvnumba\b", path.read_text()), path
    # The renamed package imports on its own: every module it loads is its own.
    code = (
        "import sys, kvnumba_ref, kvnumba_ref.kernels, kvnumba_ref.bench.runner;"
        "assert not any(m == 'kvnumba' or m.startswith('kvnumba.') for m in sys.modules);"
        "print(kvnumba_ref.BlockManager.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=home, check=True, capture_output=True, text=True
    )
    assert out.stdout.strip() == "kvnumba_ref.manager"
    # A second export reuses the first.
    assert script.export_ref("HEAD", root=tmp_path) == home
