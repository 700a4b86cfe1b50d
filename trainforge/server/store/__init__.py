"""The train server's store: the one package that speaks SQL. Everything else in the server calls its
methods, named by what they do; routes and pages never import it (they go through the job service
and the domain objects: an import contract in pyproject.toml says so), and it imports none of the
server's other packages (it is their bottom). ``tests/test_server_store.py`` fails on SQL anywhere
else under ``trainforge/``: ``sqlite3`` imported, an SQL statement in a string, ``execute`` with one.

- ``database``: :class:`~trainforge.server.store.database.JobStore`, the SQLite database (one writer
  connection, a pool of ``readers``), the jobs and their events, the counts by owner and state, and
  :meth:`~trainforge.server.store.database.JobStore.watch` (who keeps facts derived from the jobs is
  told of each committed change, so that it writes where the fact arises, never on a read);
  ``job_rows``: a job's row (``JobRow``) and one change of it.
- One module per other concept, each a class the ``JobStore`` holds as an attribute: ``users``
  (``store.users``), ``audit`` (``store.audit``), ``tokens`` (``store.job_tokens``), ``experiments``
  (``store.experiments``: Tune experiments, their trials and decisions).
- ``migrations``: the schema as numbered migrations (``PRAGMA user_version``); the tables' meaning in
  ``experiment_tables`` and ``team_tables``.

**Adding a query**: a method on the concept's class (or on ``JobStore`` for the jobs), named by what
it answers or does, taking and returning plain values (a row is a mapping of its columns); a change is
one transaction. **Adding a table or a column**: a new migration, the next number in
``migrations.MIGRATIONS`` (never edit a released one); see :mod:`trainforge.server.store.migrations`.
"""
