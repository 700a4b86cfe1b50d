"""trainforge.tune end to end: Ray Tune's documented examples with only the import changed (quick
start, ASHA, Optuna search, PBT, Train inside Tune), every trainable kind, failures, stopping, bad
input and a tuner killed with SIGKILL that continues. Every trial is a real train run (worker
processes); the autouse fixture fails a test that leaves one behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import trainforge
from trainforge import (
    DataParallelTrainer,
    ScalingConfig,
    tune,  # was: from ray import tune
)
from trainforge._testing.procs import RUN_ENV
from trainforge.tune import RunConfig, TuneConfig, Tuner

pytestmark = pytest.mark.slow
SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _rc(tmp_path, name, **kw):
    return RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **kw)


# -- Ray Tune's "Getting Started" example ------------------------------------------------------------
def objective(x, a, b):
    return a * (x**0.5) + b


def trainable(config):
    for x in range(20):
        score = objective(x, config["a"], config["b"])
        tune.report({"score": score})


def test_quick_start_grid_and_random_axes(tmp_path):
    tuner = Tuner(
        trainable,
        param_space={"a": tune.grid_search([0.001, 0.01, 0.1, 1.0]), "b": tune.choice([1, 2, 3])},
        tune_config=TuneConfig(metric="score", mode="max", num_samples=2),
        run_config=_rc(tmp_path, "quickstart"),
    )
    grid = tuner.fit()
    assert len(grid) == 8 and grid.num_errors == 0 and grid.num_terminated == 8
    assert [r.config["a"] for r in grid] == [0.001, 0.01, 0.1, 1.0] * 2  # grid order, repeated
    best = grid.get_best_result()
    assert best.config["a"] == 1.0 and best.metrics["training_iteration"] == 20
    assert best.metrics["score"] == pytest.approx(objective(19, 1.0, best.config["b"]))
    assert grid.experiment_path == str(tmp_path / "results" / "quickstart")
    for r in grid:  # each trial is a train run with its own directory under the experiment's
        assert os.path.dirname(r.path) == grid.experiment_path and os.path.exists(os.path.join(r.path, "run_state.json"))
        assert list(r.metrics_dataframe["training_iteration"]) == list(range(1, 21))
    df = grid.get_dataframe()
    assert {"config/a", "config/b", "score"} <= set(df.columns) and len(df) == 8
    lowest = min(grid, key=lambda r: r.metrics["score"])
    assert grid.get_best_result(metric="score", mode="min") is lowest


def test_asha_stops_the_bad_trials_early_and_leaves_no_process(tmp_path):
    from trainforge.tune.schedulers import ASHAScheduler

    def slow(config):
        for step in range(30):
            time.sleep(0.01)
            tune.report({"loss": config["x"] + 1.0 / (step + 1)})

    scheduler = ASHAScheduler(max_t=30, grace_period=2, reduction_factor=3)
    grid = Tuner(slow, param_space={"x": tune.grid_search([float(i) for i in range(12)])},
                 tune_config=TuneConfig(metric="loss", mode="min", scheduler=scheduler),
                 run_config=_rc(tmp_path, "asha")).fit()  # fmt: skip
    iters = {r.config["x"]: r.metrics["training_iteration"] for r in grid}
    assert grid.num_errors == 0
    assert iters[0.0] == 30  # the best trial runs to max_t
    assert sum(1 for n in iters.values() if n < 30) >= 6  # most were stopped at a rung
    assert all(n in (2, 6, 18, 30) or n >= 2 for n in iters.values())
    assert grid.get_best_result().config["x"] == 0.0


def test_optuna_search_beats_random_on_a_quadratic(tmp_path):
    from trainforge.tune.search.optuna import OptunaSearch

    def quad(config):
        tune.report({"loss": (config["x"] - 0.7) ** 2 + (config["y"] + 0.2) ** 2})

    space = {"x": tune.uniform(-2, 2), "y": tune.uniform(-2, 2)}
    optuna_grid = Tuner(quad, param_space=space, run_config=_rc(tmp_path, "optuna"),
                        tune_config=TuneConfig(metric="loss", mode="min", num_samples=30,
                                               search_alg=OptunaSearch(seed=0, points_to_evaluate=[{"x": 0.0, "y": 0.0}]))).fit()  # fmt: skip
    assert optuna_grid[0].config == {"x": 0.0, "y": 0.0}  # points_to_evaluate first, verbatim
    best = optuna_grid.get_best_result().metrics["loss"]
    assert best < 0.05, best


def test_pbt_exploits_a_better_trial_from_its_checkpoint(tmp_path):
    from trainforge.tune.schedulers import PopulationBasedTraining

    def grow(config):
        w = 0.0
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d, open(os.path.join(d, "w.json")) as f:
                w = json.load(f)["w"]
        for _ in range(40):
            w += config["lr"]
            time.sleep(0.005)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "w.json"), "w") as f:
                    json.dump({"w": w}, f)
                tune.report({"w": w}, checkpoint=tune.Checkpoint.from_directory(d))

    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=5,
                                  hyperparam_mutations={"lr": [0.01, 0.1, 1.0]}, seed=0)  # fmt: skip
    grid = Tuner(grow, param_space={"lr": tune.grid_search([0.01, 0.01, 0.01, 1.0])},
                 tune_config=TuneConfig(metric="w", mode="max", scheduler=pbt),
                 run_config=_rc(tmp_path, "pbt")).fit()  # fmt: skip
    assert grid.num_errors == 0 and pbt.exploit_history
    assert all(r.config["lr"] in (0.01, 0.1, 1.0) for r in grid)
    # A trial that exploited continued from the better trial's weights: it ends far above 40 * 0.01.
    assert sum(1 for r in grid if r.metrics["w"] > 1.0) >= 2


def test_train_inside_tune_a_trainer_fitted_in_the_trial_reports_to_the_tuner(tmp_path):
    from trainforge.tune.integration.ray_train import TuneReportCallback

    def train_loop(config):
        for epoch in range(3):
            trainforge.report({"loss": config["lr"] / (epoch + 1), "rank": trainforge.get_context().get_world_rank()})

    def train_driver_fn(config):
        trainer = DataParallelTrainer(
            train_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
            run_config=trainforge.RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                            storage_path=str(tmp_path / "inner"), verbose=0,
                                            callbacks=[TuneReportCallback()]),
        )  # fmt: skip
        trainer.fit()

    grid = Tuner(tune.with_resources(train_driver_fn, {"cpu": 0}), param_space={"lr": tune.grid_search([0.1, 1.0])},
                 tune_config=TuneConfig(metric="loss", mode="min"), run_config=_rc(tmp_path, "inner")).fit()  # fmt: skip
    assert grid.num_errors == 0
    assert [r.metrics["training_iteration"] for r in grid] == [3, 3]
    assert grid.get_best_result().config["lr"] == 0.1 and grid.get_best_result().metrics["loss"] == pytest.approx(0.1 / 3)


def test_a_trainer_is_a_trainable_with_its_config_merged(tmp_path):
    def loop(config):
        ctx = trainforge.get_context()
        assert tune.get_context().get_trial_resources().required_resources == {"CPU": 1.0}
        for i in range(2):
            trainforge.report({"acc": config["lr"] * (i + 1), "keep": config["keep"], "ws": ctx.get_world_size()})

    trainer = DataParallelTrainer(loop, train_loop_config={"lr": 0.5, "keep": "me"},
                                  scaling_config=ScalingConfig(num_workers=2))  # fmt: skip
    grid = Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.2])},
                                       "scaling_config": ScalingConfig(num_workers=1)},
                 tune_config=TuneConfig(metric="acc", mode="max"), run_config=_rc(tmp_path, "trainer")).fit()  # fmt: skip
    assert grid.num_errors == 0, grid.errors
    assert [(r.metrics["acc"], r.metrics["keep"], r.metrics["ws"]) for r in grid] == [(0.2, "me", 1), (0.4, "me", 1)]


def test_async_trainable_and_with_parameters(tmp_path):
    async def atrain(config, data):
        for i in range(3):
            await asyncio.sleep(0)
            tune.report({"v": config["k"] * len(data) + i})

    grid = Tuner(tune.with_parameters(atrain, data=list(range(10))), param_space={"k": tune.grid_search([1, 2])},
                 run_config=_rc(tmp_path, "async")).fit()  # fmt: skip
    assert [r.metrics["v"] for r in grid] == [12, 22]


def test_a_failing_trial_is_retried_then_recorded_while_the_others_go_on(tmp_path):
    def flaky(config):
        checkpoint = tune.get_checkpoint()
        if config["fail"] == "always" or (config["fail"] == "once" and checkpoint is None):
            with tempfile.TemporaryDirectory() as d:
                tune.report({"ok": 0}, checkpoint=tune.Checkpoint.from_directory(d))
            raise RuntimeError(f"trial broke on purpose ({config['fail']})")
        tune.report({"ok": 1})

    grid = Tuner(flaky, param_space={"fail": tune.grid_search(["never", "once", "always"])},
                 run_config=_rc(tmp_path, "failing", failure_config=tune.FailureConfig(max_failures=1))).fit()  # fmt: skip
    assert [r.metrics["ok"] for r in grid] == [1, 1, 0]
    assert grid.num_errors == 1 and "trial broke on purpose (always)" in str(grid.errors[0])


def test_stop_criteria_and_time_budget(tmp_path):
    def forever(config):
        i = 0
        while True:
            i += 1
            time.sleep(0.01)
            tune.report({"i": i})

    grid = Tuner(forever, param_space={}, run_config=_rc(tmp_path, "stop", stop={"training_iteration": 5})).fit()
    assert grid[0].metrics["training_iteration"] == 5 and grid.num_errors == 0  # the triggering result is the last
    started = time.monotonic()
    grid = Tuner(forever, param_space={"k": tune.grid_search([1, 2])}, run_config=_rc(tmp_path, "budget"),
                 tune_config=TuneConfig(time_budget_s=1.0)).fit()  # fmt: skip
    assert time.monotonic() - started < 30 and grid.num_errors == 0 and grid.num_terminated == 2


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tune_config": TuneConfig(metric="nope", mode="min")}, "without the metric 'nope'"),
    ],
)
def test_a_metric_never_reported_errors_the_trial_naming_it(tmp_path, kwargs, words):
    grid = Tuner(trainable, param_space={"a": 1, "b": 2}, run_config=_rc(tmp_path, "nometric"), **kwargs).fit()
    assert grid.num_errors == 1 and words in str(grid.errors[0]) and "score" in str(grid.errors[0])


def test_bad_input_is_refused_before_any_trial_runs(tmp_path):
    with pytest.raises(ValueError, match="exactly one argument"):
        Tuner(lambda a, b: None)
    with pytest.raises(ValueError, match="mode"):
        TuneConfig(mode="maximum")
    with pytest.raises(ValueError, match="num_samples"):
        TuneConfig(num_samples=0)

    class RayDomain:  # what `from ray import tune; tune.uniform(...)` gives, unported
        __module__ = "ray.tune.search.sample"

        def sample(self):
            return 0

    with pytest.raises(ValueError, match=r'param_space\["lr"\] is a Ray Tune search space'):
        Tuner(trainable, param_space={"lr": RayDomain()}, run_config=_rc(tmp_path, "bad"))
    with pytest.raises(ValueError, match="exactly one argument"):
        Tuner(lambda a, b: None, run_config=_rc(tmp_path, "bad")).fit()
    with pytest.raises(ValueError, match="stop"):
        RunConfig(stop=42)
    assert not os.path.exists(tmp_path / "results")


def test_gang_packing_two_worker_trials_on_two_cpus_run_one_at_a_time(tmp_path):
    def loop(config):
        trainforge.report({"t0": time.time()})
        time.sleep(0.3)
        trainforge.report({"t1": time.time()})

    trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2))
    os.environ["TRAINFORGE_LOCAL_RESOURCES"] = json.dumps({"CPU": 2})
    try:
        grid = Tuner(trainer, param_space={"train_loop_config": {"k": tune.grid_search([1, 2, 3])}},
                     run_config=_rc(tmp_path, "gang")).fit()  # fmt: skip
    finally:
        del os.environ["TRAINFORGE_LOCAL_RESOURCES"]
    spans = sorted((r.metrics_history[0]["t0"], r.metrics_history[1]["t1"]) for r in grid)
    assert grid.num_errors == 0 and len(spans) == 3
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False))  # never two at once


def _start_halfway(tmp_path):
    """tests/scripts/tune_killed.py started, returned once two of its trials finished and the third
    is a few steps in; also the environment to run it again."""
    script = os.path.join(SCRIPTS, "tune_killed.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(trainforge.__file__)), SCRIPTS])}
    # Ctrl-C as in a terminal: a background shell (nohup ... &) starts us with SIGINT ignored, which
    # the tuner would inherit, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen([sys.executable, script, str(tmp_path)], env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    state = tmp_path / "results" / "killed" / "experiment_state.json"
    log = tmp_path / "steps.log"
    deadline = time.monotonic() + 120
    trials: list = []
    while time.monotonic() < deadline:  # until two trials finished and the third is a few steps in
        try:
            trials = json.loads(state.read_text())["trials"]
            steps = [line.split() for line in log.read_text().splitlines()]
        except (OSError, ValueError):  # not written yet, or being replaced
            steps = []
        done = [t for t in trials if t["status"] == "TERMINATED"]
        if len(done) == 2 and any(i == "2" and int(step) >= 3 for i, step, _ in steps):
            return proc, script, env
        time.sleep(0.02)  # polling the tuner's files: it has no other channel to this test
    proc.kill()
    pytest.fail(f"the tuner never got halfway: {trials}")


def _assert_gone(tmp_path):
    """Every worker the tuner script started, and its warm fork server, have exited (they are not
    this test's children once the tuner is gone, so the autouse check would not see them)."""
    import psutil

    pids = {int(line.split()[2]) for line in (tmp_path / "steps.log").read_text().splitlines()}
    warm = [p for p in psutil.process_iter(["cmdline"])
            if any("trainforge_tune_warm_" in part for part in p.info["cmdline"] or []) and _of_this_worker(p)]  # fmt: skip
    procs = [p for p in (_process(pid) for pid in pids) if p is not None] + warm
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"left behind: {alive}"


def _of_this_worker(p):
    """Started by this test process (its run tag, which pytest-xdist workers each have their own of)."""
    import psutil

    try:
        return p.environ().get(RUN_ENV) == os.environ.get(RUN_ENV)
    except psutil.Error:
        return False


def _of_this_worker(p):
    """Started by this test process (its run tag, which pytest-xdist workers each have their own of)."""
    import psutil

    try:
        return p.environ().get(RUN_ENV) == os.environ.get(RUN_ENV)
    except psutil.Error:
        return False


def _process(pid):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_ctrl_c_stops_every_trial_and_saves_the_experiment_to_continue(tmp_path):
    proc, script, env = _start_halfway(tmp_path)
    proc.send_signal(signal.SIGINT)  # Ctrl-C in the tuner's terminal reaches the tuner only
    assert proc.wait(timeout=60) != 0  # KeyboardInterrupt, re-raised after saving
    _assert_gone(tmp_path)
    trials = json.loads((tmp_path / "results" / "killed" / "experiment_state.json").read_text())["trials"]
    assert [t["status"] for t in trials[:3]] == ["TERMINATED", "TERMINATED", "PENDING"]  # not finished
    before = len((tmp_path / "steps.log").read_text().splitlines())
    out = subprocess.run([sys.executable, script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=180)
    assert "DONE 4 0" in out.stdout, out.stdout + out.stderr
    after = [line.split() for line in (tmp_path / "steps.log").read_text().splitlines()[before:]]
    assert {i for i, _, _ in after} == {"2", "3"} and int(after[0][1]) > 0  # trial 2 went on from its checkpoint


def test_a_tuner_killed_with_sigkill_continues_without_rerunning_finished_trials(tmp_path):
    proc, script, env = _start_halfway(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner (its workers die with it: they watch their driver)
    proc.wait()
    _assert_gone(tmp_path)
    log = tmp_path / "steps.log"
    before = log.read_text().splitlines()
    out = subprocess.run([sys.executable, script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=180)
    assert "DONE 4 0" in out.stdout, out.stdout + out.stderr
    after = log.read_text().splitlines()[len(before):]
    rerun = {line.split()[0] for line in after}
    assert "0" not in rerun and "1" not in rerun  # finished trials were not run again
    resumed = [int(line.split()[1]) for line in after if line.split()[0] == "2"]
    assert resumed and resumed[0] > 0  # the interrupted trial went on from its checkpoint
    assert "continuing" in out.stdout


def test_train_never_imports_tune():
    root = os.path.dirname(trainforge.__file__)
    above = {os.path.join(root, "_cli.py")}  # the composition root, above every layer (its commands include tune's)
    offenders = []
    for dirpath, _, files in os.walk(root):
        if os.path.join(root, "tune") in dirpath or os.path.join(root, "_testing") in dirpath:
            continue
        for name in files:
            if name.endswith(".py") and os.path.join(dirpath, name) not in above:
                with open(os.path.join(dirpath, name)) as f:
                    if "trainforge.tune" in f.read():
                        offenders.append(os.path.join(dirpath, name))
    assert offenders == []
    out = subprocess.run([sys.executable, "-c", "import trainforge, trainforge.server, sys; "
                          "print(any(m.startswith('trainforge.tune') for m in sys.modules))"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr


def test_a_hundred_asha_stopped_trials_leave_no_process_behind(tmp_path):
    import psutil

    from trainforge.tune.schedulers import ASHAScheduler

    def slow(config):
        for step in range(20):
            time.sleep(0.01)
            tune.report({"loss": config["x"] + 1.0 / (step + 1)})

    tuner = Tuner(slow, param_space={"x": tune.uniform(0, 1)}, run_config=_rc(tmp_path, "hundred"),
                  tune_config=TuneConfig(metric="loss", mode="min", num_samples=100,
                                         scheduler=ASHAScheduler(max_t=20, grace_period=1, reduction_factor=2)))  # fmt: skip
    grid = tuner.fit()
    stopped = [r for r in grid if r.metrics["training_iteration"] < 20]
    assert len(grid) == 100 and grid.num_errors == 0 and len(stopped) >= 50
    assert psutil.Process().children(recursive=True) == []  # every trial's worker is gone
    controller = tuner.last_controller
    assert controller is not None and controller.free == controller.capacity  # every gang went back


def test_stopped_trials_end_their_loop_at_the_next_report(tmp_path):
    """A trial the scheduler stops ends cleanly at its next report(): SystemExit(0) from report, so
    the loop's finally blocks run and a broad `except Exception` does not swallow it."""
    from trainforge.tune.schedulers import ASHAScheduler

    marks = tmp_path / "marks"
    marks.mkdir()

    def fn(config):
        step = 0
        try:
            for step in range(50):
                try:
                    tune.report({"loss": config["x"] + 1.0 / (step + 1)})
                except Exception:  # noqa: BLE001
                    (marks / f"swallowed_{config['x']}").write_text("")
                time.sleep(0.01)
        except SystemExit as exc:
            (marks / f"{config['x']}").write_text(f"{type(exc).__name__} {exc.code} {step}")
            raise

    grid = Tuner(fn, param_space={"x": tune.grid_search([0.0, 1.0, 2.0, 3.0])}, run_config=_rc(tmp_path, "clean"),
                 tune_config=TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                        scheduler=ASHAScheduler(max_t=50, grace_period=2, reduction_factor=2))).fit()  # fmt: skip
    stopped = {r.config["x"]: r.metrics["training_iteration"] for r in grid if r.metrics["training_iteration"] < 50}
    assert grid.num_errors == 0 and stopped, {r.config["x"]: r.metrics["training_iteration"] for r in grid}
    texts = {f.name: f.read_text() for f in marks.iterdir()}
    assert not any(k.startswith("swallowed") for k in texts), texts
    for x, iteration in stopped.items():
        kind, code, step = texts[str(x)].split()
        # Ended by the report right after the one that stopped it (its index = iteration).
        assert (kind, code) == ("StopTraining", "0") and int(step) >= iteration - 1, texts


def test_warm_processes_start_trials_forked_from_one_server_with_no_state_carried_over(tmp_path):
    """reuse_actors (the default): trial workers are forked from a warm fork server (their parent is
    not this process), yet each trial has processes of its own: a global one trial sets is not seen
    by the next (Ray's reused actors would carry it). reuse_actors=False: fresh children of ours."""
    from trainforge._internal.zygote import ENV_ZYGOTE

    def fn(config):
        import trainforge as tf_mod

        seen = getattr(tf_mod, "_tune_test_leak", None)
        tf_mod._tune_test_leak = config["i"]
        tune.report({"parent": os.getppid(), "pid": os.getpid(), "seen": -1 if seen is None else seen})

    for reuse in (None, False):
        grid = Tuner(fn, param_space={"i": tune.grid_search(list(range(4)))}, run_config=_rc(tmp_path, f"warm{reuse}"),
                     tune_config=TuneConfig(reuse_actors=reuse, max_concurrent_trials=1)).fit()  # fmt: skip
        rows = [r.metrics for r in grid]
        assert grid.num_errors == 0 and [m["seen"] for m in rows] == [-1] * 4  # nothing carried over
        assert len({m["pid"] for m in rows}) == 4
        parents = {m["parent"] for m in rows}
        if reuse is None:
            assert len(parents) == 1 and parents != {os.getpid()}  # all forked by the one warm server
        else:
            assert parents == {os.getpid()}
        assert ENV_ZYGOTE not in os.environ  # nothing of it outlives fit()


def test_warm_preload_names_installed_libraries_never_the_users_modules():
    import numpy

    from trainforge.torch import TorchTrainer
    from trainforge.tune._warm import preload_modules

    def fn(config):
        import json  # imported inside

        return numpy.zeros(1), _rc, json  # a library and a function of this (user) module

    mods = preload_modules(fn)
    assert {"numpy", "json", "trainforge"} <= set(mods) and __name__ not in mods and "torch" not in mods
    torch_mods = preload_modules(TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1)))
    assert {"torch", "torch._dynamo", "trainforge.torch"} <= set(torch_mods)
    assert "cloudpickle" in preload_modules(tune.with_parameters(lambda config, data: None, data=1))


def test_tune_public_names():
    assert tune.__all__ == sorted(tune.__all__)
    assert {"Tuner", "TuneConfig", "RunConfig", "ResultGrid", "report", "get_checkpoint", "get_context",
            "with_parameters", "with_resources", "grid_search", "uniform", "choice"} <= set(tune.__all__)  # fmt: skip
