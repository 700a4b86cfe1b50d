"""``trainforge train MODEL_REF``: train a registered model definition, here or as a train-server job.

    trainforge train models:/digits-net --config lr=0.01 --workers 2            # here, until it ends
    trainforge train models:/digits-net --config lr=0.01 --workers 2 --submit   # a job on the train server
    trainforge train models:/digits-net --epochs 5 --register --alias staging   # and register the result

The definition (``Registry.put``) gives the class, its default config (``--config KEY=VALUE``
updates it; values are JSON, else strings) and its default data (``--data module:DataClass``
replaces it). ``--workers`` is the run's ``ScalingConfig(num_workers=...)``; ``--epochs`` the PyTorch
managed loop's ``LoopConfig(num_epochs=...)``. ``--register`` registers the result under the
definition's name (or ``--register NAME``), its lineage naming the definition; with ``--submit`` that
needs ``--wait``. In a run of the registry layer (above the model object), it uses only the public
trainer and registry APIs.
"""

from __future__ import annotations

import sys
from typing import Any

from trainforge._internal.amounts import fmt_metric
from trainforge._internal.key_values import parse_key_values


def add_commands(sub: Any) -> None:
    p = sub.add_parser("train", help="train a registered model definition (models:/name), here or on the server",
                       description="Train models:/NAME (its latest definition), models:/NAME/VERSION or "
                       "models:/NAME@ALIAS with ModelTrainer: here until it ends, or as a train-server job (--submit).")  # fmt: skip
    p.add_argument("model", metavar="MODEL_REF", help="models:/name (its latest definition), models:/name/3, models:/name@alias")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a config value (JSON, else a string), over the definition's default config (repeatable)")  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="workers (ScalingConfig(num_workers=...); default 1)")
    p.add_argument("--epochs", type=int, help="epochs of a PyTorch model's managed loop (LoopConfig(num_epochs=...))")
    p.add_argument("--data", metavar="MODULE:CLASS", help="a trainforge.model.Data class instead of the definition's")
    p.add_argument("--registry", help="the registry's directory or URL (default: $TRAINFORGE_REGISTRY, else "
                   "~/trainforge/registry)")  # fmt: skip
    p.add_argument("--storage-path", help="where the run's directory goes (default: $TRAINFORGE_STORAGE_PATH)")
    p.add_argument("--name", help="the run's (and the job's) name")
    p.add_argument("--register", nargs="?", const="", metavar="NAME",
                   help="register the trained model (under NAME; default the definition's name)")  # fmt: skip
    p.add_argument("--alias", help="with --register: point this alias at the new version")
    p.add_argument("--submit", action="store_true", help="run it as a job on the train server (returns at once)")
    p.add_argument("--wait", action="store_true", help="with --submit: follow the job until it ends")
    p.add_argument("--address", help="with --submit: the train server (default: $TRAINFORGE_ADDRESS, else this machine's)")
    p.set_defaults(func=_train)


def build_trainer(args: Any) -> tuple[Any, Any, Any]:
    """(the trainer, the registry, the definition's model name) for ``args``."""
    from trainforge import RunConfig, ScalingConfig
    from trainforge.model import LoopConfig, ModelTrainer, import_path
    from trainforge.registry import Registry, parse_model_uri

    ref = parse_model_uri(args.model)
    reg = Registry(args.registry or ref.registry)
    definition = reg.definition(ref)
    data = None
    if args.data:
        if ":" not in args.data:
            raise ValueError(f"--data {args.data!r}: give module:Class of a trainforge.model.Data")
        data = import_path(args.data)
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers}: give a number >= 1")
    options: dict[str, Any] = {}
    if args.epochs is not None:
        if definition.model_cls.framework != "torch":
            raise ValueError(f"--epochs is the PyTorch managed loop's; {definition.model_cls.__qualname__} is a "
                             f"{definition.model_cls.framework} model: set its rounds or epochs with --config")  # fmt: skip
        options["loop_config"] = LoopConfig(num_epochs=args.epochs)
    trainer = ModelTrainer(definition, config=parse_key_values(args.config, "config"), data=data,
                           scaling_config=ScalingConfig(num_workers=args.workers),
                           run_config=RunConfig(storage_path=args.storage_path, name=args.name), **options)  # fmt: skip
    return trainer, reg, ref.name


def _train(args: Any) -> int:
    from trainforge.registry import RegistryError

    if args.alias and args.register is None:
        print("trainforge train: --alias needs --register", file=sys.stderr)
        return 2
    if args.register is not None and args.submit and not args.wait:
        print("trainforge train: --register with --submit needs --wait (the result is registered when the job ends)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        trainer, reg, name = build_trainer(args)
    except (KeyError, RegistryError, ValueError, TypeError, ImportError, OSError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"trainforge train: {text}", file=sys.stderr)
        return 1
    uri = trainer.definition.uri
    if args.submit:
        job = trainer.submit(wait=args.wait, name=args.name, address=args.address)
        print(f"trainforge train: {uri} submitted as job {job.id}", flush=True)
        if not args.wait:
            return 0
        result = job.result()
    else:
        result = trainer.fit()
    print(f"trainforge train: {uri} trained: run {result.path}")
    metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    print("trainforge train: metrics " + ", ".join(f"{k}={fmt_metric(v)}" for k, v in sorted(metrics.items())))
    if args.register is not None:
        mv = reg.register(args.register or name, result, alias=args.alias)
        alias = f" (alias {args.alias})" if args.alias else ""
        print(f"trainforge train: registered {mv.uri}{alias}, trained from {uri}")
    return 0
