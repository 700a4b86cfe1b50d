"""A model's life by reference, for a PyTorch model and an XGBoost model: define it, put it in the registry,
train it on the train server without waiting, tune it meanwhile, register the best, serve it, move the
alias while it serves.

    python examples/model_lifecycle.py [--registry DIR] [--storage-path DIR] [--state-dir DIR] [--only torch|xgboost]

For each model:

1. **define**: a model class (``DigitsNet``, a ``trainforge.model.Model``; ``Cancer``, an ``XGBoostModel``)
   with the same hooks, and a ``Data`` class whose ``setup(config)`` returns the splits;
2. **put**: ``Registry.put(DigitsNet, "digits-net", config=..., data=DigitsData)`` registers the
   *definition* (class, default config, search space, data; no weights): ``models:/digits-net/1``;
3. **train on the server**: ``ModelTrainer("models:/digits-net").submit()`` queues it on a train server
   (started here in the background, ``--state-dir``) and returns at once with the job;
4. **tune** meanwhile, here: ``Tuner("models:/digits-net")`` searches the space stored with the
   definition; the best trial is registered (``models:/digits-net/2``, alias ``prod``), its lineage
   naming the definition;
5. the server's job ends: its result is registered too (``models:/digits-net/3``);
6. **serve** ``models:/digits-net@prod`` (``ModelServer``: batched, follows the alias) and **move the
   alias** to version 3: the server answers with version 3 within a poll, no request failing;
7. the registry's lineage: definition -> runs -> trained versions -> aliases.

The classes are defined in ``__main__``, so the registry stores them by value: the server's jobs and
``trainforge serve`` load them from anywhere. Needs ``trainforge[torch,xgboost,server,serve,tune]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from trainforge import RunConfig, tune
from trainforge.model import Data, LoopConfig, Model, ModelTrainer, XGBoostModel
from trainforge.registry import Registry
from trainforge.serve import ModelServer


# -- 1. define ------------------------------------------------------------------------------------------
class DigitsData(Data):
    """scikit-learn's 8x8 digits: 64 pixel columns (0-16) and the label."""

    label_column = "label"

    def setup(self, config: dict[str, Any]) -> dict[str, Any]:
        import pandas as pd
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
        frame = pd.DataFrame(images / 16.0).rename(columns=str).assign(label=labels)
        return {"train": frame.iloc[:1400], "valid": frame.iloc[1400:]}


class DigitsNet(Model):
    def setup(self, config: dict[str, Any]) -> None:
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(), torch.nn.Linear(config["hidden"], 10))
        self.register(models=net, optimizers=torch.optim.Adam(net.parameters(), lr=config["lr"]),
                      criterion=torch.nn.CrossEntropyLoss())  # fmt: skip

    def preprocess(self, images: Any) -> Any:  # inference: raw pixel rows (0-16)
        import torch

        return torch.as_tensor(images, dtype=torch.float32).reshape(-1, 64) / 16.0

    def postprocess(self, logits: Any) -> Any:
        return logits.argmax(-1)


class CancerData(Data):
    label_column = "target"

    def setup(self, config: dict[str, Any]) -> dict[str, Any]:
        from sklearn.datasets import load_breast_cancer

        features, target = load_breast_cancer(return_X_y=True, as_frame=True)
        frame = features.assign(target=target).sample(frac=1.0, random_state=0)
        return {"train": frame.iloc[:450], "valid": frame.iloc[450:]}


class Cancer(XGBoostModel):
    def setup(self, config: dict[str, Any]) -> None:
        self.register(params={"objective": "binary:logistic", "eval_metric": "error", "max_depth": config["max_depth"],
                              "eta": config["eta"]}, num_boost_round=config["rounds"])  # fmt: skip

    def postprocess(self, probabilities: Any) -> Any:
        return (probabilities > 0.5).astype(int)


MODELS = {
    "torch": dict(cls=DigitsNet, name="digits-net", data=DigitsData, config={"lr": 3e-3, "hidden": 64, "batch_size": 64},
                  space={"lr": tune.grid_search([1e-3, 1e-2])}, metric="val_accuracy", extra={"loop_config": LoopConfig(num_epochs=3)}),
    "xgboost": dict(cls=Cancer, name="cancer-xgb", data=CancerData, config={"max_depth": 3, "eta": 0.3, "rounds": 20},
                    space={"max_depth": tune.grid_search([2, 4])}, metric="valid-error", extra={}),
}  # fmt: skip


