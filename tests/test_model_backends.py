"""The model object for every framework (trainforge.model: XGBoostModel, LightGBMModel, KerasModel beside
the torch Model) and the Data object: the same hooks, ModelTrainer training each through its
framework's integration, the registry loading each without a loader=, serving each, Tune tuning each.

Units first (no process started), then real runs on local workers (XGBoost and LightGBM on 2 workers,
a torch model fed by a Data object, a Keras model marked slow: TensorFlow's start-up is seconds)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainforge import RunConfig, ScalingConfig
from trainforge.model import (
    BaseModel,
    Data,
    KerasModel,
    LightGBMModel,
    LoopConfig,
    Model,
    ModelTrainer,
    XGBoostModel,
)
from trainforge.model._dataset import data_splits
from trainforge.model._gbdt import LightGBMModelTrainer, XGBoostModelTrainer

xgboost = pytest.importorskip("xgboost")


def frame(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """A separable binary problem: label = x0 + x1 > 1."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 3)).astype(np.float32)
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": (x[:, 0] + x[:, 1] > 1).astype(np.int64)})


class Table(Data):
    label_column = "label"

    def setup(self, config: dict[str, Any]) -> dict[str, Any]:
        data = frame(config.get("rows", 240))
        return {"train": data.iloc[:200], "valid": data.iloc[200:]}


class Boosted(XGBoostModel):
    def setup(self, config: dict[str, Any]) -> None:
        self.register(params={"objective": "binary:logistic", "eval_metric": "error",
                              "max_depth": config.get("max_depth", 3)}, num_boost_round=config.get("rounds", 8))  # fmt: skip

    def postprocess(self, probabilities: Any) -> Any:
        return (probabilities > 0.5).astype(int)

    @classmethod
    def hyperparameter_space(cls) -> dict[str, Any]:
        from trainforge import tune

        return {"max_depth": tune.grid_search([2, 4])}


class Light(LightGBMModel):
    def setup(self, config: dict[str, Any]) -> None:
        self.register(params={"objective": "binary", "metric": "binary_error", "verbose": -1, "min_data_in_leaf": 5},
                      num_boost_round=8)  # fmt: skip


def trained_booster(model: XGBoostModel) -> Any:
    data = frame()
    x, y = data.drop(columns=["label"]).to_numpy(), data["label"].to_numpy()
    return xgboost.train(model.params, xgboost.DMatrix(x, label=y), num_boost_round=model.num_boost_round)


# -- units --------------------------------------------------------------------------------------------
def test_model_trainer_hands_each_framework_to_its_integration():
    xgb = ModelTrainer(Boosted, data=Table, config={"max_depth": 2}, scaling_config=ScalingConfig(num_workers=2))
    assert type(xgb) is XGBoostModelTrainer and xgb.config == {"max_depth": 2} and xgb.model_cls is Boosted
    from trainforge.lightgbm import LightGBMTrainer
    from trainforge.xgboost import XGBoostTrainer

    assert isinstance(xgb, XGBoostTrainer)
    assert isinstance(ModelTrainer(Light, data=Table), LightGBMTrainer)
    assert type(ModelTrainer(Light, data=Table())) is LightGBMModelTrainer
    from trainforge.model._keras import KerasModelTrainer
    from trainforge.tensorflow import TensorflowTrainer

    class K(KerasModel):
        def setup(self, config: dict[str, Any]) -> None:
            pass

    keras_trainer = ModelTrainer(K, data=Table)
    assert type(keras_trainer) is KerasModelTrainer and isinstance(keras_trainer, TensorflowTrainer)


def test_a_gbdt_model_trainer_says_what_it_needs():
    with pytest.raises(ValueError, match="trains on data="):
        ModelTrainer(Boosted)

    class NoLabel(Data):
        def setup(self, config: dict[str, Any]) -> dict[str, Any]:
            return {"train": frame()}

    with pytest.raises(ValueError, match="has no label_column"):
        ModelTrainer(Boosted, data=NoLabel)
    with pytest.raises(TypeError, match="loop_config.*PyTorch managed loop"):
        ModelTrainer(Boosted, data=Table, loop_config=LoopConfig())
    with pytest.raises(TypeError, match="not a trainforge.model.Data subclass"):
        ModelTrainer(Boosted, data=frame())
    with pytest.raises(ValueError, match="num_boost_round=0"):
        Boosted({"rounds": 0})

    class NoSetup(XGBoostModel):
        pass

    with pytest.raises(TypeError, match="does not implement setup"):
        ModelTrainer(NoSetup, data=Table)
    with pytest.raises(TypeError, match="XGBoostModel does not implement setup"):
        ModelTrainer(XGBoostModel, data=Table)
    with pytest.raises(TypeError, match="nor an XGBoostModel"):
        ModelTrainer(BaseModel, data=Table)


