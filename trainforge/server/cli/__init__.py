"""The train server's commands of the ``trainforge`` CLI: ``commands`` (start, stop, status, submit,
jobs, logs, ...), ``listing`` (the listings), ``team`` (users, usage, quotas) and ``job_view``
(following a job from a terminal)."""
