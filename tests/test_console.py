"""The console of a real run: one line per event in the ``trainforge: ...`` style (no bare logging
line), and one numbering of reports and attempts: ``[report N]`` is the row of ``metrics_dataframe``
and attempts are numbered as ``get_context().get_attempt()``."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time

import trainforge as train
from trainforge import Checkpoint, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from trainforge._internal.progress import console_warnings
from trainforge._internal.storage import COMMIT_MARKER
from trainforge._testing.wait import wait_until


def _save(value: int) -> Checkpoint:
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "value"), "w") as f:
        f.write(str(value))
    return Checkpoint.from_directory(d)


def _fails_once_after_checkpoint_2(config):
    """Steps 0-4, a checkpoint each. In attempt 0, rank 1 fails once checkpoint_000002 is committed
    (so the restart resumes from it, whatever the timing); rank 0 waits there to be stopped."""
    ctx = train.get_context()
    ckpt = train.get_checkpoint()
    start = 0
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "value")).read()) + 1
    for step in range(start, 5):
        train.report({"step": step, "attempt": ctx.get_attempt()}, checkpoint=_save(step))
        if step == 2 and ctx.get_attempt() == 0:
            marker = os.path.join(ctx.get_trial_dir(), "checkpoint_000002", COMMIT_MARKER)
            wait_until(lambda m=marker: os.path.exists(m), 30, f"{marker} to appear", interval=0.01)
            if ctx.get_world_rank() == 1:
                raise RuntimeError("injected failure at step 2")
            while True:
                time.sleep(0.05)


def _trainer(tmp_path, verbose: int) -> DataParallelTrainer:
    return DataParallelTrainer(
        _fails_once_after_checkpoint_2,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path), name="run", verbose=verbose, failure_config=FailureConfig(max_failures=1)
        ),
    )


def test_restart_is_announced_once_with_one_numbering(tmp_path, capfd):
    result = _trainer(tmp_path, verbose=2).fit()
    out, err = capfd.readouterr()
    text = out + err
    # Announced exactly once (no bare line from Python's last-resort logging handler), in the
    # console's style, numbering attempts as get_attempt(): the failed one and the new one.
    assert text.count("injected failure at step 2") == 1, text
    [line] = [ln for ln in err.splitlines() if "injected failure" in ln]
    assert re.fullmatch(
        r"trainforge: attempt 0 failed: rank 1 \(pid \d+\): RuntimeError: injected failure at step 2; "
        r"restarting as attempt 1 from checkpoint_000002 \(failure 1 of 1 allowed\)",
        line,
    ), line
    # [report N] is the row of metrics_dataframe: after the restart it goes on at 3, as the
    # checkpoint numbers do, and names the attempt.
    shown = [
        (int(m[1]), int(m[2] or 0), m[3])
        for m in re.finditer(r"^trainforge: \[report (\d+)(?:, attempt (\d+))?\] .*\(checkpoint (\w+)\)$", err, re.M)
    ]
    assert shown == [
        (0, 0, "checkpoint_000000"),
        (1, 0, "checkpoint_000001"),
        (2, 0, "checkpoint_000002"),
        (3, 1, "checkpoint_000003"),
        (4, 1, "checkpoint_000004"),
    ], err
    df = result.metrics_dataframe
    assert list(df.index) == [0, 1, 2, 3, 4] and list(df["step"]) == [0, 1, 2, 3, 4]
    assert list(df["attempt"]) == [0, 0, 0, 1, 1]  # what get_attempt() said in each
    assert [f.attempt for f in result.failures] == [0]


def test_fit_iter_reports_are_numbered_as_the_history(tmp_path):
    run = _trainer(tmp_path, verbose=0).fit_iter()
    reports = [(r.index, r.attempt, r.metrics["step"], r.metrics["attempt"]) for r in run]
    assert reports == [(0, 0, 0, 0), (1, 0, 1, 0), (2, 0, 2, 0), (3, 1, 3, 1), (4, 1, 4, 1)]
    assert run.result is not None
    assert list(run.result.metrics_dataframe["step"]) == [r[0] for r in reports]


def test_verbose_0_prints_nothing_even_for_a_restart(tmp_path, capfd):
    _trainer(tmp_path, verbose=0).fit()
    out, err = capfd.readouterr()
    assert "trainforge" not in out + err and "injected failure" not in out + err


def test_console_warnings_show_each_warning_once_and_only_inside(capfd):
    logger = logging.getLogger("trainforge")
    with console_warnings():
        logger.warning("storage operation %r retried", "write")
        logger.info("not shown: below WARNING")
    logger.warning("not shown: outside")  # the package's NullHandler keeps Python's last resort quiet
    with console_warnings(enabled=False):
        logger.warning("not shown: disabled (verbose=0)")
    out, err = capfd.readouterr()
    assert err == "trainforge: storage operation 'write' retried\n" and out == ""


class _Report:
    """What the console reporter reads of a TrainingReport."""

    def __init__(self, index: int):
        self.index, self.attempt, self.checkpoint, self.metrics = index, 0, None, {"loss": 1 / (index + 1)}


class _Ended:
    error = None
    checkpoint = None


def _report_lines(monkeypatch, verbose: int, every_s: float, reports: int = 12) -> list[str]:
    """The console lines of a run with ``reports`` reports ``every_s`` apart (on a fake clock)."""
    from trainforge._internal import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    lines: list[str] = []
    for run in range(2):  # said once a run (each fit() has a reporter of its own)
        reporter = progress.ProgressReporter(verbose, "run")
        monkeypatch.setattr(reporter, "_print", lines.append)
        reporter.on_run_start(f"/results/run{run}", 1)
        for i in range(reports):
            reporter.on_report(_Report(i))
            now[0] += every_s
        reporter.on_run_end(_Ended())
    return lines


def test_sampled_report_lines_say_so_once_a_run_and_where_every_report_is(monkeypatch):
    monkeypatch.delenv("TRAINFORGE_JOB_ID", raising=False)
    lines = _report_lines(monkeypatch, verbose=1, every_s=0.3)
    shown = [int(m[1]) for ln in lines if (m := re.match(r"\[report (\d+)\]", ln))]
    assert shown == [0, 4, 8, 11] * 2  # one a second, and the last
    notes = [i for i, ln in enumerate(lines) if ln.startswith("[report lines:")]
    assert len(notes) == 2  # once a run, just before the first line after a skipped report
    assert lines[notes[0] - 1].startswith("[report 0]") and lines[notes[0] + 1].startswith("[report 4]")
    assert lines[notes[0]] == (
        "[report lines: at most one a second, so not every report is shown (RunConfig(verbose=2) shows each); "
        "all are in Result.metrics_dataframe and /results/run0/metrics.jsonl]"
    )
    # In a train-server job: where the server keeps them.
    monkeypatch.setenv("TRAINFORGE_JOB_ID", "7")
    note = next(ln for ln in _report_lines(monkeypatch, verbose=1, every_s=0.3) if ln.startswith("[report lines:"))
    assert note.endswith("all are in job 7's metrics (its dashboard page; GET /api/v1/jobs/7/metrics)]")


def test_report_lines_that_skip_nothing_say_nothing_of_sampling(monkeypatch):
    for verbose, every_s in ((2, 0.01), (1, 1.5)):  # every report shown: no note
        lines = _report_lines(monkeypatch, verbose=verbose, every_s=every_s, reports=5)
        assert sum(ln.startswith("[report ") for ln in lines) == 10, lines
        assert not any(ln.startswith("[report lines:") for ln in lines)
