"""Every environment variable trainforge reads or sets, in one place.

Nothing here is read at import time: call the functions.
"""

from __future__ import annotations

import os
from pathlib import Path

# Read by the driver.
ENV_STORAGE_PATH = "TRAINFORGE_STORAGE_PATH"  # default RunConfig.storage_path
ENV_SHUTDOWN_GRACE_S = "TRAINFORGE_SHUTDOWN_GRACE_S"  # SIGTERM -> SIGKILL grace period
ENV_START_TIMEOUT_S = "TRAINFORGE_WORKER_START_TIMEOUT_S"

# Read by the driver and by the workers (which inherit the driver's environment).
ENV_STORAGE_RETRIES = "TRAINFORGE_STORAGE_RETRIES"  # attempts per storage operation (1 = no retry)
ENV_STORAGE_RETRY_DELAY_S = "TRAINFORGE_STORAGE_RETRY_DELAY_S"  # first backoff, doubled per retry

# Set by the driver for every worker process (the torchrun names where one exists).
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_NODE_RANK = "GROUP_RANK"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_WORKER_PRELOAD = "TRAINFORGE_WORKER_PRELOAD"  # comma-separated modules a worker imports first
# The worker protocol (worker_group/worker_main.py): where a worker connects, its key and authkey, its
# stack-dump file, and a local worker's report ring (report_ring.py).
ENV_DRIVER_ADDR = "TRAINFORGE_DRIVER_ADDR"
ENV_AUTHKEY = "TRAINFORGE_AUTHKEY"
ENV_STACK_FILE = "TRAINFORGE_STACK_FILE"
ENV_WORKER_KEY = "TRAINFORGE_WORKER_KEY"
ENV_REPORT_RING_FD = "TRAINFORGE_REPORT_RING_FD"
ENV_REPORT_WAKE_FD = "TRAINFORGE_REPORT_WAKE_FD"  # the ring's wake-up eventfd

# Set by the train server's runner for everything a job runs (inherited by its workers): the job's id
# (every process of a job can be found by it), and a file every fit() in the job appends its
# events to (run start, reports, restarts, run end) as JSON lines, which the server tails.
ENV_JOB_ID = "TRAINFORGE_JOB_ID"
ENV_JOB_EVENTS = "TRAINFORGE_JOB_EVENTS"
ENV_SERVER_ID = "TRAINFORGE_SERVER_ID"  # with ENV_JOB_ID, marks every process of a train-server job
ENV_JOB_ATTEMPT = "TRAINFORGE_JOB_ATTEMPT"  # the job's attempt on the server (1 for its first runner)
# A sandboxed job's runner started fresh: its sandbox plan (JSON), entered first (_internal/sandbox).
ENV_SANDBOX_PLAN = "TRAINFORGE_SANDBOX_PLAN"
# Fault injection: the train server exits at once (os._exit) when it reaches the named crash point
# (trainforge/server/_crash.py lists them); only the crash-point tests set it.
ENV_CRASH_AT = "TRAINFORGE_CRASH_AT"

DEFAULT_STORAGE_DIRNAME = "trainforge_results"
DEFAULT_SHUTDOWN_GRACE_S = 5.0
DEFAULT_START_TIMEOUT_S = 120.0
DEFAULT_STORAGE_RETRIES = 5
DEFAULT_STORAGE_RETRY_DELAY_S = 0.2
STORAGE_RETRY_MAX_DELAY_S = 5.0  # the backoff stops doubling here


def default_storage_path() -> str:
    return os.environ.get(ENV_STORAGE_PATH) or str(Path.home() / DEFAULT_STORAGE_DIRNAME)


def shutdown_grace_s() -> float:
    return float(os.environ.get(ENV_SHUTDOWN_GRACE_S, DEFAULT_SHUTDOWN_GRACE_S))


def worker_start_timeout_s() -> float:
    return float(os.environ.get(ENV_START_TIMEOUT_S, DEFAULT_START_TIMEOUT_S))


