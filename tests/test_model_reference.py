"""Models by reference: ``Registry.put`` registers a definition (class, default config, search space, data;
no weights) that ModelTrainer, Tuner, load_model and ``trainforge train`` take by its URI; what is
trained from it records it in its lineage; serving refuses a definition."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainforge import RunConfig, tune
from trainforge.model import Data, LoopConfig, Model, ModelTrainer, XGBoostModel
from trainforge.model._gbdt import XGBoostModelTrainer
from trainforge.registry import ModelNotFoundError, Registry, load_model

pytest.importorskip("xgboost")
REPO = Path(__file__).resolve().parents[1]


class Rows(Data):
    label_column = "label"

    def setup(self, config: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import pandas as pd

        x = np.random.default_rng(0).random((200, 2))
        data = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "label": (x.sum(1) > 1).astype(int)})
        return {"train": data.iloc[:160], "valid": data.iloc[160:]}


class Boosted(XGBoostModel):
    def setup(self, config: dict[str, Any]) -> None:
        self.register(params={"objective": "binary:logistic", "eval_metric": "error", "max_depth": config["max_depth"]},
                      num_boost_round=config.get("rounds", 6))  # fmt: skip


def test_put_stores_a_definition_and_load_model_builds_it_untrained(tmp_path):
    reg = Registry()
    ref = reg.put(Boosted, "boosted", config={"max_depth": 2, "rounds": 4}, data=Rows,
                  hyperparameter_space={"max_depth": tune.grid_search([2, 3])}, description="a booster")  # fmt: skip
    assert str(ref) == ref.uri == "models:/boosted/1"
    assert ref.kind == "definition" and ref.framework == "xgboost"
    assert ref.model_class == "test_model_reference:Boosted"
    assert sorted(ref.files) == ["hyperparameter_space.pkl", "model.json"]  # no weights; Rows by import path
    manifest = json.loads(Path(reg.local_dir(ref), "model.json").read_text())
    assert manifest["kind"] == "definition" and manifest["data"] == "test_model_reference:Rows"

    model = load_model(ref.uri, config={"max_depth": 5})
    assert isinstance(model, Boosted) and model.booster is None
    assert model.config == {"max_depth": 5, "rounds": 4} and model.params["max_depth"] == 5
    assert reg.load("models:/boosted/1").config == {"max_depth": 2, "rounds": 4}
    definition = reg.definition("models:/boosted")
    assert definition.model_cls is Boosted and definition.data is Rows and definition.uri == ref.uri
    assert definition.hyperparameter_space == {"max_depth": tune.grid_search([2, 3])}

    trainer = ModelTrainer("models:/boosted", config={"rounds": 3})
    assert type(trainer) is XGBoostModelTrainer and trainer.data is Rows
    assert trainer.config == {"max_depth": 2, "rounds": 3} and trainer.metadata["model_definition"] == ref.uri

    with pytest.raises(ModelNotFoundError, match="has no trained version"):
        reg.get("boosted", kind="trained")
    from trainforge.serve._source import ModelGoneError, RegistrySource

    with pytest.raises(ValueError, match="is a model definition"):
        RegistrySource("models:/boosted/1").resolve()
    with pytest.raises(ModelGoneError, match="no trained version"):
        RegistrySource("models:/boosted").resolve()
    with pytest.raises(ModelNotFoundError, match="no model 'nothing-here'"):
        reg.definition("models:/nothing-here")
    reg.register("trained-only", reg.local_dir(ref))  # a version that is no definition... of kind definition
    with pytest.raises(ModelNotFoundError, match="has no trained version"):
        reg.get("trained-only", kind="trained")
    with pytest.raises(ValueError, match="give a model class"):
        reg.put(Rows, "rows")


@pytest.mark.slow
def test_put_by_value_loads_where_the_class_cannot_be_imported(tmp_path):
    reg = Registry()
    ref = reg.put(Boosted, "by-value", config={"max_depth": 2}, data=Rows, by_value=True)
    assert {"model_class.pkl", "data_class.pkl"} <= set(ref.files)
    code = ("import sys; from trainforge.registry import Registry\n"
            f"d = Registry({reg.url!r}).definition('models:/by-value')\n"
            "print(d.model_cls.__name__, d.data.__name__, d.build().params['max_depth'])\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip  # tests/ not importable there
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Boosted", "Rows", "2"]


@pytest.mark.slow
def test_tuner_searches_a_definitions_stored_space_and_the_best_records_its_definition(tmp_path):
    reg = Registry()
    ref = reg.put(Boosted, "tuned", config={"max_depth": 2}, data=Rows,
                  hyperparameter_space={"max_depth": tune.grid_search([1, 3])})  # fmt: skip
    grid = tune.Tuner("models:/tuned", tune_config=tune.TuneConfig(metric="valid-error", mode="min", server=False),
                      run_config=RunConfig(storage_path=str(tmp_path), verbose=0)).fit()  # fmt: skip
    assert not grid.errors and sorted(r.config["train_loop_config"]["max_depth"] for r in grid) == [1, 3]
    best = grid.get_best_result()
    mv = reg.register("tuned", best, alias="prod")
    assert mv.kind == "trained" and mv.version == 2 and mv.lineage["definition"] == ref.uri
    with pytest.raises(ValueError, match="holds a trained Boosted"):
        load_model(mv.uri, config={"max_depth": 9})
    tree = reg.lineage("tuned")
    assert [d["definition"] for d in tree] == [ref.uri]
    assert tree[0]["runs"][0]["versions"][0]["uri"] == mv.uri
    assert tree[0]["runs"][0]["versions"][0]["aliases"] == ["prod"]
    assert tree[0]["runs"][0]["run_path"] == mv.lineage["run_path"]


@pytest.mark.slow
def test_a_torch_definition_trains_with_its_own_setup_data(tmp_path):
    torch = pytest.importorskip("torch")

    class Tiny(Model):
        def setup(self, config: dict[str, Any]) -> None:
            net = torch.nn.Linear(2, 1)
            self.register(models=net, optimizers=torch.optim.SGD(net.parameters(), lr=config["lr"]),
                          criterion=torch.nn.MSELoss())  # fmt: skip

        def setup_data(self, config: dict[str, Any]) -> None:
            x = torch.randn(64, 2)
            self.register_data(train_loader=torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16))  # fmt: skip

    reg = Registry()
    ref = reg.put(Tiny, "tiny", config={"lr": 0.1})  # defined in a function: stored by value
    result = ModelTrainer(ref, loop_config=LoopConfig(num_epochs=2), run_config=RunConfig(verbose=0)).fit()
    mv = reg.register("tiny", result)
    assert mv.lineage["definition"] == "models:/tiny/1" and mv.framework == "torch"
    assert reg.load(mv.uri)(torch.ones(1, 2)).shape == (1, 1)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainforge", *args], capture_output=True, text=True, timeout=240,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


@pytest.mark.slow
def test_trainforge_train_trains_a_definition_registers_it_and_models_lineage_shows_it(tmp_path):
    reg = Registry()
    reg.put(Boosted, "cli-boosted", config={"max_depth": 2}, data=Rows, by_value=True)
    proc = _cli("train", "models:/cli-boosted", "--config", "rounds=3", "--config", "max_depth=3", "--workers", "2",
                "--register", "--alias", "prod", "--storage-path", str(tmp_path / "runs"), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "models:/cli-boosted/1 trained: run " in proc.stdout and "valid-error=" in proc.stdout
    assert "registered models:/cli-boosted/2 (alias prod), trained from models:/cli-boosted/1" in proc.stdout
    mv = reg.get("cli-boosted@prod")
    assert mv.lineage["definition"] == "models:/cli-boosted/1"
    assert reg.load(mv.uri).config == {"max_depth": 3, "rounds": 3}
    lineage = _cli("models", "lineage", "cli-boosted", cwd=tmp_path)
    assert lineage.returncode == 0, lineage.stderr
    lines = lineage.stdout.splitlines()
    assert lines[0].startswith("models:/cli-boosted/1  definition of ") and "(xgboost)" in lines[0]
    assert lines[1].startswith("  run ") and lines[2].startswith("    models:/cli-boosted/2 ") and "aliases: prod" in lines[2]

    bad = _cli("train", "models:/cli-boosted", "--epochs", "3", cwd=tmp_path)
    assert bad.returncode == 1 and "--epochs is the PyTorch managed loop's" in bad.stderr
    bad = _cli("train", "models:/cli-boosted", "--submit", "--register", cwd=tmp_path)
    assert bad.returncode == 2 and "needs --wait" in bad.stderr
    bad = _cli("train", "models:/missing", cwd=tmp_path)
    assert bad.returncode == 1 and "no model 'missing'" in bad.stderr

    put = subprocess.run([sys.executable, "-m", "trainforge", "models", "put", "from-cli", "test_model_reference:Boosted",
                          "--config", "max_depth=4", "--data", "test_model_reference:Rows"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})  # fmt: skip
    assert put.returncode == 0, put.stderr
    assert "registered the definition models:/from-cli/1 (test_model_reference:Boosted)" in put.stdout
    definition = reg.definition("models:/from-cli")
    assert definition.config == {"max_depth": 4} and definition.data is Rows


def test_a_reference_without_a_registry_says_what_to_do(monkeypatch):
    from trainforge._internal import extensions
    from trainforge.model._managed import resolve

    monkeypatch.setattr(extensions, "_registered", {})
    monkeypatch.setattr(extensions.importlib.metadata, "entry_points", lambda group: [])
    with pytest.raises(ImportError, match="resolved by the model registry"):
        resolve("models:/x", "ModelTrainer")
    with pytest.raises(ValueError, match="a model reference starts with 'models:/'"):
        resolve("digits-net", "ModelTrainer")


@pytest.mark.slow
def test_a_version_trained_from_a_by_value_definition_loads_where_the_class_cannot_be_imported(tmp_path):
    """Issue 36: the docs' flow (put by value, train, register) stored the *trained* version's class by
    import path, so loading it from another directory failed with "No module named ...". What is
    trained from a by-value definition carries its class by value too."""
    reg = Registry()
    ref = reg.put(Boosted, "trained-by-value", config={"max_depth": 2, "rounds": 3}, data=Rows, by_value=True)
    result = ModelTrainer(ref.uri, run_config=RunConfig(storage_path=str(tmp_path / "runs"), verbose=0)).fit()
    mv = reg.register("trained-by-value", result)
    assert mv.kind == "trained" and "model_class.pkl" in mv.files
    code = ("from trainforge.registry import load_model\n"
            f"m = load_model({mv.uri!r})\n"
            "print(type(m).__name__, m.booster is not None)\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip  # tests/ not importable there
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Boosted", "True"]
