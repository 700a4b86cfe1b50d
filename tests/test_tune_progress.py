"""The tuner's live console table: drawn (rich) only when output is a terminal, with each trial's
status, config, iteration, time and latest metrics and the best so far; otherwise silent until one
summary line at the end."""

from __future__ import annotations

import io

import pytest

from trainforge.tune._experiment import ERROR, PENDING, RUNNING, TERMINATED, Trial
from trainforge.tune._progress import ProgressTable


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _trials() -> list[Trial]:
    out = []
    for i, (status, loss) in enumerate([(TERMINATED, 0.5), (TERMINATED, 0.125), (RUNNING, 0.25),
                                        (ERROR, None), (PENDING, None)]):  # fmt: skip
        t = Trial(trial_id=f"abc_{i:05d}", config={"lr": 0.1 * (i + 1), "model": {"width": 8 * (i + 1)}},
                  name=f"fn_abc_{i:05d}", dirname=f"fn_abc_{i:05d}", status=status)  # fmt: skip
        if loss is not None:
            t.last_result = {"loss": loss, "acc": 1 - loss, "training_iteration": 3 + i, "time_total_s": 1.5,
                             "trial_id": t.trial_id, "done": status == TERMINATED}  # fmt: skip
        out.append(t)
    return out


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def test_the_table_on_a_terminal_shows_every_trial_its_config_metrics_and_the_best():
    out = FakeTerminal()
    table = ProgressTable("/exp/path", "loss", "min", out=out)
    assert table.live is not None
    trials = _trials()
    table.update(trials)
    table.close(trials)
    text = out.getvalue()
    for t in trials:
        assert t.name in text and t.status in text
    for col in ("lr", "model/width", "iter", "loss", "acc"):
        assert col in text
    assert "0.125" in text and "0.875" in text  # latest metrics of trial 1 (loss, acc)
    assert "best loss=0.125 (fn_abc_00001)" in text
    assert "2 TERMINATED" in text and "1 ERROR" in text and "1 RUNNING" in text and "1 PENDING" in text
    assert "trial_id" not in text.split("loss")[0]  # bookkeeping keys are not columns


def test_the_table_keeps_the_last_thirty_rows_and_says_how_many_are_hidden():
    out = FakeTerminal()
    table = ProgressTable("/exp", "loss", "max", out=out)
    trials = [Trial(trial_id=f"t{i}", config={"x": i}, name=f"trial_{i:03d}", dirname="d", status=TERMINATED,
                    last_result={"loss": float(i)}) for i in range(40)]  # fmt: skip
    table.close(trials)
    text = out.getvalue()
    assert "trial_039" in text and "trial_010" in text and "trial_009" not in text.split("best")[0]
    assert "and 10 earlier" in text and "best loss=39 (trial_039)" in text


@pytest.mark.parametrize("metric", ["loss", None])
def test_not_a_terminal_nothing_until_one_summary_line(metric):
    out = io.StringIO()
    table = ProgressTable("/exp/path", metric, "min" if metric else None, out=out)
    trials = _trials()
    for _ in range(3):
        table.update(trials)
    assert out.getvalue() == ""
    table.close(trials)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tune: 5 trial(s) (") and lines[0].endswith("results in /exp/path")
    assert ("best loss=0.125 (fn_abc_00001)" in lines[0]) == (metric is not None)
