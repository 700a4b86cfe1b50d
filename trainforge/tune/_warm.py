"""Warm worker processes for trials (``TuneConfig(reuse_actors=...)``).

Ray reuses a trial's actor for the next trial (``reuse_actors``), which skips the process start and
the imports but carries whatever the last trial left in the process (globals, CUDA state, open
files) into the next one. Here a trial still gets processes of its own, but they are forked from a
warm fork server (``trainforge/_internal/zygote.py``, the train server's warm pool) that imported
trainforge, cloudpickle and the trainable's libraries (torch for a ``TorchTrainer``, the modules the
trainable refers to) once: a trial's workers start in milliseconds instead of paying the interpreter
start and the imports, and no state crosses from one trial to the next.

The fork server starts with the experiment; the first trials start once its imports are done (a
second or two with torch; had they started cold, their workers would import the same libraries at
the same time on the same cores). If it fails to start, trials get fresh processes, as without it.
It is stopped when ``fit()`` returns. Linux only.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from collections.abc import Iterator
from typing import Any

from trainforge._internal import zygote
from trainforge.tune._trainable import is_trainer

logger = logging.getLogger("trainforge.tune")

# What a trial's worker imports whatever the trainable is (as the train server's warm pool).
BASE_PRELOAD = (
    "trainforge", "trainforge._internal.worker_group.worker_main", "trainforge._internal.train_fn",
    "trainforge._internal.session", "trainforge._internal.worker_group.report_ring", "trainforge.tune",
    "cloudpickle", "multiprocessing.connection",
)  # fmt: skip
READY_TIMEOUT_S = 60.0


def preload_modules(trainable: Any) -> tuple[str, ...]:
    """The modules a trial's workers will import: the trainer's own (torch for a TorchTrainer) and the
    installed libraries the train function's code refers to (``torch.nn...``, a ``load_digits``
    imported from sklearn), as globals or closed-over names. The user's own modules are left out: importing one in the fork server could run its
    top-level code (say, a script without ``if __name__ == "__main__"``)."""
    modules = list(BASE_PRELOAD)
    fn = trainable
    if is_trainer(trainable):
        modules += list(getattr(trainable, "_preload_modules", ()))
        fn = trainable.train_loop_per_worker
    fn = getattr(fn, "__wrapped__", fn)  # with_parameters / with_resources
    try:
        refs = inspect.getclosurevars(fn)  # the names its code uses: globals and closed-over ones
        values = [*refs.globals.values(), *refs.nonlocals.values()]
    except (TypeError, ValueError):  # not a Python function (a callable object, a builtin)
        values = []
    names = [value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
             for value in values]  # fmt: skip
    names += _imported_inside(getattr(fn, "__code__", None))
    modules += [n for n in names if isinstance(n, str) and _installed(n)]
    if any(m == "torch" or m.startswith("torch.") for m in modules):
        modules += ["torch", "torch._dynamo", "trainforge.torch"]  # what the first DDP model needs
    return tuple(dict.fromkeys(modules))


def _imported_inside(code: types.CodeType | None) -> list[str]:
    """Modules the function imports in its body (``import torch`` inside the trainable), where the
    driver has them imported too: the names its code (and nested code) uses that name a module."""
    if code is None:
        return []
    out = [n for n in code.co_names if n in sys.modules]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out += _imported_inside(const)
    return out


def _installed(module_name: str) -> bool:
    """True for a module of the standard library or an installed package (not the user's code)."""
    module = sys.modules.get(module_name)
    if module is None or module_name == "__main__":
        return False
    path = getattr(module, "__file__", None)
    if path is None:
        return module_name in sys.builtin_module_names
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    path = os.path.realpath(path)
    return any(path.startswith(os.path.realpath(r) + os.sep) for r in roots)


@contextlib.contextmanager
def warm_processes(trainable: Any, enabled: bool) -> Iterator[None]:
    """While the block runs, local workers of trials are forked from a warm fork server (once it is
    ready). A no-op when disabled, off Linux, or when one is in use already (a tuner inside a train
    server job uses the server's)."""
    if not enabled or not sys.platform.startswith("linux") or os.environ.get(zygote.ENV_ZYGOTE):
        yield
        return
    tmp = tempfile.mkdtemp(prefix="trainforge_tune_warm_")
    path = os.path.join(tmp, "z.sock")
    log_path = os.path.join(tmp, "zygote.log")
    try:
        proc, ready_fd = zygote.launch(path, log_path=log_path, preload=preload_modules(trainable))
    except OSError as exc:
        logger.warning("tune: no warm worker processes (%s): every trial starts fresh ones", exc)
        shutil.rmtree(tmp, ignore_errors=True)
        yield
        return
    done = threading.Event()
    state: dict[str, Any] = {}

    def await_ready() -> None:
        try:
            ready, _, _ = select.select([ready_fd], [], [], READY_TIMEOUT_S)
            line = os.read(ready_fd, 100) if ready else b""
        finally:
            os.close(ready_fd)
        if line.startswith(b"ready") and not done.is_set():
            os.environ[zygote.ENV_ZYGOTE] = path
            state["set"] = True
        elif not done.is_set():
            with contextlib.suppress(OSError), open(log_path, errors="replace") as f:
                state["log"] = f.read()[-2000:]
            logger.warning("tune: the warm process server did not start; every trial starts fresh processes. "
                           "Its output:\n%s", state.get("log", ""))  # fmt: skip

    waiter = threading.Thread(target=await_ready, daemon=True, name="tune-warm-ready")
    waiter.start()
    # The first trials wait for it too: started cold, their workers would import the same libraries
    # at the same time as the fork server, on the same cores, and finish no sooner.
    waiter.join(READY_TIMEOUT_S)
    try:
        yield
    finally:
        done.set()
        if state.get("set") and os.environ.get(zygote.ENV_ZYGOTE) == path:
            del os.environ[zygote.ENV_ZYGOTE]
        _stop(proc)
        waiter.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Close the fork server's lifeline (it stops serving and exits once its children have ended,
    which they have: every trial ended) and wait for it; SIGKILL if it lingers."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
