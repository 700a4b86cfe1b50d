"""``GET /metrics``: the train server for operators, in the Prometheus text format (prometheus_client).

A plain route behind the guard (not ``prometheus_client.make_asgi_app()``, which answers ``/metrics``
with a 307 to ``/metrics/`` that scrapers do not follow, and would skip the guard): its own token,
the scrape token (``<state-dir>/scrape_token``), may read it and nothing else. A custom collector
builds every family at each scrape from what the server holds in memory (no query but one indexed
read of the oldest queued job), so a scrape of a server with 10,000 jobs takes milliseconds.

Families (``trainforge_`` prefix, base units):

- ``jobs{user,state}``; ``queue_pending_jobs{reason}``; ``queue_oldest_pending_age_seconds``
- ``resource_capacity{resource}``, ``resource_allocated{resource}``, ``resource_free{resource}``
- ``jobs_cpu_used_cores``, ``jobs_memory_used_bytes``, ``jobs_gpu_memory_used_bytes`` (measured), and
  per user ``user_*`` of the same, ``user_allocated{user,resource}``, ``user_usage{user}`` (decayed
  dominant-share seconds, the ledger's)
- what each configured scheduling policy exposes (:meth:`Policy.metrics
  <trainforge.server.scheduling.policy.Policy.metrics>`; this module knows none of them by name):
  ``user_quota{user,resource}`` (quota), ``user_fairshare_factor{user}`` (fair_share),
  ``user_running_jobs{user}`` and ``policy_max_running_jobs`` (max_running)
- ``scheduler_decision_duration_seconds`` (histogram), ``scheduler_last_decision_seconds``,
  ``scheduler_alarm_armed`` (1 while a time-based rule waits for a moment), ``scheduler_alarm_fired_total``
- ``job_submissions_total{user}``, ``job_preemptions_total{user}`` (counted in memory since start)
- with ``TeamPolicy.metrics_per_job``: ``job_cpu_used_cores{job,user}``, ``job_memory_used_bytes``,
  ``job_gpu_memory_used_bytes``, ``job_gpu_utilization_ratio`` (one series per running job)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainforge.client import JobState
from trainforge.server.jobs.service import JobService
from trainforge.server.routes.common import Service

router = APIRouter()


class ServerCollector:
    """The prometheus_client collector over a :class:`JobService` (see the module docstring)."""

    def __init__(self, service: JobService):
        self.service = service

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s, now = self.service, time.time()

        def gauge(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> Any:
            family = GaugeMetricFamily(f"trainforge_{name}", doc, labels=labels)
            for key, value in sorted(values.items()):
                family.add_metric(list(key), value)
            return family

        yield gauge("jobs", "Jobs by owner and state.", ["user", "state"], {k: float(n) for k, n in s.store.counts().items()})
        reasons: dict[tuple[str, ...], float] = {}
        for p in s.queue():
            reasons[(p.reason,)] = reasons.get((p.reason,), 0.0) + 1
        yield gauge("queue_pending_jobs", "Waiting jobs by why they wait.", ["reason"], reasons)
        oldest = s.store.oldest_submitted_at(JobState.QUEUED.value)
        yield gauge("queue_oldest_pending_age_seconds", "Since the oldest queued job was submitted.", [],
                    {(): max(0.0, now - oldest) if oldest is not None else 0.0})  # fmt: skip
        grants, free = s.grants(), s.free()
        allocated: dict[str, float] = {}
        for g in grants.values():
            for k, v in g["grant"].items():
                allocated[k] = allocated.get(k, 0.0) + v
        for name, doc, values in (("capacity", "What jobs may be granted, by kind.", s.capacity),
                                  ("allocated", "What running jobs hold, by kind.", allocated),
                                  ("free", "What is left to grant, by kind.", free)):  # fmt: skip
            yield gauge(f"resource_{name}", doc, ["resource"], {(k,): float(v) for k, v in values.items()})
        scheduling = s.scheduling
        report, gauges, owners = scheduling.report(now), scheduling.gauges(now), scheduling.owners()
        by_job = s.usage.totals()
        used: dict[str, dict[str, float]] = {}
        for job_id, total in by_job.items():
            u = used.setdefault(owners.get(job_id, "admin"), {"cpu": 0.0, "rss": 0.0, "gpu": 0.0})
            u["cpu"] += total.get("cpu_percent", 0.0) / 100
            u["rss"] += total.get("rss", 0.0)
            u["gpu"] += total.get("gpu_memory", 0.0)
        for key, name, doc in (("cpu", "cpu_used_cores", "CPU cores the jobs' processes use (measured)."),
                               ("rss", "memory_used_bytes", "Resident memory of the jobs' processes (measured)."),
                               ("gpu", "gpu_memory_used_bytes", "GPU memory the jobs' processes use (measured).")):  # fmt: skip
            yield gauge(f"jobs_{name}", doc, [], {(): sum(u[key] for u in used.values())})
            yield gauge(f"user_{name}", doc, ["user"], {(user,): u[key] for user, u in used.items()})
        yield gauge("user_allocated", "What each user's running jobs hold, by kind.", ["user", "resource"],
                    {(r["user"], k): v for r in report for k, v in r["holds"].items()})  # fmt: skip
        yield gauge("user_usage", "Each user's decayed usage (dominant-share seconds).", ["user"],
                    {(r["user"],): r["usage"] for r in report})  # fmt: skip
        for exposed in gauges:  # what the policies expose
            yield gauge(exposed.name, exposed.doc, list(exposed.labels), dict(exposed.values))
        counters = scheduling.counters
        buckets, decided_s = counters.decisions.snapshot()
        histogram = HistogramMetricFamily("trainforge_scheduler_decision_duration_seconds",
                                          "How long the scheduler's decisions take.",
                                          buckets=[("+Inf" if b == float("inf") else repr(b), n) for b, n in buckets],
                                          sum_value=decided_s)  # fmt: skip
        yield histogram
        yield gauge("scheduler_last_decision_seconds", "How long the latest decision took.", [],
                    {(): counters.last_decision_s})  # fmt: skip
        yield gauge("scheduler_alarm_armed", "1 while a time-based rule waits for a moment to decide again.", [],
                    {(): 0.0 if scheduling.alarm.at is None else 1.0})  # fmt: skip
        fired = CounterMetricFamily("trainforge_scheduler_alarm_fired", "Decisions the scheduler's alarm made.")
        fired.add_metric([], float(scheduling.alarm.fired))
        yield fired
        for name, doc, counts in (("job_submissions", "Jobs submitted since the server started.", counters.submissions),
                                  ("job_preemptions", "Jobs preempted since the server started.", counters.preemptions)):  # fmt: skip
            counter = CounterMetricFamily(f"trainforge_{name}", doc, labels=["user"])
            for user, n in sorted(dict(counts).items()):
                counter.add_metric([user], float(n))
            yield counter
        if scheduling.policy.metrics_per_job:
            for key, name, scale in (("cpu_percent", "cpu_used_cores", 0.01), ("rss", "memory_used_bytes", 1.0),
                                     ("gpu_memory", "gpu_memory_used_bytes", 1.0),
                                     ("gpu_util", "gpu_utilization_ratio", 0.01)):  # fmt: skip
                yield gauge(f"job_{name}", f"Per running job: {name} (measured).", ["job", "user"],
                            {(str(j), owners.get(j, "admin")): t.get(key, 0.0) * scale for j, t in by_job.items()})  # fmt: skip


def _registry(request: Request, service: JobService) -> Any:
    """The app's registry (made at the first scrape): the collector, nothing global."""
    registry = getattr(request.app.state, "prometheus", None)
    if registry is None:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(ServerCollector(service))
        request.app.state.prometheus = registry
    return registry


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, service: Service) -> Response:
    """The server's metrics in the Prometheus text format (see the module docstring)."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    except ImportError:
        return Response("/metrics needs prometheus_client: pip install 'trainforge[server]'\n", status_code=501,
                        media_type="text/plain")  # fmt: skip
    return Response(generate_latest(_registry(request, service)), media_type=CONTENT_TYPE_LATEST)
