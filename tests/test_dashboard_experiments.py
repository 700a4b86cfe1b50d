"""The Experiments pages in a real browser (Debian's Chromium through Playwright) against a real train
server, on a real ASHA search whose 12 trials ran as the server's jobs: its trial table fills live,
its importance ranks the parameter the objective depends on above a dummy one, brushing an axis of the
parallel coordinates filters the table, a pruned trial's curve ends at its rung (as its job's chart
does), and the best trial registers as a model version. The ``page`` fixture fails a test on any
console error. Waits are on what the page shows; screenshots go to ``$TRAINFORGE_SCREENSHOTS`` (the
docs' come from a run with it), else to the test's temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from trainforge import tune
from trainforge._testing.wait import wait_until
from trainforge.tune import RunConfig, TuneConfig, Tuner
from trainforge.tune.schedulers import ASHAScheduler

pytestmark = pytest.mark.slow

# Every trial is better than all before it at every rung, but the two x=1.0 ones (third and seventh):
# ASHA (reduction factor 2: while fewer than 4 trials are at a rung only the best goes on) stops those at
# rung 0, iteration 1. The best trials have x near 0.5, spread on both sides, so that the top of the
# experiment is what x decides; dummy is a fixed scramble of x (the test is the same every run).
XS = [0.0, 0.95, 1.0, 0.1, 0.85, 0.2, 1.0, 0.75, 0.3, 0.65, 0.4, 0.55]
STEPS = 4


def objective(config, gate=None):
    for step in range(STEPS):
        metrics = {"loss": (config["x"] - 0.5) ** 2 + 1 / (step + 1), "step": step}
        if step < STEPS - 1:
            tune.report(metrics)
        else:  # the model at the end: what registering the best trial registers
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "weights.txt"), "w") as f:
                    f.write(repr(config["x"]))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        while gate and config["x"] == XS[-1] and step == 1 and not os.path.exists(gate):
            time.sleep(0.01)  # the last trial waits here until the test lets it go on


def dummy(spec):
    return round((spec.config.x * 7.31 + 0.137) % 1.0, 4)


def _shot(page, tmp_path, name: str) -> None:
    where = os.environ.get("TRAINFORGE_SCREENSHOTS") or str(tmp_path)
    os.makedirs(where, exist_ok=True)
    page.screenshot(path=os.path.join(where, f"{name}.png"), full_page=True)


def _login(page, server) -> None:
    out = subprocess.run([sys.executable, "-m", "trainforge", "dashboard", "--state-dir", server.state_dir],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    page.goto(out.stdout.strip())


def test_an_asha_search_on_the_server_on_its_experiment_page(train_server, page, tmp_path):
    gate = str(tmp_path / "gate")
    tuner = Tuner(tune.with_parameters(objective, gate=gate),
                  param_space={"x": tune.grid_search(XS), "dummy": tune.sample_from(dummy), "batch_size": 64},
                  tune_config=TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                         scheduler=ASHAScheduler(max_t=STEPS + 1, grace_period=1, reduction_factor=2)),
                  run_config=RunConfig(name="asha-e2e", storage_path=str(tmp_path / "results"), verbose=0))  # fmt: skip
    results: list = []
    fit = threading.Thread(target=lambda: results.append(tuner.fit()), daemon=True)
    fit.start()
    client = train_server.client()

    def last_trial_waits():
        trials = client.request("GET", "/experiments/1/trials")["trials"] if client.request("GET", "/experiments")[
            "experiments"] else []  # fmt: skip
        waiting = [t for t in trials if t["config"]["x"] == XS[-1] and t["iterations"] >= 2]
        return len(trials) == 12 and waiting and waiting[0]

    last = wait_until(last_trial_waits, 120, "the last trial to wait at its gate")
    _login(page, train_server)
    page.locator("header nav a", has_text="Experiments").click()
    row = page.locator("#experiment-1")
    assert "asha-e2e" in row.inner_text() and "ASHAScheduler" in row.inner_text() and "loss min" in row.inner_text()
    assert "1 RUNNING" in row.inner_text()
    row.locator("a", has_text="asha-e2e").click()
    page.wait_for_function("() => document.getElementById('page').dataset.ready === '1'", timeout=30_000)
    live_row = page.locator(f'#trials tr[id="trial-{last["trial_id"]}"]')
    assert live_row.get_attribute("data-state") == "RUNNING"
    open(gate, "w").close()  # the last trial goes on: its row follows over the stream, no reload
    page.locator(f'#trials tr[id="trial-{last["trial_id"]}"][data-state="TERMINATED"]').wait_for(timeout=60_000)
    fit.join(120)
    assert results and results[0].num_errors == 0 and len(results[0]) == 12
    page.locator("#counts", has_text="12 TERMINATED (2 pruned)").wait_for(timeout=30_000)  # 10 ran to their end

    # The table: 12 trials, the two pruned ones saying where.
    trials = {t["trial_id"]: t for t in client.request("GET", "/experiments/1/trials")["trials"]}
    pruned = [t for t in trials.values() if t["state"] == "TERMINATED" and t["reason"]["kind"] == "pruned"]
    assert sorted(t["config"]["x"] for t in pruned) == [1.0, 1.0]
    assert page.locator("#trials tr").count() == 12
    for t in pruned:
        reason = page.locator(f'#trials tr[id="trial-{t["trial_id"]}"] td.reason').inner_text()
        assert "rung 0" in reason and "training_iteration 1" in reason, reason

    # Importance: x, which the objective depends on, above dummy (PED-ANOVA, then fANOVA).
    page.wait_for_function("() => document.getElementById('importance-meta').textContent.includes('over 10 completed')",
                           timeout=30_000)  # the page asks again when a trial ends  # fmt: skip
    assert page.locator("#importance .imp-row").evaluate_all("rows => rows.map(r => r.dataset.param)") == ["x", "dummy"]
    # 10 trials, under 20: the warning above the bars, and each bar's interval over the resamples (issue 36)
    assert page.locator("#importance-warning").inner_text().startswith("only 10 completed trial(s): with fewer than 20")
    assert page.locator("#importance .imp-interval").count() == 2
    assert "resamples" in page.locator("#importance-meta").inner_text()
    page.select_option("#evaluator", "fanova")
    page.wait_for_function("() => document.getElementById('importance-meta').textContent.startsWith('fANOVA')",
                           timeout=30_000)  # fmt: skip
    assert page.locator("#importance .imp-row").first.get_attribute("data-param") == "x"

    # Curves: a pruned trial's ends at its rung, as its job's own chart does; the others run to the end.
    page.wait_for_function("() => Number(document.getElementById('curves').dataset.drawn) === 12", timeout=30_000)
    ends = page.locator("#curves").evaluate("c => JSON.parse(c.dataset.ends)")
    for trial_id, t in trials.items():
        assert ends[trial_id] == (1 if t in pruned else STEPS), (trial_id, ends)
    for t in pruned:
        assert client.request("GET", f"/jobs/{t['job']}/series")["series"]["loss"]["i"] == [0]
    assert page.locator("#curve-legend .gradient-labels").inner_text().split() == ["0", "0.5", "1"]  # x, rounded
    assert page.locator("#decisions tr[data-kind=pruned]").count() == 2
    _shot(page, tmp_path, "experiment")

    # Brushing the x axis keeps the trials with x in the dragged range; a click on the axis clears it.
    page.locator("#parcoords").scroll_into_view_if_needed()
    # a constant parameter gets no axis; the line under the chart names it (issue 36)
    axes = page.locator("#parcoords g.pc-axis").evaluate_all("gs => gs.map(g => g.dataset.axis)")
    assert axes == ["x", "dummy", "__metric"], axes
    assert page.locator("#parcoords-constant").inner_text() == "constant (no axis): batch_size = 64"
    axis = page.locator('#parcoords rect.pc-hit[data-axis="x"]')
    box = axis.bounding_box()
    assert box is not None
    x, top, height = box["x"] + box["width"] / 2, box["y"], box["height"]
    page.mouse.move(x, top + 0.25 * height)
    page.mouse.down()
    page.mouse.move(x, top + 0.6 * height, steps=5)
    page.mouse.up()
    brush = page.locator('#parcoords g[data-axis="x"] rect.pc-brush')
    lo, hi = brush.evaluate("r => JSON.parse(r.dataset.range)")
    expected = sorted(t["trial_id"] for t in trials.values() if lo <= t["config"]["x"] <= hi)
    assert 0 < len(expected) < 12, (lo, hi)
    page.wait_for_function(f"() => document.getElementById('trials').dataset.shown === '{len(expected)}'", timeout=10_000)
    shown = page.locator("#trials tr").evaluate_all("rows => rows.map(r => r.id.slice(6))")
    assert sorted(shown) == expected
    _shot(page, tmp_path, "experiment-brushed")
    page.mouse.click(x, top + 0.9 * height)
    page.wait_for_function("() => document.getElementById('trials').dataset.shown === '12'", timeout=10_000)

    # Sorting by a column; the best trial registered as a model version.
    page.locator('th[data-sort="config:x"]').click()
    assert page.locator("#trials tr").first.locator("td").nth(3).inner_text() == "0"
    page.once("dialog", lambda dialog: dialog.accept("asha-best"))
    page.locator("#register").click()
    page.wait_for_function("() => document.getElementById('register').dataset.registered === 'models:/asha-best/1'",
                           timeout=60_000)  # fmt: skip
    best = min(trials.values(), key=lambda t: t["last"])
    (version,) = client.request("GET", "/models/asha-best/versions")
    assert version["job"]["id"] == best["job"] and version["tags"]["trial"] == best["trial_id"]
    page.goto(f"{train_server.url}/experiments")
    _shot(page, tmp_path, "experiments")
