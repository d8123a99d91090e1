"""The ``kvnumba`` command: ``kvnumba simulate ...`` and ``kvnumba bench ...``."""

from __future__ import annotations

import sys

USAGE = """usage: kvnumba {simulate,bench} [options]

  simulate   replay a serving trace through the block manager (default: embedded Mooncake trace)
  bench      run the standard workloads against kvnumba and the pure-Python reference

Run 'kvnumba COMMAND --help' for the options of one command."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvnumba`` console script.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        Process exit code.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "simulate":
        from kvnumba.sim.cli import main as simulate_main

        return simulate_main(rest)
    if command == "bench":
        from kvnumba.bench.cli import main as bench_main

        return bench_main(rest)
    print(f"kvnumba: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
