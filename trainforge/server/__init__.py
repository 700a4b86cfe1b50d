"""The train server (issue 8, in progress): a job queue that runs many training jobs at once by the
resources they ask for.

Built so far: the scheduling rule (``trainforge.server._scheduler``), a pure function with its
property-based tests. The HTTP API, the job store, the runner, the CLI and the Python client are not
built yet, so nothing here is public.
"""

__all__: list[str] = []
