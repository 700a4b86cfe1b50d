"""``TuneReportCallback``: a trainer fitted inside a function trial reports to the tuner (Ray's
``ray.tune.integration.ray_train`` name)."""

from __future__ import annotations

from trainforge import Callback, TrainingReport

__all__ = ["TuneReportCallback"]


class TuneReportCallback(Callback):
    """Put in the inner trainer's ``RunConfig(callbacks=[...])``: every rank-0 report of its run
    becomes a result of the trial running it, with ``checkpoint_path`` when it committed one."""

    def on_report(self, report: TrainingReport) -> None:
        from trainforge.tune._context import report as tune_report

        metrics = dict(report.metrics)
        if report.checkpoint is not None:
            metrics["checkpoint_path"] = report.checkpoint.path
        tune_report(metrics)
