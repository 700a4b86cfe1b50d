"""The dashboard in a real browser (Debian's Chromium through Playwright) against a real train server
with real jobs. The ``page`` fixture fails a test on any console error or uncaught page error.

Waits are on what the page shows (Playwright's auto-waiting selectors, with timeouts), never on a
sleep. How fast a report reaches its chart is measured by the benchmark, not asserted here.
Screenshots of every page go to ``$TRAINFORGE_SCREENSHOTS`` when it is set (the README's come from a
run with it), else to the test's temporary directory.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time

import pytest

import trainforge
from trainforge import DataParallelTrainer, RunConfig, ScalingConfig
from trainforge._internal.amounts import fmt_bytes

pytestmark = pytest.mark.slow


def _dashboard_url(server) -> str:
    out = subprocess.run([sys.executable, "-m", "trainforge", "dashboard", "--state-dir", server.state_dir],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return out.stdout.strip()


def _shot(page, tmp_path, name: str, full_page: bool = False) -> None:
    where = os.environ.get("TRAINFORGE_SCREENSHOTS") or str(tmp_path)
    os.makedirs(where, exist_ok=True)
    page.screenshot(path=os.path.join(where, f"{name}.png"), full_page=full_page)


def _gated(config):
    """Reports step i once file ``gate_i`` exists (``steps`` steps), with ``extra`` metrics."""
    for step in range(config["steps"]):
        gate = os.path.join(config["gates"], f"gate_{step}")
        while config.get("gates") and not os.path.exists(gate):
            time.sleep(0.01)
        scale = config.get("scale", 1.0)
        metrics = {"step": step, "loss": scale / (step + 1), "val_loss": 1.2 * scale / (step + 1)}
        metrics.update(config.get("extra", {}))
        trainforge.report(metrics)


def _many_reports(config):
    for step in range(config["steps"]):
        trainforge.report({"spiky": 100.0 if step == config["spike_at"] else 1.0})


def _fails_on_rank_1(config):
    trainforge.report({"step": 0})
    if trainforge.get_context().get_world_rank() == 1:
        raise ValueError("rank one broke on purpose")


def _checkpointing(config):
    """A checkpoint (with 10 KB of weights) at every step; resumes after the step it restores."""
    start = 0
    checkpoint = trainforge.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                f.write(b"\0" * 10_000)
            trainforge.report({"step": step, "resumed_at": start},
                              checkpoint=trainforge.Checkpoint.from_directory(d))  # fmt: skip


def _trainer(tmp_path, name, loop, workers=2, **config):
    return DataParallelTrainer(
        loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0),
    )  # fmt: skip


def test_opening_the_printed_url_logs_in_and_an_empty_server_says_so(train_server, page, page_errors, tmp_path):
    base = train_server.url
    page_errors.allow(r"status of 401")  # the first visit, without the token, is refused on purpose
    response = page.goto(base + "/")
    assert response is not None and response.status == 401  # no token, no page
    page.goto(_dashboard_url(train_server))
    assert page.url == base + "/"  # the token became a cookie and left the address bar
    assert "No jobs yet" in page.locator("#jobs").inner_text()
    _shot(page, tmp_path, "jobs-empty")


def test_a_report_reaches_its_chart_and_stop_from_the_page_ends_every_process(train_server, page, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "gate_0").touch()
    job = _trainer(tmp_path, "live", _gated, steps=100, gates=str(gates)).submit()
    page.goto(_dashboard_url(train_server))
    row = page.locator(f"#job-{job.id}")
    row.locator(".s-RUNNING").wait_for(timeout=30_000)  # the table follows the job's lifecycle live
    row.locator("td.uses", has_text="CPU").wait_for(timeout=30_000)  # and what the job uses
    _shot(page, tmp_path, "jobs")
    page.goto(f"{train_server.url}/jobs/{job.id}")
    loss = page.locator('.chart[data-group="loss"] .last')
    loss.wait_for(timeout=30_000)
    assert "val_loss" in loss.inner_text()  # train and validation series share a chart
    assert page.locator('.chart[data-group="step"]').count() == 0  # no "step vs step" (the x axis is the step)
    (gates / "gate_1").touch()  # step 1 reports now: its value must reach the chart
    page.wait_for_function(
        "() => document.querySelector('.chart[data-group=\"loss\"] .last').textContent.includes('loss: 0.50000')",
        timeout=10_000,
    )
    page.locator("#log").wait_for()
    # What its processes use, sampled every second: the runner and both workers.
    page.wait_for_function(
        "() => [...document.querySelectorAll('#usage tr')].filter(r => r.textContent.startsWith('worker')).length === 2",
        timeout=30_000,
    )
    assert "no GPU" in page.locator("#gpu").inner_text()  # said, not left blank
    usage = job.client.request("GET", f"/jobs/{job.id}/usage")
    assert sorted(p["role"] for p in usage["processes"]) == ["runner", "worker", "worker"]
    assert all(p["rss"] > 0 for p in usage["processes"]) and usage["total"]["processes"] == 3
    _shot(page, tmp_path, "job-detail", full_page=True)
    assert len(train_server.job_processes(job.id)) >= 3  # the runner and 2 workers
    page.locator('#actions button[data-act="stop"]').click()
    page.locator("#state.s-STOPPED").wait_for(timeout=60_000)
    assert train_server.job_processes(job.id) == []
    assert job.status().state == "STOPPED"


def test_a_jobs_attempts_are_charted_apart_and_labelled(train_server, page, tmp_path):
    """The job's events file as a requeued job leaves it (attempt 2 repeats steps 0-2), then a third
    attempt arriving live: each chart breaks at each new attempt and labels it."""
    import json

    script = tmp_path / "noop.py"
    script.write_text("print('never runs: held')\n")
    job = train_server.client().submit({"kind": "script", "path": str(script), "hold": True})
    events = os.path.join(train_server.state_dir, "jobs", str(job.id), "events.jsonl")

    def attempt(n: int) -> str:
        return "".join(json.dumps(e) + "\n" for e in [{"type": "run_start", "name": "r", "job_attempt": n, "t": 1.0}] + [
            {"type": "report", "index": i, "attempt": 0, "t": 1.0 + i, "metrics": {"loss": 1 / (i + 1)}}
            for i in range(3)])  # fmt: skip

    with open(events, "w") as f:
        f.write(attempt(1) + attempt(2))
    page.goto(_dashboard_url(train_server))
    page.goto(f"{train_server.url}/jobs/{job.id}")
    chart = page.locator('.chart[data-group="loss"]')
    page.wait_for_function("() => document.querySelector('.chart[data-group=\"loss\"]')?.dataset.segments === 'attempt 2'",
                           timeout=30_000)  # fmt: skip
    with open(events, "a") as f:  # the job's next attempt, followed live
        f.write(attempt(3))
    page.wait_for_function(
        "() => document.querySelector('.chart[data-group=\"loss\"]').dataset.segments === 'attempt 2|attempt 3'",
        timeout=30_000,
    )
    assert chart.locator(".last").inner_text() == "loss: 0.33333"
    _shot(page, tmp_path, "job-attempts")
    job.stop()


def test_a_failed_job_shows_the_failing_ranks_traceback(train_server, page, tmp_path):
    job = _trainer(tmp_path, "broken", _fails_on_rank_1).submit()
    assert job.wait(timeout=120).state == "FAILED"
    page.goto(_dashboard_url(train_server))
    page.goto(f"{train_server.url}/jobs/{job.id}")
    error = page.locator("#error")
    assert "rank one broke on purpose" in error.inner_text()
    assert "rank 1" in error.inner_text()
    page.locator("#events tr").first.wait_for()
    assert "ended" in page.locator("#events").inner_text()
    _shot(page, tmp_path, "job-failed")


def test_edge_cases_render_nan_metrics_many_keys_a_long_log_and_many_jobs(train_server, page, tmp_path):
    many = {f"metric_{i:03d}": float(i) for i in range(200)}
    odd = _trainer(tmp_path, "odd", _gated, workers=1, steps=3, gates="",
                   extra={"nan": float("nan"), "inf": float("inf"), **many}).submit()  # fmt: skip
    assert odd.wait(timeout=120).state == "SUCCEEDED"
    # A 100,000-line log: a script job that prints it.
    script = tmp_path / "chatty.py"
    script.write_text("for i in range(100_000):\n    print(f'line {i} ' + 'x' * 40)\n")
    chatty = odd.client.submit({"kind": "script", "path": str(script), "name": "chatty", "workers": 1})
    assert chatty.wait(timeout=120).state == "SUCCEEDED"
    # 1,000 jobs (held, so nothing runs).
    for i in range(1000):
        odd.client.submit({"kind": "script", "path": str(script), "name": f"held-{i}", "hold": True})
    page.goto(_dashboard_url(train_server))
    assert page.locator("#jobs tr").count() == 50  # a page of the newest, and a link to older ones
    page.locator("a.more").click()
    page.locator("#jobs tr").first.wait_for()
    page.goto(f"{train_server.url}/?state=SUCCEEDED")
    assert page.locator("#jobs tr").count() == 2
    _shot(page, tmp_path, "jobs-filtered")
    page.goto(f"{train_server.url}/jobs/{odd.id}")
    page.wait_for_function("() => document.querySelectorAll('.chart').length >= 200", timeout=30_000)
    page.locator('.chart[data-group="nan"]').wait_for()
    page.goto(f"{train_server.url}/jobs/{chatty.id}")
    page.wait_for_function("() => document.getElementById('log').textContent.includes('line 99999')",
                           timeout=30_000)  # fmt: skip
    assert "line 0 " not in page.locator("#log").inner_text()  # it opened at the tail
    # A long series: the page loads it downsampled (min/max/last buckets), and the spike survives.
    long = _trainer(tmp_path, "long", _many_reports, workers=1, steps=5000, spike_at=2500).submit()
    assert long.wait(timeout=120).state == "SUCCEEDED"
    series = long.client.request("GET", f"/jobs/{long.id}/series", params={"points": 100})
    assert series["n"] == 5000 and len(series["series"]["spiky"]["max"]) == 100
    assert max(series["series"]["spiky"]["max"]) == 100.0 and series["series"]["spiky"]["last"][-1] == 1.0
    page.goto(f"{train_server.url}/jobs/{long.id}")
    chart = page.locator('.chart[data-group="spiky"]')
    chart.get_by_text("spiky max").wait_for()  # drawn as a band
    # Zooming asks the server for the zoomed range in finer buckets: here one per report.
    chart.evaluate("el => el.addEventListener('tf-refined', (e) => { window.__refined = e.detail; })")
    box = chart.locator(".u-over").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    refined = page.wait_for_function("() => window.__refined", timeout=30_000).json_value()
    assert refined["buckets"] == refined["reports"] and 300 < refined["reports"] < 1000  # ~10% of 5000
    page.goto(f"{train_server.url}/queue")
    assert "held" in page.locator("main").inner_text()
    for ran in (odd, chatty, long):  # the timeline has a bar for every job that ran
        assert page.locator(f'svg.timeline rect[data-job="{ran.id}"]').count() == 1
    _shot(page, tmp_path, "queue")
    page.goto(f"{train_server.url}/jobs/999999")
    assert "No job 999999" in page.locator("h1").inner_text()


def test_compare_groups_jobs_by_a_config_key(train_server, page, tmp_path):
    jobs = [_trainer(tmp_path, f"cmp-{i}", _gated, workers=1, steps=4, gates="", lr=lr, scale=scale).submit()
            for i, (lr, scale) in enumerate(((0.1, 1.0), (0.1, 1.2), (0.01, 2.0)))]  # fmt: skip
    for job in jobs:
        assert job.wait(timeout=120).state == "SUCCEEDED"
        assert job.client.request("GET", f"/jobs/{job.id}")["config"]["lr"] in (0.1, 0.01)  # recorded at submit
    page.goto(_dashboard_url(train_server))
    page.goto(f"{train_server.url}/compare?name=cmp-&metric=loss&group=lr")
    page.wait_for_function("() => document.getElementById('compare').dataset.drawn >= 1", timeout=30_000)
    legend = page.locator("#compare .u-legend .u-series")
    labels = legend.all_inner_texts()
    for job in jobs:
        assert any(f"job {job.id} · lr=" in text for text in labels), labels
    # Jobs with the same value share a colour, the other value has another.
    colours = {}
    for job in jobs:
        marker = legend.filter(has_text=f"job {job.id} ·").locator(".u-marker")
        colours[job.id] = marker.evaluate("el => getComputedStyle(el).borderColor")
    assert colours[jobs[0].id] == colours[jobs[1].id] != colours[jobs[2].id]
    groups = page.locator("table.groups tbody tr").all_inner_texts()
    assert [g.split("\t")[:5] for g in groups] == [["0.01", "1", "0.5", "0.5", "0.5"], ["0.1", "2", "0.275", "0.25", "0.3"]]
    _shot(page, tmp_path, "compare")
    page.goto(f"{train_server.url}/compare")  # nothing picked: says what to do
    assert "Pick jobs" in page.locator("#nocompare").inner_text()


# A script job that writes its runs' events itself (as fit() would: a run, three reports of "loss"), so
# that many jobs with metrics cost a runner each and no workers.
FAKE_REPORTS = """
import json, os, sys, time
lr, t = float(sys.argv[1]), time.time()
with open(os.environ["TRAINFORGE_JOB_EVENTS"], "a") as f:
    f.write(json.dumps({"type": "run_start", "run_path": sys.argv[2], "name": "fake", "num_workers": 1,
                        "job_attempt": 1, "t": t}) + "\\n")
    for i in range(3):
        f.write(json.dumps({"type": "report", "index": i, "attempt": 0, "metrics": {"loss": lr / (i + 1)},
                            "checkpoint": None, "t": t + i}) + "\\n")
