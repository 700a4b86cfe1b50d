"""Whether TensorFlow and tf-keras are installed, and what a worker sets before TensorFlow is imported.

Every TensorFlow environment variable the integration reads or sets is named here.

Keras: TensorFlow 2.16+ ships Keras 3, which does not work under ``MultiWorkerMirroredStrategy``
(Ray's #47464, keras#20585). Workers therefore run Keras 2: the ``tf-keras`` package, whose version
matches TensorFlow's minor version (tf-keras 2.21.x for TensorFlow 2.21), routed to ``tf.keras`` by
``TF_USE_LEGACY_KERAS=1``. TensorFlow reads that variable when it is imported, so it is set before
(:func:`prepare_worker`); a worker whose TensorFlow was imported without it fails with the fix.

Threads: TensorFlow sizes its intra-op and inter-op pools by the machine's cores, so N workers on one
machine would each start a pool as large as the machine. Unless ``TF_NUM_INTRAOP_THREADS`` /
``TF_NUM_INTEROP_THREADS`` (or :class:`TensorflowConfig`'s fields) say otherwise, both follow the CPUs
reserved per worker, the value trainforge puts in the worker's ``OMP_NUM_THREADS`` (1 by default),
as torch's intra-op pool does. TensorFlow reads them when its runtime starts (the first op).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

ENV_TF_CONFIG = "TF_CONFIG"
ENV_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
ENV_INTRA_OP_THREADS = "TF_NUM_INTRAOP_THREADS"
ENV_INTER_OP_THREADS = "TF_NUM_INTEROP_THREADS"
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"

EXTRA = "pip install 'trainforge[tensorflow]'"
# pip names TensorFlow is published under, in the order they are looked up for its version.
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly")


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version (from its package metadata: TensorFlow is not imported)."""
    for name in TF_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tf_keras_install_command() -> str:
    """The pip command that installs the tf-keras matching the installed TensorFlow. ``--no-deps``:
    tf-keras requires the ``tensorflow`` package by name, which would pull a second TensorFlow next
    to ``tensorflow-cpu``."""
    version = tensorflow_version()
    parts = version.split(".") if version else []
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        return f"pip install 'tf-keras~={parts[0]}.{parts[1]}.0' --no-deps"
    return "pip install tf-keras --no-deps  (the tf-keras version matching your TensorFlow's, e.g. 2.21.x for 2.21)"


def check_installed(who: str) -> None:
    """Raise ``ImportError`` saying what to install when TensorFlow or tf-keras is missing. Imports
    neither."""
    if importlib.util.find_spec("tensorflow") is None:
        raise ImportError(f"{who} needs TensorFlow, which is not installed: {EXTRA}.")
    if importlib.util.find_spec("tf_keras") is None:
        version = tensorflow_version() or "?"
        raise ImportError(
            f"{who} needs tf-keras (Keras 2) next to TensorFlow {version}: TensorFlow's own Keras 3 does "
            "not work with MultiWorkerMirroredStrategy. Install it with: "
            f"{tf_keras_install_command()} (or {EXTRA})."
        )


def import_tf_keras() -> object:
    """``tf_keras``, or ``ImportError`` naming the install command."""
    check_installed("trainforge.tensorflow")
    import tf_keras

    return tf_keras


def _threads(explicit: int | None, env: str) -> str | None:
    """What to set ``env`` to: the explicit value, else nothing when the user set it, else the
    worker's CPU count (``OMP_NUM_THREADS``)."""
    if explicit is not None:
        return str(explicit)
    if env in os.environ:
        return None
    omp = os.environ.get(ENV_OMP_NUM_THREADS, "")
    return omp if omp.isdigit() and int(omp) > 0 else None


def prepare_worker(intra_op_threads: int | None = None, inter_op_threads: int | None = None) -> None:
    """Run on a worker before its train loop (and before the user's ``worker_init_fn``): check the
    install, route ``tf.keras`` to tf-keras, size TensorFlow's thread pools. Idempotent."""
    check_installed("TensorflowTrainer")
    tf = sys.modules.get("tensorflow")
    if tf is not None and not getattr(tf, "_tf_uses_legacy_keras", True):
        raise RuntimeError(
            f"TensorFlow was imported in this worker (pid {os.getpid()}) before {ENV_LEGACY_KERAS}=1 was "
            "set, so tf.keras is Keras 3, which does not work with MultiWorkerMirroredStrategy. Import "
            "TensorFlow inside the train loop (or in worker_init_fn of a TensorflowTrainer, which sets "
            f"the variable first), or set {ENV_LEGACY_KERAS}=1 in the driver's environment."
        )
    os.environ[ENV_LEGACY_KERAS] = "1"
    for explicit, env in ((intra_op_threads, ENV_INTRA_OP_THREADS), (inter_op_threads, ENV_INTER_OP_THREADS)):
        value = _threads(explicit, env)
        if value is not None:
            os.environ[env] = value


def preload() -> None:
    """A worker process's first import (see ``_preload.py``): set ``TF_USE_LEGACY_KERAS=1`` and
    import TensorFlow and tf-keras, so the train loop finds them loaded. Does nothing outside a
    trainforge worker (a warm fork server learning what its children import must not load
    TensorFlow: they fork from it) and nothing when the install is incomplete (``prepare_worker``
    then says what to install). Never raises: a worker must start either way."""
    from trainforge._internal.constants import ENV_DRIVER_ADDR, ENV_RANK

    if ENV_DRIVER_ADDR not in os.environ and ENV_RANK not in os.environ:
        return
    try:
        prepare_worker()
        import tensorflow  # noqa: F401
        import tf_keras  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by prepare_worker / the train loop, with the fix
        pass
