"""Tune's commands of the ``trainforge`` CLI: the train server's Experiments pages.

    trainforge experiments [--json]                 the experiments the server knows (its trials' jobs, imports)
    trainforge experiments import PATH [--json]     an experiment run on this machine, read from its directory

``import`` reads the experiment directory (``experiment_state.json`` and each trial's run directory)
here, with this machine's access to it (a local path or any fsspec URL), and sends it to the server
(``POST /api/v1/experiments/import``); importing the same directory again replaces it.
"""

from __future__ import annotations

import json
from typing import Any

from trainforge._internal.display import table, terminal_width
from trainforge.client import TrialState


def add_commands(sub: Any) -> None:
    experiments = sub.add_parser("experiments", help="Tune experiments on the train server's dashboard")
    _where(experiments)
    experiments.add_argument("--json", action="store_true", help="print JSON")
    experiments.set_defaults(func=_list)
    esub = experiments.add_subparsers(dest="experiments_command")
    imp = esub.add_parser("import", help="import an experiment from its directory ({storage_path}/{name})")
    imp.add_argument("path", help="the experiment directory a Tuner wrote (holds experiment_state.json)")
    _where(imp)
    imp.add_argument("--json", action="store_true", help="print the imported experiment as JSON")
    imp.set_defaults(func=_import)


def _where(p: Any) -> None:
    p.add_argument("--address", help="server URL (default: $TRAINFORGE_ADDRESS or the local server)")
    p.add_argument("--state-dir", default=None, help="the server's state directory (default: the local server's)")


def _client(args: Any) -> Any:
    from trainforge.client import Client

    return Client(args.address, state_dir=args.state_dir)


def _list(args: Any) -> int:
    client = _client(args)
    experiments = client.request("GET", "/experiments")["experiments"]
    if args.json:
        print(json.dumps(experiments, indent=2))
        return 0
    if not experiments:
        print("no experiments (run a Tuner while the server runs, or `trainforge experiments import PATH`)")
        return 0
    rows = []
    for e in experiments:
        best = f"{e['best']['value']:.6g}" if e.get("best") else "-"
        states = ", ".join(f"{e['counts'][s]} {s}" + (f" ({e['pruned']} pruned)" if s == TrialState.TERMINATED and
                           e.get("pruned") else "") for s in TrialState if e["counts"].get(s))  # fmt: skip
        rows.append([str(e["id"]), e["name"], str(e["trials"]), best, states])
    # Names whole where the terminal has room, else cut in the middle (a search's name and its timestamp's end)
    print(table(["ID", "NAME", "TRIALS", "BEST", "STATES"], rows, right=(0, 2, 3), cut=1, width=terminal_width()))
    return 0


def _import(args: Any) -> int:
    from trainforge.tune._experiment_info import read_experiment

    body = read_experiment(args.path)
    client = _client(args)
    experiment = client.request("POST", "/experiments/import", json=body)
    if args.json:
        print(json.dumps(experiment, indent=2))
        return 0
    print(f"imported experiment {experiment['id']} ({experiment['name']}): {experiment['trials']} trial(s); "
          f"see {client.address}{experiment['url']}")  # fmt: skip
    return 0
