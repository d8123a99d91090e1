"""Page pools: several managers over one physical pool of pages (``docs/design.md``, "Pages").

- :mod:`.pool`: :class:`~kvnumba.PagePool`, the physical pages (in this process or in shared
  memory) and their owner records; its kernels are ``kvnumba._kernels.physical_pages``.
- :mod:`.member`: ``PageSide``, one manager's side of a pool: its virtual pages, page callbacks,
  ``trim`` and ``close``; its kernels are ``kvnumba._kernels.virtual_pages``.
- :mod:`.coordinator`: ``PoolCoordinator``, which knows a pool's managers in this process and
  moves cache-only pages between them (``PoolMember`` is what it asks of a manager).
- ``_shm``, ``_filelock``, ``_process``: what a shared pool stands on (the segment and its
  name, the cross-process lock, process liveness and identity after a fork).

Nothing is imported here: ``kvnumba.PagePool`` is loaded on first use.
"""