def lifecycle(kind: str, reg: Registry, storage: str) -> None:
    m = MODELS[kind]
    # -- 2. put ---------------------------------------------------------------------------------------
    ref = reg.put(m["cls"], m["name"], config=m["config"], hyperparameter_space=m["space"], data=m["data"])
    print(f"[{kind}] put {ref.uri} (a definition: {ref.model_class}, no weights)", flush=True)

    # -- 3. train on the server, without waiting -----------------------------------------------------
    job = ModelTrainer(ref.uri, run_config=RunConfig(storage_path=storage, verbose=0), **m["extra"]).submit()
    print(f"[{kind}] submitted {ref.uri} as job {job.id}; tuning meanwhile", flush=True)

    # -- 4. tune here meanwhile, register the best -----------------------------------------------------
    metric, mode = m["metric"], "max" if m["metric"] == "val_accuracy" else "min"
    grid = tune.Tuner(ref.uri, tune_config=tune.TuneConfig(metric=metric, mode=mode, server=False),
                      run_config=RunConfig(storage_path=storage, verbose=0)).fit()  # fmt: skip
    best = grid.get_best_result()
    tuned = reg.register(m["name"], best, alias="prod")
    print(f"[{kind}] tuned {len(grid)} trials; registered the best as {tuned.uri} ({metric}="
          f"{best.metrics[metric]:.3f}), alias prod; lineage: definition {tuned.lineage['definition']}", flush=True)

    # -- 5. the server's job ---------------------------------------------------------------------------
    result = job.result()
    trained = reg.register(m["name"], result)
    print(f"[{kind}] job {job.id} done: registered {trained.uri} ({metric}={result.metrics[metric]:.3f})", flush=True)

    # -- 6. serve, and move the alias while serving -------------------------------------------------------
    rows = _rows(kind)
    with ModelServer(f"models:/{m['name']}@prod", registry=reg.url, port=0, poll_s=0.2) as server:
        first = server_predict(server.url, rows)
        print(f"[{kind}] served by {first['model']['uri']}: {first['outputs']}", flush=True)
        reg.set_alias(m["name"], "prod", trained.version)
        deadline = time.monotonic() + 30
        answer = first
        while answer["model"]["version"] != trained.version and time.monotonic() < deadline:
            answer = server_predict(server.url, rows)  # every request answered, by one version or the other
        print(f"[{kind}] after the alias moved, served by {answer['model']['uri']}: {answer['outputs']}", flush=True)

    # -- 7. lineage ------------------------------------------------------------------------------------
    for d in reg.lineage(m["name"]):
        runs = ", ".join(f"{len(r['versions'])} version(s) from {os.path.basename(r['run_path'] or '?')}" for r in d["runs"])
        served = sorted(a for r in d["runs"] for v in r["versions"] for a in v["aliases"])
        print(f"[{kind}] lineage: {d['definition']} -> {len(d['runs'])} run(s) ({runs}); aliases {served}", flush=True)


def _rows(kind: str) -> list:
    if kind == "torch":
        from sklearn.datasets import load_digits

        return load_digits().data[:4].tolist()
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer().data[:4].tolist()


def server_predict(url: str, rows: list) -> dict:
    import json
    import urllib.request

    request = urllib.request.Request(f"{url}/v1/predict", json.dumps({"inputs": rows}).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=None, help="default: a new temporary directory")
    parser.add_argument("--storage-path", default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--state-dir", default=None, help="the train server's state (default: a temporary directory)")
    parser.add_argument("--only", choices=sorted(MODELS), help="one of the two models")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="model-lifecycle-")
    reg = Registry(args.registry or os.path.join(tmp, "registry"))
    storage = args.storage_path or os.path.join(tmp, "runs")
    state_dir = args.state_dir or os.path.join(tmp, "server")
    os.environ["TRAINFORGE_REGISTRY"] = reg.url  # what "models:/..." names, here and in the server's jobs
    os.environ["TRAINFORGE_SERVER_DIR"] = state_dir  # submit() and the server's jobs find this server
    os.environ.pop("TRAINFORGE_ADDRESS", None)
    from trainforge.server import start_background_server

    url = start_background_server(state_dir, extra_args=["--port", "0"])
    print(f"train server at {url}", flush=True)
    try:
        for kind in [args.only] if args.only else sorted(MODELS, reverse=True):
            lifecycle(kind, reg, storage)
    finally:
        subprocess.run([sys.executable, "-m", "trainforge", "server", "stop", "--state-dir", state_dir, "--stop-jobs"],
                       check=False, capture_output=True, timeout=120)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
