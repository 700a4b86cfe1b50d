"""A tune experiment's trials and its snapshot on storage (``experiment_state.json``, written
atomically after every change), from which an interrupted experiment continues."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import fsspec

from trainforge._internal.state_files import create, data_modes, make_dirs
from trainforge.client import TrialState

STATE_FILE = "experiment_state.json"
TUNER_FILE = "tuner.pkl"

# A trial's status: Ray Tune's names, the one vocabulary of the tuner and the train server's views
# (trainforge.client.TrialState, derived by trial_state).
PENDING, RUNNING, TERMINATED, ERROR = TrialState.PENDING, TrialState.RUNNING, TrialState.TERMINATED, TrialState.ERROR


@dataclass
class Trial:
    """One trial: a configuration and the train run(s) that evaluate it."""

    trial_id: str
    config: dict[str, Any]
    name: str
    dirname: str
    status: TrialState = PENDING
    last_result: dict[str, Any] | None = None
    error: str | None = None
    checkpoint: str | None = None  # the latest committed checkpoint's path
    time_offset: float = 0.0  # time_total_s of earlier runs (restore, exploit)
    run_index: int = 0  # PBT: each exploit continues in a new run directory
    resume_from: str | None = None  # a checkpoint the next run starts from (PBT exploit)
    stop_reason: str | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)  # why the tuner stopped its runs (kind, iteration, ...)
    # Not saved: live state of a running trial.
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    run: Any = field(default=None, repr=False)
    started: float = field(default=0.0, repr=False)
    grant: dict[str, float] = field(default_factory=dict, repr=False)
    exploit: Any = field(default=None, repr=False)
    stopping: bool = field(default=False, repr=False)

    @property
    def run_name(self) -> str:
        return self.dirname if self.run_index == 0 else f"{self.dirname}_pbt{self.run_index}"

    def to_json(self) -> dict[str, Any]:
        keys = ("trial_id", "config", "name", "dirname", "status", "last_result", "error", "checkpoint",
                "time_offset", "run_index", "resume_from", "stop_reason", "decisions")  # fmt: skip
        return {k: _jsonable(getattr(self, k)) for k in keys}

    @classmethod
    def from_json(cls, d: dict[str, Any], config: dict[str, Any]) -> Trial:
        return cls(**{**d, "config": config, "status": TrialState(d.get("status", PENDING))})


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def new_experiment_id() -> str:
    return uuid.uuid4().hex[:5]


class ExperimentStore:
    """The experiment directory on storage (a local path or any fsspec URL)."""

    def __init__(self, path: str, filesystem: Any = None):
        if filesystem is None:
            filesystem, root = fsspec.core.url_to_fs(path)
        else:
            root = path
        self.fs = filesystem
        self.root = root.rstrip("/")
        self.path = path.rstrip("/")
        self.local = "://" not in path and filesystem.protocol in ("file", ("file", "local"), "local")

    def exists(self) -> bool:
        return bool(self.fs.exists(f"{self.root}/{STATE_FILE}"))

    def write(self, name: str, data: bytes) -> None:
        target = f"{self.root}/{name}"
        if self.local:  # atomic: a reader never sees half a file; the owner's alone, as run directories
            modes = data_modes()
            make_dirs(self.root, modes.dir)
            tmp = f"{target}.tmp{os.getpid()}"
            with create(tmp, "wb", modes.file) as f:
                f.write(data)
            os.replace(tmp, target)
        else:  # one PUT: object stores replace an object atomically
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(target, data)

    def read(self, name: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(f"{self.root}/{name}"))
        except FileNotFoundError:
            return None

    def save_state(self, state: dict[str, Any]) -> None:
        state = {**state, "saved_at": time.time()}
        self.write(STATE_FILE, json.dumps(_jsonable(state), separators=(",", ":")).encode())

    def load_state(self) -> dict[str, Any] | None:
        data = self.read(STATE_FILE)
        return None if data is None else json.loads(data)