def job_attempt() -> int | None:
    """This process's train-server job attempt (``$TRAINFORGE_JOB_ATTEMPT``), or None outside one."""
    value = os.environ.get(ENV_JOB_ATTEMPT, "")
    return int(value) if value.isdigit() else None

# The modes of what runs and registries write on local disk (run directories, checkpoints, logs,
# registry blobs and records, the registry cache): "private" (the default: files 0600, read-only
# blobs 0400, directories 0700, whatever the umask) or "umask" (as the process umask says, as Ray
# and MLflow write: 0644 / 0444 / 0755 under umask 022; 0640 / 0440 / 0750 under 027 for a group).
# Read by whatever writes them (the driver, its workers, the registry): state_files.data_modes().
ENV_FILE_MODE = "TRAINFORGE_FILE_MODE"
FILE_MODE_SETTINGS = ("private", "umask")


def file_mode_setting() -> str:
    """``$TRAINFORGE_FILE_MODE``: ``private`` (unset or empty) or ``umask``; ValueError otherwise."""
    raw = os.environ.get(ENV_FILE_MODE, "")
    value = raw.strip().lower() or FILE_MODE_SETTINGS[0]
    if value not in FILE_MODE_SETTINGS:
        raise ValueError(
            f"${ENV_FILE_MODE}={raw!r}: choose 'private' (the default: files 0600, directories 0700, the owner's "
            "alone) or 'umask' (as the process umask says, e.g. group-readable under umask 027)"
        )
    return value


# Resources this machine offers to local workers (elastic sizing): a JSON object such as
# '{"CPU": 8, "GPU": 2}', or '@/path/to/file.json' to re-read a file at every sizing decision.
ENV_LOCAL_RESOURCES = "TRAINFORGE_LOCAL_RESOURCES"
ENV_RESOURCE_WAIT_S = "TRAINFORGE_RESOURCE_WAIT_S"  # how long an elastic run waits for its minimum
DEFAULT_RESOURCE_WAIT_S = 60.0


def resource_wait_s() -> float:
    return float(os.environ.get(ENV_RESOURCE_WAIT_S, DEFAULT_RESOURCE_WAIT_S))


def storage_retries() -> int:
    """Attempts per storage operation, at least 1."""
    return max(1, int(os.environ.get(ENV_STORAGE_RETRIES, DEFAULT_STORAGE_RETRIES)))


def storage_retry_delay_s() -> float:
    return max(0.0, float(os.environ.get(ENV_STORAGE_RETRY_DELAY_S, DEFAULT_STORAGE_RETRY_DELAY_S)))

# Where a client finds a train server (and the server's defaults for them).
ENV_ADDRESS = "TRAINFORGE_ADDRESS"  # the client's way to a server ("http://127.0.0.1:8270")
ENV_STATE_DIR = "TRAINFORGE_SERVER_DIR"  # default --state-dir, where the client finds address and token
ENV_TOKEN = "TRAINFORGE_TOKEN"
# Where the train server's HTTP API lives: the client calls under it, the server mounts its routes there
# (and its guard answers JSON there), its pages give it to their scripts (data-api).
API_PREFIX = "/api/v1"
# A server on a Ray cluster publishes its URL (and state directory) in the cluster's KV under this key.
RAY_KV_KEY = b"trainforge_server_address"
RAY_KV_NAMESPACE = b"trainforge"
# The file in a state directory that a running server holds locked (flock) for its whole life.
SERVER_LOCK_FILE = "server.lock"
# A TLS server's own certificate, copied into its state directory while it runs: the client on its
# machine trusts exactly that certificate for the address in that directory (client/_discovery.py).
SERVER_CERT_FILE = "server_cert.pem"


def default_state_dir() -> str:
    """A train server's default state directory: ``$TRAINFORGE_SERVER_DIR``, else ``~/.trainforge/server``."""
    return os.environ.get(ENV_STATE_DIR) or str(Path.home() / ".trainforge" / "server")
