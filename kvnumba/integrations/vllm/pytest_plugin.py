"""pytest plugin: run vLLM's own tests with kvnumba's KV cache manager.

Load with ``-p kvnumba.integrations.vllm.pytest_plugin`` (``scripts/vllm_env.sh compare`` does).
At configure time every ``KVCacheManager(...)`` that vLLM's tests or its ``Scheduler`` build
becomes kvnumba's manager where it serves the configuration (vLLM's own otherwise, with the
reason logged: :mod:`kvnumba.integrations.vllm.scheduler`); a ``Scheduler`` whose configuration
rules kvnumba out (a KV connector, an encoder-decoder model) keeps vLLM's manager.

The allowlist (``KVNUMBA_VLLM_ALLOWLIST``, a file: one test a line, ``path::name`` for every
parametrization or ``path::name[param]`` for one, then ``# reason``) lists tests that assert
vLLM allocator internals a different allocator may legitimately differ on. They are marked
``xfail(strict=True)``, so one that passes fails the run: the list cannot go stale silently,
and neither can an entry that names no collected test of a collected file (a usage error).

After each test body, every kvnumba manager the test built must pass
``KVNumbaKVCacheManager.check()`` (kvnumba's invariants and the adapter's bookkeeping), or the
test fails. Each test's manager kind is counted: ``KVNUMBA_VLLM_REPORT`` (a path) receives a JSON object
``{nodeid: "kvnumba" | "vllm" | "mixed" | "none"}`` (with the fallback reasons in
parentheses), and the terminal summary prints the
totals, so a pass that never touched kvnumba is not mistaken for one that did.
"""

from __future__ import annotations

import functools
import json
import os

import pytest

from kvnumba.integrations.vllm.suite_lists import read_test_list

ALLOWLIST_ENV = "KVNUMBA_VLLM_ALLOWLIST"
REPORT_ENV = "KVNUMBA_VLLM_REPORT"

_kinds: dict[str, str] = {}


def _wrap_scheduler_init(scheduler_cls) -> None:
    """Make every ``Scheduler`` apply the scheduler-level fallbacks of ``KVNumbaScheduler``."""
    from kvnumba.integrations.vllm.scheduler import kvnumba_enabled, scheduler_max_seqs
    from kvnumba.integrations.vllm.support import scheduler_fallback_reason

    original = scheduler_cls.__init__

    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        with kvnumba_enabled(
            scheduler_fallback_reason(vllm_config), scheduler_max_seqs(vllm_config)
        ):
            original(self, vllm_config, *args, **kwargs)

    scheduler_cls.__init__ = __init__


def pytest_configure(config: pytest.Config) -> None:
    """Install the switch and enable kvnumba's manager for the test thread."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvnumba.integrations.vllm import scheduler as switch

    switch.install()
    switch.set_default_enabled(True)
    _wrap_scheduler_init(Scheduler)
    config.addinivalue_line("markers", "kvnumba_allowlisted: listed in the kvnumba allowlist")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the allowlisted tests ``xfail(strict=True)``; reject entries that match nothing."""
    path = os.environ.get(ALLOWLIST_ENV)
    if not path:
        return
    listed = read_test_list(path)
    seen = set()
    files = {item.nodeid.split("::", 1)[0] for item in items}
    for item in items:
        for key in (item.nodeid, item.nodeid.split("[", 1)[0]):
            if key in listed:
                seen.add(key)
                item.add_marker(pytest.mark.kvnumba_allowlisted)
                item.add_marker(
                    pytest.mark.xfail(reason=f"kvnumba allowlist: {listed[key]}", strict=True)
                )
                break
    stale = [k for k in listed if k not in seen and k.split("::", 1)[0] in files]
    if stale:
        raise pytest.UsageError(f"{path}: no collected test matches: {', '.join(stale)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """After the test body, every kvnumba manager it built must pass its ``check()``."""
    from kvnumba.integrations.vllm.scheduler import built, live_managers

    before = built["kvnumba"]
    result = yield
    for manager in list(live_managers):
        if manager.serial > before:
            manager.check()  # kvnumba.InvariantViolation fails the test
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Count the managers of each kind the test built (setup, call and teardown)."""
    from kvnumba.integrations.vllm.scheduler import built, fallback_reasons

    before, reasons = dict(built), fallback_reasons.copy()
    yield
    k = built["kvnumba"] - before["kvnumba"]
    v = built["vllm"] - before["vllm"]
    kind = "mixed" if k and v else "kvnumba" if k else "vllm" if v else "none"
    why = sorted(fallback_reasons - reasons)
    _kinds[item.nodeid] = kind + (f" ({'; '.join(why)})" if why else "")


def pytest_terminal_summary(terminalreporter) -> None:
    """One line: how many tests ran on kvnumba's manager, on vLLM's, on none."""
    counts = {kind: 0 for kind in ("kvnumba", "mixed", "vllm", "none")}
    for kind in _kinds.values():
        counts[kind.split(" ", 1)[0]] += 1
    terminalreporter.write_line(
        f"kvnumba-vllm: {counts['kvnumba']} tests built kvnumba's manager only, "
        f"{counts['mixed']} built both kinds, {counts['vllm']} only vLLM's (fallback), "
        f"{counts['none']} none"
    )
    from kvnumba.integrations.vllm.scheduler import fallback_reasons

    for reason, n in fallback_reasons.most_common():
        terminalreporter.write_line(f"kvnumba-vllm: fell back {n} times: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the per-test manager kinds to ``KVNUMBA_VLLM_REPORT`` when set."""
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_kinds, f, indent=0, sort_keys=True)
