"""Compiling the kernels kvnumba's vLLM manager uses before vLLM needs them.

On a machine whose numba cache does not hold them yet, the engine path's kernels
(:data:`kvnumba.kernels.ENGINE`) take a while to compile, longer on the numba vLLM pins. Two ways
keep that out of a vLLM start:

- ahead of time: ``kvnumba compile --engine`` (for images: run it where the engine will run,
  with the same ``NUMBA_CACHE_DIR``);
- while vLLM loads the model: vLLM loads its ``vllm.general_plugins`` entry points at the start
  of the engine process, before the model; kvnumba's (:func:`plugin`) starts
  ``kvnumba compile --engine --group I`` in one child process per group of kernels there, and
  the manager waits for them (:func:`wait_for_compile`) before loading the kernels from the
  cache.

The plugin compiles in child processes because the engine's own process must not load numba
before vLLM's CPU worker starts, so that the compile takes the GIL of no engine thread, and so
that the groups compile in parallel. It runs when ``KVNUMBA_VLLM_PRECOMPILE`` is ``1``, or,
unset, when the command line names kvnumba's scheduler (``--scheduler-cls
kvnumba.integrations.vllm.KVNumbaScheduler``); ``0`` turns it off. This module imports neither
numba nor vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

try:  # POSIX only; elsewhere compiles are not coordinated between processes (still correct)
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX platforms
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("kvnumba")

PRECOMPILE_ENV = "KVNUMBA_VLLM_PRECOMPILE"
#: Named on a command line (``--scheduler-cls kvnumba.integrations.vllm.KVNumbaScheduler``), it
#: asks for the background compile when ``KVNUMBA_VLLM_PRECOMPILE`` is unset.
SCHEDULER_MODULE = "kvnumba.integrations.vllm"
#: ``len(kvnumba.kernels.ENGINE_GROUPS)`` (a test checks they agree; this module imports no numba).
NUM_GROUPS = 2

_children: list[subprocess.Popen] = []
_ready = False  # the engine kernels are loaded in this process
#: What :func:`load_engine_kernels` did in this process: seconds waited for a background
#: compile, kernels it had to compile, and the CPU seconds that took.
report = {"waited_s": 0.0, "compiled": 0, "compile_cpu_s": 0.0, "compile_wall_s": 0.0}


def lock_path(group: int) -> Path:
    """The lock a compile of engine kernel group ``group`` holds, one per numba cache location.

    Parameters
    ----------
    group : int
        An index of ``kvnumba.kernels.ENGINE_GROUPS``.

    Returns
    -------
    pathlib.Path
        A file in the temporary folder, named after the user and the cache location.
    """
    where = os.environ.get("NUMBA_CACHE_DIR") or str(Path(__file__).resolve().parents[2])
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    user = getattr(os, "getuid", lambda: 0)()
    return Path(tempfile.gettempdir()) / f"kvnumba-compile-{user}-{digest}-{group}.lock"


@contextlib.contextmanager
def compile_lock(
    groups: Iterable[int], exclusive: bool = True, shared: Iterable[int] = ()
) -> Iterator[None]:
    """Hold the compile locks of ``groups`` (and the ``shared`` ones shared).

    Every holder takes its locks in increasing group order, so two holders of several never
    wait for each other; a shared lock waits until no compile holds it exclusively.

    Parameters
    ----------
    groups : iterable of int
        Groups whose locks are taken, exclusively unless ``exclusive`` is False.
    exclusive : bool, default True
        Whether ``groups`` are taken exclusively.
    shared : iterable of int, optional
        Further groups whose locks are taken shared.
    """
    modes = dict.fromkeys(shared, False) | dict.fromkeys(groups, exclusive)
    with contextlib.ExitStack() as stack:
        if fcntl is not None:
            for group in sorted(modes):
                f = stack.enter_context(open(lock_path(group), "a+b"))
                fcntl.flock(f, fcntl.LOCK_EX if modes[group] else fcntl.LOCK_SH)
                stack.callback(fcntl.flock, f, fcntl.LOCK_UN)
        yield


def _all_groups() -> range:
    # The number of groups without importing numba (kvnumba.kernels does).
    return range(NUM_GROUPS)


def wanted(argv: list[str] | None = None, environ=None) -> bool:
    """Whether the plugin should compile in the background (see the module docstring).

    Parameters
    ----------
    argv : list of str, optional
        The command line (default ``sys.argv``).
    environ : mapping, optional
        The environment (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    setting = environ.get(PRECOMPILE_ENV, "")
    if setting in ("0", "1"):
        return setting == "1"
    # The scheduler class's module path, not just the name: a path such as a cache folder may
    # contain "kvnumba" without kvnumba being asked for.
    return any(SCHEDULER_MODULE in arg for arg in (sys.argv if argv is None else argv))


def _start_children(groups) -> None:
    for group in groups:
        command = ["-m", "kvnumba", "compile", "--engine", "--group", str(group), "--quiet"]
        _children.append(
            subprocess.Popen(
                [sys.executable, *command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
        )


def start_background_compile() -> list[subprocess.Popen]:
    """Start ``kvnumba compile --engine --group I`` in one child process per group (once per
    process); they compile in parallel where there are cores for them.

    Returns
    -------
    list of subprocess.Popen
        The children; :func:`wait_for_compile` waits for them.
    """
    if not _children:
        _start_children(_all_groups())
    return _children


def plugin() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: start the background compile if wanted.

    vLLM may call it in several processes (front end, engine, workers); each starts one child
    per group of kernels, and a group's children compile one at a time (:func:`compile_lock`),
    so the later ones only load what the first compiled. A failure to start them is logged and
    changes nothing else: the manager then compiles what is missing itself.
    """
    if wanted():
        try:
            start_background_compile()
            log.warning("kvnumba: compiling its engine kernels in the background (first start)")
        except OSError as exc:
            log.warning("kvnumba: no background compile (%s); the manager will compile", exc)


def wait_for_compile() -> float:
    """Wait for a background compile of this process or any other.

    Returns
    -------
    float
        The seconds waited.
    """
    start = time.perf_counter()
    for child in _children:
        child.wait()
    with compile_lock(_all_groups(), exclusive=False):
        pass
    return time.perf_counter() - start


def load_engine_kernels(logger: logging.Logger = log) -> None:
    """Make the engine kernels ready in this process before the scheduler's first step.

    Waits for a background compile (:func:`plugin`), then compiles or loads
    :data:`kvnumba.kernels.ENGINE`: the first group in this process and the others in child
    processes at the same time. Logs a line when it waited, or one before and one after it
    compiled, with the seconds it took.

    Parameters
    ----------
    logger : logging.Logger, optional
        Where the line goes (vLLM's adapter passes its own logger).
    """
    global _ready
    if _ready:
        return
    waited = wait_for_compile()
    from kvnumba import kernels

    wall = time.perf_counter()

    missing = kernels.uncached(kernels.ENGINE)
    start = time.process_time()
    if missing:
        kernels.notice_given()  # said here, with the engine's numbers
        logger.warning(
            "kvnumba: compiling %d kernels of its vLLM manager for this machine (first start "
            "only, cached afterwards; `kvnumba compile --engine` does it ahead of time, "
            "%s=1 while vLLM loads the model)",
            len(missing),
            PRECOMPILE_ENV,
        )
        # The first group here, the others meanwhile in child processes (a core each where
        # there are cores), then their kernels are loaded from the cache below. The first
        # group's lock is taken before the children start: they wait for it where they need
        # its workers (kernels.ENGINE_AFTER).
        with compile_lock([0]):
            _start_children(
                group
                for group in _all_groups()[1:]
                if set(kernels.ENGINE_GROUPS[group]) & set(missing)
            )
            kernels.compile_all(kernels.ENGINE_GROUPS[0])
        wait_for_compile()
    # Loads what the groups compiled (compiles only what a stale cache lost).
    with compile_lock(_all_groups(), exclusive=False):
        kernels.compile_all(kernels.ENGINE)
    _ready = True
    report.update(
        waited_s=waited,
        compiled=len(missing),
        compile_cpu_s=time.process_time() - start,
        compile_wall_s=time.perf_counter() - wall,
    )
    if missing:
        logger.warning(
            "kvnumba: compiled in %.1f s (%.1f s of this process's CPU)",
            report["compile_wall_s"],
            report["compile_cpu_s"],
        )
    elif waited >= 0.1:
        logger.warning("kvnumba: waited %.1f s for the background compile", waited)
