"""The user's train loop: checking its signature on the driver, running it in a worker."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from trainforge._internal.checkpoint import Checkpoint
from trainforge._internal.progress import console_warnings
from trainforge._internal.session import Session, TrainContext, set_session


def check_train_loop(fn: Any) -> bool:
    """Validate a train loop; return True when it takes ``train_loop_config``.

    Accepted: a callable (function, lambda, closure, ``async def``, callable object) with 0 or 1
    required positional parameters.
    """
    if not callable(fn):
        raise TypeError(f"train_loop_per_worker={fn!r} must be a callable taking 0 or 1 argument (the config).")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # builtins etc.: assume it takes the config
    positional = [
        p
        for p in sig.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    has_varargs = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values())
    kw_required = [
        p.name
        for p in sig.parameters.values()
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    if kw_required:
        raise TypeError(
            f"train_loop_per_worker {getattr(fn, '__name__', fn)!r} has required keyword-only arguments "
            f"({', '.join(kw_required)}) that trainforge cannot pass; give them defaults or read them from "
            "train_loop_config."
        )
    if len(required) > 1:
        names = ", ".join(p.name for p in required)
        raise TypeError(
            f"train_loop_per_worker {getattr(fn, '__name__', fn)!r} has {len(required)} required arguments "
            f"({names}); it must take 0 arguments or 1 (train_loop_config). Pass extra values through "
            "train_loop_config={...}."
        )
    return bool(positional) or has_varargs


@dataclass
class TrainPayload:
    """Everything a worker needs to run its part of the train loop (cloudpickled by the driver)."""

    train_fn: Callable[..., Any]
    takes_config: bool
    config: dict[str, Any] | None
    context: TrainContext
    storage: Any
    checkpoint: Checkpoint | None
    shards: dict[str, Any]
    upload_mode: str = "SYNC"  # the run's default CheckpointUploadMode (its value)
    # BackendConfig.train_func_context: the context manager factory the loop runs in (None: none).
    train_func_context: Callable[[], Any] | None = None


def run_train_payload(blob: bytes, send: Callable[[tuple], None]) -> int:
    """Run a train loop in this worker process; return how many times it reported. Returns (or
    raises) only once the rank's pending asynchronous checkpoint uploads are done."""
    # trainforge's warnings in this worker (storage retries, prepare_data_loader) go to its stderr,
    # i.e. to logs/rank_N.log and to the driver's console with the rank prefix.
    with console_warnings():
        return _run_train_payload(blob, send)


def _run_train_payload(blob: bytes, send: Callable[[tuple], None]) -> int:
    import cloudpickle

    payload: TrainPayload = cloudpickle.loads(blob)
    session = Session(
        payload.context, send, payload.storage, payload.checkpoint, payload.shards, payload.upload_mode
    )
    set_session(session)
    try:
        args = (payload.config if payload.config is not None else {},) if payload.takes_config else ()
        try:
            with payload.train_func_context() if payload.train_func_context is not None else nullcontext():
                out = payload.train_fn(*args)
                if inspect.isawaitable(out):
                    asyncio.run(_await(out))
        except SystemExit as exc:
            # sys.exit(0) in the loop is a normal end (see worker_main): its uploads must finish too.
            session.close(wait=exc.code in (0, None))
            raise
        except BaseException:
            session.close(wait=False)  # the loop failed: its pending reports no longer matter
            raise
        # Pending asynchronous uploads are part of the loop: a failed one fails this worker.
        session.close(wait=True)
    finally:
        set_session(None)
    return session.report_count


async def _await(awaitable: Any) -> Any:
    return await awaitable
