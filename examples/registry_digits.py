"""From a training run to a served model: train ``DigitsModel`` (examples/model_digits.py) twice,
register both runs in a model registry, point ``production`` at the first, serve
``models:/digits@production`` over HTTP, then move the alias to the second version while it serves.

    python examples/registry_digits.py [--registry DIR_OR_URL] [--epochs 3] [--num-workers 2]

``--registry`` defaults to ``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry`` (an ``s3://``
URL works too). Afterwards: ``trainforge models list``, ``trainforge models versions digits``, or the
train server's Models page. The versions record ``DigitsModel`` by its import path,
``model_digits:DigitsModel`` (this script imports it from examples/), so a process that loads them must
be able to import ``model_digits``: serve them from this directory with
``cd examples && python -m trainforge serve models:/digits@production`` (``python -m`` puts the current
directory on ``sys.path``). ``python examples/model_digits.py --register digits`` instead saves the class
with the model (it is defined in ``__main__`` there), which serves from anywhere: see docs/tutorial.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model_digits import DigitsModel, digits_split  # noqa: E402

from trainforge import RunConfig, ScalingConfig  # noqa: E402
from trainforge.model import BATCH_SIZE, LoopConfig, ModelTrainer  # noqa: E402
from trainforge.registry import Registry, load_model  # noqa: E402


def _predict(url: str, images: list) -> dict:
    body = json.dumps({"inputs": images}).encode()
    request = urllib.request.Request(f"{url}/v1/predict", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args(argv)

    registry = Registry(args.registry)
    versions = []
    for lr in (3e-3, 1e-2):
        result = ModelTrainer(
            DigitsModel, config={"lr": lr, BATCH_SIZE: 64},
            loop_config=LoopConfig(num_epochs=args.epochs, scheduler_step_freq="epoch"),
            scaling_config=ScalingConfig(num_workers=args.num_workers),
            run_config=RunConfig(storage_path=args.storage_path, verbose=0),
        ).fit()  # fmt: skip
        # The run's latest checkpoint, its metrics and lineage (run directory, config, git commit).
        mv = registry.register("digits", result, model_cls=DigitsModel, tags={"lr": lr})
        versions.append(mv.version)
        print(f"registered {mv.uri}: val_accuracy {mv.metrics['val_accuracy']:.4f}, {mv.size} bytes")
    registry.set_alias("digits", "production", versions[0])

    _, x_val, _, y_val = digits_split()
    model = load_model("models:/digits@production", registry)  # the DigitsModel, ready for model(x)
    accuracy = float((model(x_val) == __import__("torch").as_tensor(y_val)).float().mean())
    print(f"loaded models:/digits@production (version {versions[0]}): accuracy {accuracy:.4f}")

    from trainforge.serve import ModelServer

    swapped = threading.Event()

    def on_event(line: str) -> None:
        print(f"server: {line}")
        if line.startswith(f"now serving models:/digits/{versions[1]} "):
            swapped.set()

    with ModelServer("models:/digits@production", registry=registry.url, port=0, poll_s=0.2,
                     on_event=on_event) as server:  # fmt: skip
        first = _predict(server.url, x_val[:5].tolist())
        print(f"served by {first['model']['uri']}: {first['outputs']} (true: {y_val[:5].tolist()})")
        registry.set_alias("digits", "production", versions[1])  # the server follows it, dropping nothing
        if not swapped.wait(timeout=120):
            print("the server did not pick up the moved alias within 120 s", file=sys.stderr)
            return 1
        second = _predict(server.url, x_val[:5].tolist())
        print(f"after the alias moved, served by {second['model']['uri']}: {second['outputs']}")
    moves = [f"{m.from_version}->{m.to_version}" for m in registry.alias_history("digits", "production")]
    print(f"production's history: {', '.join(moves)}")
    return 0 if second["model"]["version"] == versions[1] and accuracy > 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