def test_data_splits_are_checked():
    assert sorted(data_splits(Table, {})) == ["train", "valid"]

    class Bad(Data):
        def setup(self, config: dict[str, Any]) -> Any:
            return [1, 2]

    class NoTrain(Data):
        def setup(self, config: dict[str, Any]) -> Any:
            return {"valid": frame()}

    with pytest.raises(ValueError, match="returned list"):
        data_splits(Bad, {})
    with pytest.raises(ValueError, match="a 'train' split is needed"):
        data_splits(NoTrain, {})
    class Extra(Data):
        def setup(self, config: dict[str, Any]) -> Any:
            return {"train": frame(), "test": frame()}

    with pytest.raises(ValueError, match="trains on \\['train', 'valid'\\] only"):
        data_splits(Extra, {}, ("train", "valid"))


@pytest.mark.parametrize("cls", [Boosted, Light])
def test_a_gbdt_model_saves_loads_and_predicts_with_its_hooks(cls, tmp_path):
    model = cls({"max_depth": 2})
    with pytest.raises(RuntimeError, match="not trained"):
        model(np.zeros((1, 3), np.float32))
    with pytest.raises(RuntimeError, match="nothing is trained yet"):
        model.save(str(tmp_path / "untrained"))
    data = frame()
    x, y = data.drop(columns=["label"]).to_numpy(np.float32), data["label"].to_numpy()
    if cls is Boosted:
        model.booster = trained_booster(model)
    else:
        import lightgbm

        model.booster = lightgbm.train(model.params, lightgbm.Dataset(x, label=y), num_boost_round=8)
    before = model(x)
    model.save(str(tmp_path / "m"))
    for loaded in (cls.load(str(tmp_path / "m")), BaseModel.load(str(tmp_path / "m"))):
        assert type(loaded) is cls and loaded.config == {"max_depth": 2}
        np.testing.assert_array_equal(loaded(x), before)
    assert ((model(x) > 0.5).astype(int) == y).mean() > 0.9
    from trainforge.serve._encode import adapt_input, infer

    assert adapt_input(model, [[0.1, 0.2, 0.3]]).dtype == np.float32  # no preprocess: a float32 table
    assert len(infer(model, [[0.9, 0.9, 0.0], [0.0, 0.1, 0.0]])) == 2
    with pytest.raises(ValueError, match="not a numeric table"):
        infer(model, [["a", "b", "c"]])


def test_a_torch_model_without_preprocess_still_gets_a_float_tensor():
    torch = pytest.importorskip("torch")

    class Linear(Model):
        def setup(self, config: dict[str, Any]) -> None:
            self.register(models=torch.nn.Linear(2, 1))

    from trainforge.serve._encode import adapt_input

    assert adapt_input(Linear(), [[1, 2]]).dtype == torch.float32


# -- real runs ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_xgboost_model_trains_on_two_workers_registers_loads_and_serves(tmp_path):
    trainer = ModelTrainer(Boosted, data=Table, config={"max_depth": 3},
                           scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(verbose=0))  # fmt: skip
    result = trainer.fit()
    assert result.error is None
    assert result.metrics["valid-error"] < 0.2 and "train-error" in result.metrics
    files = sorted(os.listdir(result.checkpoint.path))
    assert "model.json" in files and "model.ubj" in files  # a model directory: XGBoost's file and the manifest
    model = trainer.get_model()
    assert isinstance(model, Boosted) and model.config == {"max_depth": 3}
    rows = frame(40, seed=1)
    x, y = rows.drop(columns=["label"]).to_numpy(np.float32), rows["label"].to_numpy()
    assert (model(x) == y).mean() > 0.8

    from trainforge.registry import Registry
    from trainforge.serve import ServeEngine
    from trainforge.serve._source import RegistrySource

    reg = Registry(str(tmp_path / "registry"))
    mv = reg.register("boosted", result, alias="prod")  # no model_cls=, no loader=
    assert (mv.model_class or "").endswith("Boosted") and mv.framework == "xgboost" and mv.kind == "trained"
    assert (reg.load("models:/boosted@prod")(x) == model(x)).all()

    async def serve() -> tuple[Any, Any]:
        engine = ServeEngine(RegistrySource("models:/boosted@prod", reg.url), max_batch_size=8, poll_s=0)
        await engine.start()
        try:
            answers = await asyncio.gather(*(engine.predict([row]) for row in x[:16].tolist()))
            return answers, await engine.handle(b'{"inputs": [["x", 1, 2]]}')
        finally:
            await engine.stop()

    answers, (status, body) = asyncio.run(serve())
    assert [a["outputs"][0] for a in answers] == model(x[:16]).tolist()
    assert answers[0]["model"]["uri"] == "models:/boosted/1"
    assert status == 422 and b"not a numeric table" in body


