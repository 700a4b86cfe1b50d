"""Helpers for trainforge's own tests (``tests/``) and benchmarks (``bench/``), shipped with the package
so that both import one copy. The library never imports this package (the import contract places it at
the top layer); nothing here is public API.

- ``wait``:   ``wait_until(predicate, timeout, what)``, the one polling helper.
- ``server``: ``ServingProcess`` (a process read until it prints ``serving http://...``) and
  ``TrainServer`` (``python -m trainforge.server start`` on a free port, its jobs and warm fork servers).
- ``procs``:  process-leak checks (the test run's environment tag, a test's leftover children), waiting
  for processes to go, killing them (through ``trainforge._internal.process_tree.kill_and_reap``).

The benchmarks' HTTP load client is not here but in ``bench/_http_load.py``: a load-client process's
CPU time is measured, and importing anything under ``trainforge`` runs the package's ``__init__``.
"""