"""


def test_memory_reads_as_the_cli_shows_it_and_a_continuous_key_gets_a_colour_scale(tmp_path, page):
    """Memory in bytes as the CLI shows it (``21.5 GiB``, not ``2.3129e+10``), in the pages and their
    script alike; the compare page colours jobs by a float key of many values with a continuous scale
    whose legend is rounded, instead of a legend entry per job in full precision."""
    from trainforge._testing.server import TrainServer

    server = TrainServer(str(tmp_path / "server"), capacity="CPU=2,memory=23129000000").start()
    try:
        client = server.client()
        script = tmp_path / "fake_reports.py"
        script.write_text(FAKE_REPORTS)
        values = [round(0.1500972585123 * (1 + 0.37 * i), 12) for i in range(12)]
        jobs = [client.submit({"kind": "script", "path": str(script), "args": [str(lr), str(tmp_path / f"run{i}")],
                               "name": f"cont-{i}", "config": {"lr": lr}}) for i, lr in enumerate(values)]  # fmt: skip
        for job in jobs:
            assert job.wait(timeout=120).state == "SUCCEEDED"
        page.goto(f"{server.url}/?token={server.token}")
        assert "memory: 0 B/21.5 GiB used" in page.locator("#summary").inner_text()
        page.goto(f"{server.url}/queue")
        assert "memory\t21.5 GiB\t0 B\t21.5 GiB" in page.locator("table").first.inner_text()
        # The pages' script prints bytes by the same rule as the server and the CLI.
        sizes = [0, 100, 1023, 1023.6, 1024, 1280, 10_300, 1_048_575, 2.3129e10, 5e15, 2**60]
        shown = page.evaluate("async (sizes) => { const m = await import('/static/units.js'); "
                              "return sizes.map((n) => m.fmtBytes(n)); }", sizes)  # fmt: skip
        assert shown == [fmt_bytes(n) for n in sizes]

        page.goto(f"{server.url}/compare?name=cont-&metric=loss&group=lr")
        page.wait_for_function("() => document.getElementById('compare').dataset.drawn >= 1", timeout=30_000)
        box = page.locator("#compare")
        assert (box.get_attribute("data-jobs"), box.get_attribute("data-legend")) == ("12", "continuous")
        assert page.locator("#compare .u-legend").count() == 0  # no entry per job
        legend = page.locator("#compare-legend")
        assert legend.get_attribute("data-kind") == "continuous"
        ends = legend.locator(".gradient-labels span").all_inner_texts()
        assert ends[0] == "0.15" and ends[-1] == "0.761" and all(len(e) <= 6 for e in ends), ends
        groups = [row.split("\t")[0] for row in page.locator("table.groups tbody tr").all_inner_texts()]
        assert groups == [f"{v:.4g}" for v in values]  # in order, rounded: 0.1501, 0.2056, ...
        _shot(page, tmp_path, "compare-continuous")
    finally:
        left = server.cleanup()
    assert not left, left


def test_a_checkpoint_shows_its_size_and_its_resume_command_works(train_server, page, tmp_path):
    job = _trainer(tmp_path, "ckpt", _checkpointing, workers=1, steps=3).submit()
    assert job.wait(timeout=120).state == "SUCCEEDED"
    page.goto(_dashboard_url(train_server))
    page.goto(f"{train_server.url}/jobs/{job.id}")
    rows = page.locator("#checkpoints tr")
    page.wait_for_function("() => document.querySelectorAll('#checkpoints tr').length === 3", timeout=30_000)
    size = job.client.request("GET", f"/jobs/{job.id}/checkpoints")["checkpoints"][0]["size"]
    assert 10_000 < size < 11_000  # the weights, the step file and the checkpoint's metadata
    assert fmt_bytes(size) in rows.first.inner_text()  # the CLI's rule for bytes (static/units.js)
    command = rows.first.locator("td.resume code").inner_text()
    assert command.startswith(f"trainforge retry {job.id} --checkpoint ")
    rows.first.locator("button.copy").click()  # copies, or selects it where the clipboard is not allowed
    # The command, as a user pastes it: a new run starting from the first checkpoint (step 0).
    argv = shlex.split(command)
    out = subprocess.run([sys.executable, "-m", "trainforge", *argv[1:], "--state-dir", train_server.state_dir],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert job.wait(timeout=120).state == "SUCCEEDED"
    assert job.client.request("GET", f"/jobs/{job.id}")["last_metrics"] == {"step": 2, "resumed_at": 1}