@pytest.mark.slow
def test_lightgbm_model_trains_on_two_workers(tmp_path):
    trainer = ModelTrainer(Light, data=Table, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(verbose=0))  # fmt: skip
    result = trainer.fit()
    assert result.error is None and "valid-binary_error" in result.metrics
    assert {"model.json", "model.txt"} <= set(os.listdir(result.checkpoint.path))
    model = trainer.get_model()
    rows = frame(40, seed=1)
    predictions = model(rows.drop(columns=["label"]).to_numpy(np.float32))
    assert ((predictions > 0.5).astype(int) == rows["label"].to_numpy()).mean() > 0.8


@pytest.mark.slow
def test_tuner_tunes_an_xgboost_model_class_over_its_space(tmp_path):
    from trainforge import tune

    grid = tune.Tuner(Boosted, data=Table, tune_config=tune.TuneConfig(metric="valid-error", mode="min", server=False),
                      run_config=RunConfig(storage_path=str(tmp_path), verbose=0)).fit()  # fmt: skip
    assert len(grid) == 2 and not grid.errors
    assert sorted(r.config["train_loop_config"]["max_depth"] for r in grid) == [2, 4]
    best = grid.get_best_result()
    assert Boosted.load(best.checkpoint).config["max_depth"] in (2, 4)
    with pytest.raises(ValueError, match="is for a model class"):
        tune.Tuner(ModelTrainer(Boosted, data=Table), data=Table)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["frame", "torch"])
def test_a_torch_model_trains_on_a_data_objects_splits(kind, tmp_path):
    torch = pytest.importorskip("torch")

    class Split(Data):
        label_column = "label"

        def setup(self, config: dict[str, Any]) -> dict[str, Any]:
            data = frame(400)
            if kind == "frame":
                return {"train": data.iloc[:320], "valid": data.iloc[320:]}
            x = torch.tensor(data[["a", "b", "c"]].to_numpy(), dtype=torch.float32)
            y = torch.tensor(data["label"].to_numpy())
            full = torch.utils.data.TensorDataset(x, y)
            return {"train": torch.utils.data.Subset(full, range(320)), "valid": torch.utils.data.Subset(full, range(320, 400))}

    class Net(Model):
        def setup(self, config: dict[str, Any]) -> None:
            net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            self.register(models=net, optimizers=torch.optim.Adam(net.parameters(), lr=0.05),
                          criterion=torch.nn.CrossEntropyLoss())  # fmt: skip

    trainer = ModelTrainer(Net, data=Split, config={"batch_size": 32}, loop_config=LoopConfig(num_epochs=5),
                           scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(verbose=0))  # fmt: skip
    result = trainer.fit()
    assert result.error is None
    # every row once per epoch, each worker its share: of "train" and of "valid" (a torch Dataset split by a
    # DistributedSampler on the workers, a table by the core)
    assert result.metrics["num_samples"] == 320 and result.metrics["val_num_samples"] == 80
    assert result.metrics["val_accuracy"] > 0.8
    with pytest.raises(ValueError, match="give data= .* or datasets=, not both"):
        ModelTrainer(Net, data=Split, datasets={"train": frame()})


@pytest.mark.slow
def test_keras_model_trains_registers_and_predicts(tmp_path):
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")

    class Classifier(KerasModel):
        def setup(self, config: dict[str, Any]) -> None:
            keras = self.keras
            model = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
            model.compile(optimizer=keras.optimizers.Adam(0.05), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
            self.register(model=model, epochs=config.get("epochs", 4), batch_size=32)

        def postprocess(self, logits: Any) -> Any:
            return logits.argmax(-1)

    trainer = ModelTrainer(Classifier, data=Table, config={"epochs": 4}, run_config=RunConfig(verbose=0))
    result = trainer.fit()
    assert result.error is None and {"loss", "val_loss", "val_accuracy"} <= set(result.metrics)
    assert {"model.json", "model.keras"} <= set(os.listdir(result.checkpoint.path))
    from trainforge.registry import Registry

    reg = Registry(str(tmp_path / "registry"))
    mv = reg.register("keras", result)
    assert mv.framework == "keras"
    model = reg.load(mv.uri)
    rows = frame(40, seed=1)
    assert (model(rows[["a", "b", "c"]].to_numpy(np.float32)) == rows["label"].to_numpy()).mean() > 0.7
