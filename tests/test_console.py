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
