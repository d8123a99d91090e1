"""What counts as naming a file outside the repository.

Shared by ``test_repository_paths.py`` (no tracked file names one) and ``test_sim_report.py``
(what the commands print names none). A reference to the outside is one of:

``absolute``
    An absolute path under one of a machine's user, scratch or temporary roots (the folders
    that :data:`RULES` names) or on a Windows drive: it names one machine's files, which no
    other checkout has. System interfaces such as ``/dev/shm`` or ``/proc`` are not files of a
    machine's user and are not matched, nor is a path that is part of a web address.
``home``
    A path under the home folder (``~/``, ``$HOME/``, ``${HOME}/``), except under ``.cache/``.
    A per-user cache (the XDG convention) is where a script keeps what it downloads or builds,
    e.g. ``scripts/vllm_env.sh``'s ``${KVNUMBA_VLLM_CACHE:-$HOME/.cache/kvnumba-vllm}``: the
    script creates it, names it as a default that its variable moves, and no file of another
    project lives there.
``shared``
    The workplace's folder of that name beside the checkout, reached through the parent folder
    or named as a top-level path, also when joined as a path component (the patterns in
    :data:`RULES`).
``parent``
    A relative path whose leading ``../`` run leaves the repository, resolved from the folder
    of the file that holds it (checked only when that file's path is given).
``notes``
    The notes and tools of that shared folder by name: ``SPEC.md``, ``WORKLOADS.md``,
    ``gen_trace``. The repository's own account of the standard workloads is
    ``docs/workloads.md`` and their generator is :mod:`kvnumba.bench.workloads`.
"""

from __future__ import annotations

import posixpath
import re

RULES = {
    "absolute": re.compile(
        r"(?<![\w.~$}-])/(?:work|home|root|tmp|Users|mnt|scratch)/"
        r"|(?<![\w])[A-Za-z]:\\{1,2}(?=[\w.$%])"
    ),
    "home": re.compile(r"(?:~|\$HOME|\$\{HOME\})/(?!\.cache/)"),
    "shared": re.compile(r"""(?<![\w.-])shared/|/\s*["']shared["']"""),
    "notes": re.compile(r"\b(?:SPEC|WORKLOADS)\.md\b|\bgen_trace\b"),
}
_PARENT = re.compile(r"(?<![\w./])((?:\.\./)+)")


def _leaves_repository(where: str, ups: int) -> bool:
    """True if ``ups`` leading ``../`` from the folder of ``where`` leave the repository."""
    folder = posixpath.dirname(posixpath.normpath(where))
    depth = 0 if folder in ("", ".") else len(folder.split("/"))
    return ups > depth


def outside_references(text: str, where: str | None = None) -> list[tuple[int, str, str]]:
    """The references to the outside in ``text``.

    Parameters
    ----------
    text : str
        The text to search.
    where : str or None
        The repository-relative path of the file ``text`` comes from; ``../`` paths are
        resolved from its folder. ``None`` (program output) skips the ``parent`` rule.

    Returns
    -------
    list of (int, str, str)
        ``(line number, rule, the line)`` for each hit, in line order.
    """
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for rule, pattern in RULES.items():
            if pattern.search(line):
                hits.append((number, rule, line.strip()))
        if where is not None:
            for match in _PARENT.finditer(line):
                if _leaves_repository(where, len(match.group(1)) // 3):
                    hits.append((number, "parent", line.strip()))
    return hits
