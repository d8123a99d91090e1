"""The ``kvnumba`` command: ``simulate``, ``sweep``, ``bench`` and ``compile``."""

from __future__ import annotations

import sys

USAGE = """usage: kvnumba {simulate,sweep,bench,compile} [options]

  simulate   replay a serving trace through the block manager (default: embedded Mooncake trace)
  sweep      run a grid of simulations (traces x pool sizes x ...) on Dask, tabulate and plot
  bench      run the standard workloads against kvnumba and the pure-Python reference
  compile    compile the kernels ahead of time into numba's cache (for images and CI)

Run 'kvnumba COMMAND --help' for the options of one command."""

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvnumba`` console script.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        Process exit code; 130 when interrupted by Ctrl-C.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command == "simulate":
            from kvnumba.sim.cli import main as simulate_main

            return simulate_main(rest)
        if command == "sweep":
            from kvnumba.sim.sweep_cli import main as sweep_main

            return sweep_main(rest)
        if command == "bench":
            from kvnumba.bench.cli import main as bench_main

            return bench_main(rest)
        if command == "compile":
            return _compile(rest)
    except BaseException as exc:
        from kvnumba.sim.cli import interrupted

        if not interrupted(exc):
            raise
        # The commands report their own interruption; this catches Ctrl-C anywhere else
        # (while numba loads, in bench): one line and status 130, never a traceback.
        print(f"kvnumba {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"kvnumba: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def _compile(args: list[str]) -> int:
    """``kvnumba compile``: compile (or load) the kernels, printing CPU seconds per kernel."""
    import argparse
    import time

    parser = argparse.ArgumentParser(
        prog="kvnumba compile",
        description="Compile kvnumba's kernels ahead of time into numba's cache (for images "
        "and CI): every kernel, or with --engine only those an engine's KV cache manager uses "
        "(kvnumba.integrations.vllm).",
    )
    parser.add_argument(
        "--engine", action="store_true", help="only the kernels an engine's manager uses"
    )
    parser.add_argument(
        "--group",
        type=int,
        help="with --engine: only group I of the engine kernels (kvnumba.kernels.ENGINE_GROUPS; "
        "the groups compile in parallel in separate processes)",
    )
    parser.add_argument(
        "--policies",
        action="store_true",
        help="also the extended versions, for the eviction policies other than LRU and for "
        "windowed attention (one compile serves them all; docs/eviction.md, docs/windows.md)",
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    options = parser.parse_args(args)

    from kvnumba.integrations.vllm.precompile import NUM_GROUPS, compile_lock

    groups = list(range(NUM_GROUPS))
    if options.group is not None and (not options.engine or options.group not in groups):
        parser.error(f"--group needs --engine and one of {groups}")
    if options.group is not None:
        groups = [options.group]

    def progress(name, seconds):
        if not options.quiet:
            print(f"{name:22s} {seconds:6.1f} s", flush=True)

    # One compile of a group at a time per cache: a vLLM start may launch this from several
    # processes. The lock comes first, before numba loads, so that a waiter never finds a
    # group unlocked and uncompiled while its compiler is still starting.
    with compile_lock(groups):
        start = time.process_time()
        from kvnumba import kernels

        kernels.notice_given()  # this command is the ahead-of-time compile: no hint to run it
        names = kernels.ENGINE if options.engine else kernels.LRU
        if options.group is not None:
            names = kernels.ENGINE_GROUPS[options.group]
        later = [n for n in names if n in kernels.ENGINE_AFTER] if options.group is not None else []
        kernels.compile_all([n for n in names if n not in later], progress=progress)
    # Kernels whose worker another group compiles: once that group's lock frees (taken with
    # this group's again, in increasing order, so no two holders wait for each other).
    for name in later:
        with compile_lock(groups, shared=[kernels.ENGINE_AFTER[name]]):
            kernels.compile_all([name], progress=progress)
    if options.policies:
        policy_names = kernels.ENGINE_GROUPED if options.engine else kernels.POLICY
        kernels.compile_all(policy_names, progress=progress, policy=True)
    if not options.quiet:
        what = "engine kernels" if options.engine else "all kernels"
        print(f"{what}: {time.process_time() - start:.1f} s of CPU")
    return 0
