"""``JsonLoggerCallback`` (``result.json`` + ``params.json``) and ``CSVLoggerCallback``
(``progress.csv``): one row per report in the run directory, as Ray Tune writes them.

A row is the metrics rank 0 reported (flattened to ``a/b`` columns in the CSV), plus
``training_iteration`` (1 for the first report) unless the metrics have one. The files follow the
run's history: when reports are redone after a restart from a checkpoint (or a ``fit()`` continues a
run directory), the rows after the checkpoint are replaced, so on a clean finish the file holds
exactly ``Result.metrics_dataframe``'s rows.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import threading
from typing import IO, Any

from trainforge._internal.sinks.api import (
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_QUEUE_SIZE,
    LoggerCallback,
    TrialInfo,
)
from trainforge._internal.sinks.drain import ResultRecord
from trainforge._internal.sinks.values import flatten

RESULT_FILE = "result.json"
PARAMS_FILE = "params.json"
PROGRESS_FILE = "progress.csv"
ITERATION_KEY = "training_iteration"


_claims: dict[tuple[str, str], int] = {}  # (sink class, file) -> id of the sink writing it
_claims_lock = threading.Lock()


def claim(sink: LoggerCallback, path: str) -> None:
    """Refuse a second sink of the same kind writing the same file (a Tuner over a trainer gets the
    callbacks of both RunConfigs: the same sink in both would write every row twice)."""
    key = (type(sink).__name__, os.path.abspath(path))
    with _claims_lock:
        owner = _claims.setdefault(key, id(sink))
    if owner != id(sink):
        raise RuntimeError(
            f"another {key[0]} is writing {key[1]} for this run; pass the sink once (a Tuner over a trainer "
            "gives each trial the callbacks of the trainer's RunConfig and of tune's RunConfig)"
        )


def release(sink: LoggerCallback, path: str) -> None:
    key = (type(sink).__name__, os.path.abspath(path))
    with _claims_lock:
        if _claims.get(key) == id(sink):
            del _claims[key]


def _row(record: ResultRecord) -> dict[str, Any]:
    row = dict(record.metrics)
    row.setdefault(ITERATION_KEY, record.iteration)
    return row


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays, tensors
        return value.tolist()
    return str(value)


class JsonLoggerCallback(LoggerCallback):
    """Writes each report as one JSON line to ``result.json`` and the config to ``params.json`` in
    the run directory (Ray Tune's ``JsonLoggerCallback``)."""

    transient_attributes = ("_files",)

    def __init__(
        self, *, queue_size: int = DEFAULT_QUEUE_SIZE, flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    ):
        super().__init__(queue_size=queue_size, flush_timeout_s=flush_timeout_s)

    def _open(self) -> dict[TrialInfo, tuple[IO[str], int]]:
        return self.__dict__.setdefault("_files", {})

    def claim_run(self, trial: TrialInfo) -> None:
        claim(self, os.path.join(trial.local_path, RESULT_FILE))

    def log_trial_start(self, trial: TrialInfo) -> None:
        os.makedirs(trial.local_path, exist_ok=True)
        path = os.path.join(trial.local_path, RESULT_FILE)
        claim(self, path)
        try:
            with open(os.path.join(trial.local_path, PARAMS_FILE), "w", encoding="utf-8") as f:
                json.dump(trial.config, f, indent=2, sort_keys=True, default=_json_default)
            lines = 0
            if os.path.exists(path):  # a run directory fit() continues
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
            self._open()[trial] = (open(path, "a", encoding="utf-8"), lines)  # noqa: SIM115 - kept for the run
        except BaseException:
            release(self, path)
            raise

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        f, lines = self._open()[trial]
        for record in records:
            if record.iteration - 1 < lines:  # redone after a restart: rows from here on are replaced
                f = self._rewind(trial, f, record.iteration - 1)
                lines = record.iteration - 1
            f.write(json.dumps(_row(record), default=_json_default) + "\n")
            lines += 1
        f.flush()
        self._open()[trial] = (f, lines)

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        self.log_trial_results(trial, [ResultRecord(iteration, result, 0.0)])

    def _rewind(self, trial: TrialInfo, f: IO[str], keep: int) -> IO[str]:
        f.close()
        path = os.path.join(trial.local_path, RESULT_FILE)
        with open(path, encoding="utf-8") as src:
            kept = list(itertools.islice(src, keep))
        with open(path, "w", encoding="utf-8") as dst:
            dst.writelines(kept)
        return open(path, "a", encoding="utf-8")  # noqa: SIM115

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        entry = self._open().pop(trial, None)
        if entry is not None:
            entry[0].close()
            release(self, os.path.join(trial.local_path, RESULT_FILE))


class CSVLoggerCallback(LoggerCallback):
    """Writes each report as a row of ``progress.csv`` in the run directory, nested metrics
    flattened to ``a/b`` columns (Ray Tune's ``CSVLoggerCallback``). A metric that first appears in a
    later report adds a column (the file is rewritten with the wider header)."""

    transient_attributes = ("_files",)

    def __init__(
        self, *, queue_size: int = DEFAULT_QUEUE_SIZE, flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    ):
        super().__init__(queue_size=queue_size, flush_timeout_s=flush_timeout_s)

    def _open(self) -> dict[TrialInfo, _CsvFile]:
        return self.__dict__.setdefault("_files", {})

    def claim_run(self, trial: TrialInfo) -> None:
        claim(self, os.path.join(trial.local_path, PROGRESS_FILE))

    def log_trial_start(self, trial: TrialInfo) -> None:
        os.makedirs(trial.local_path, exist_ok=True)
        path = os.path.join(trial.local_path, PROGRESS_FILE)
        claim(self, path)
        try:
            self._open()[trial] = _CsvFile(path)
        except BaseException:
            release(self, path)
            raise

    def log_trial_results(self, trial: TrialInfo, records: list[ResultRecord]) -> None:
        self._open()[trial].write([(r.iteration, flatten(_row(r))) for r in records])

    def log_trial_result(self, iteration: int, trial: TrialInfo, result: dict[str, Any]) -> None:
        self.log_trial_results(trial, [ResultRecord(iteration, result, 0.0)])

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None:
        entry = self._open().pop(trial, None)
        if entry is not None:
            entry.close()
            release(self, os.path.join(trial.local_path, PROGRESS_FILE))


class _CsvFile:
    """``progress.csv`` of one run: appends rows; rewrites the file for a wider header or a rewind."""

    def __init__(self, path: str):
        self.path = path
        self.fields: list[str] = []
        self.rows = 0
        if os.path.exists(path):  # a run directory fit() continues
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                self.fields = next(reader, [])
                self.rows = sum(1 for _ in reader)
        self.file: IO[str] = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115

    def write(self, rows: list[tuple[int, dict[str, Any]]]) -> None:
        for iteration, row in rows:
            new = [k for k in row if k not in self.fields]
            if iteration - 1 < self.rows or new:
                self._rewrite(keep=min(self.rows, iteration - 1), fields=self.fields + new)
            csv.DictWriter(self.file, self.fields).writerow(row)
            self.rows += 1
        self.file.flush()

    def _rewrite(self, keep: int, fields: list[str]) -> None:
        self.file.close()
        with open(self.path, newline="", encoding="utf-8") as f:
            old = list(itertools.islice(csv.DictReader(f), keep)) if self.fields else []
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            writer.writerows(old)
        self.fields, self.rows = fields, len(old)
        self.file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        self.file.close()
