"""How long a vLLM user waits for kvnumba's kernels when an engine starts.

Run inside the cached vLLM 0.32.0 CPU environment (numba 0.65.0, vLLM's pin):
``scripts/vllm_env.sh --vllm 0.32.0 first-start``. Each case starts ``vllm.LLM`` on the tiny
random-weight Llama of ``scripts/vllm_e2e.py`` in a fresh process, then generates one short
request, and reports:

- ``ready``: seconds from the process start to the engine built (wall);
- ``kvnumba wait``: wall seconds the manager's construction spent waiting for a background
  compile plus compiling (in the engine's process and in the child processes it starts for the
  other groups of kernels): what the user waits for because of kvnumba;
- ``compile CPU``: CPU seconds of the compile in the engine's process, and of the child
  processes (the plugin's or the manager's);
- ``first request``: seconds of the first ``generate`` (a kernel compiled there would show).

Cases: vLLM's own manager (the reference), kvnumba on an empty numba cache without and with the
background compile (``KVNUMBA_VLLM_PRECOMPILE``), and kvnumba on the cache the cold start left
(the warm start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "scripts" / "vllm_e2e.py"

CASES = {
    "vllm": {"manager": "vllm", "cache": "fresh", "precompile": "0"},
    "kvnumba cold": {"manager": "kvnumba", "cache": "fresh", "precompile": "0"},
    "kvnumba cold + background compile": {
        "manager": "kvnumba",
        "cache": "fresh",
        "precompile": "1",
    },
    "kvnumba warm": {"manager": "kvnumba", "cache": "kept", "precompile": "0"},
}


def _e2e():
    """``scripts/vllm_e2e.py`` as a module (its model and engine settings)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_e2e", E2E)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(manager: str, model_dir: Path, out: Path) -> None:
    """One engine start in this process; writes its measurements to ``out``."""
    start_wall = time.perf_counter()
    e2e = _e2e()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {} if manager == "vllm" else {"scheduler_cls": e2e.SCHEDULERS["kvnumba"]}
    llm = LLM(**e2e.llm_settings(model_dir, quick=True), **kwargs)
    ready = time.perf_counter() - start_wall
    t = time.perf_counter()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 70)))], params, use_tqdm=False)
    first = time.perf_counter() - t
    result = {"ready_s": ready, "first_request_s": first}
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    result["manager"] = type(sched.kv_cache_manager).__qualname__
    if manager != "vllm":
        from kvnumba.integrations.vllm import precompile

        precompile.wait_for_compile()  # the children's CPU counts once they are waited for
        result.update(precompile.report)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["children_cpu_s"] = usage.ru_utime + usage.ru_stime
    out.write_text(json.dumps(result))


def run_case(name: str, case: dict, model_dir: Path, cache: Path) -> dict:
    """Start one engine in a fresh process with the case's cache and setting."""
    if case["cache"] == "fresh":
        shutil.rmtree(cache, ignore_errors=True)
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(cache),
        "KVNUMBA_VLLM_PRECOMPILE": case["precompile"],
        # The engine core in this process, so that its scheduler can be read (as in vllm_e2e).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--worker", case["manager"], "--model-dir", str(model_dir)]
    proc = subprocess.run(
        [*cmd, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout.decode()[-4000:])
        raise SystemExit(f"vllm-first-start: case {name!r} failed")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main(argv: list[str] | None = None) -> int:
    """Run every case (or ``--cases``) and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--worker", choices=("vllm", "kvnumba"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.model_dir, args.out)
        return 0
    _e2e().make_model(args.model_dir)
    from importlib.metadata import entry_points

    if not any(
        ep.name == "kvnumba_precompile" for ep in entry_points(group="vllm.general_plugins")
    ):
        raise SystemExit("vllm-first-start: kvnumba is not installed here (no vLLM plugin entry)")
    import numba

    cache = Path(tempfile.mkdtemp(prefix="kvnumba-first-start-"))
    print(f"numba {numba.__version__}, {os.cpu_count()} CPUs")
    print("| case | ready | kvnumba wait | compile CPU (engine / background) | first request |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.cases.split(","):
        r = run_case(name, CASES[name], args.model_dir, cache)
        wait = r.get("waited_s", 0.0) + r.get("compile_wall_s", 0.0)
        compile_cpu = (
            f"{r.get('compile_cpu_s', 0.0):.1f} s / {r['children_cpu_s']:.1f} s"
            if name != "vllm"
            else "-"
        )
        print(
            f"| {name} | {r['ready_s']:.1f} s | {wait:.1f} s | {compile_cpu} | "
            f"{r['first_request_s']:.2f} s |",
            flush=True,
        )
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
