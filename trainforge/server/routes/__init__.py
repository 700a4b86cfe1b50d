"""The train server API's routers, one module per resource, each an ``APIRouter`` under
``/api/v1`` whose routes take the service (and the caches they share) from the app's state
(:mod:`.common`); :func:`trainforge.server._app.make_app` includes them.

- :mod:`.jobs`: submit, list, get, change (priority, hold), stop, retry, delete; a job's Result
- :mod:`.logs`: a job's logs and its live streams (logs, run events), its lifecycle events, and
  every job's lifecycle as one stream (``/events``)
- :mod:`.metrics`: a job's reports, chart series, checkpoints and resource usage
- :mod:`.queue`: the queue, the resources, health and version
- :mod:`.models`: the model registry (``/models``); :mod:`.serve`: predictions (``/serve``)
- :mod:`.team`: users, who am I, the audit log and fair share (``/users``, ``/whoami``, ``/audit``, ``/shares``)
- :mod:`.operator`: ``/metrics`` for Prometheus
- :mod:`.access`: who may call which route (every route's rule, every role's rules: one table), the
  dependency every route of the app has
"""
