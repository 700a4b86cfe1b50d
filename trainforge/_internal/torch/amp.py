"""Mixed precision in a torch train loop: ``accelerate(amp=True)``, ``prepare_optimizer``, ``backward``
(Ray Train's helpers of the same names).

``accelerate(amp=True)`` is called once per worker, before ``prepare_model``; then the model's
``forward`` runs under ``torch.autocast`` and, where the dtype needs one, a gradient scaler scales the
loss (``backward(loss)``) and unscales, checks and steps the optimizer (``prepare_optimizer(opt).step()``):

- on a GPU: float16 with a ``GradScaler`` (as ``torch.amp`` recommends);
- on the CPU: bfloat16, which has float32's range and needs no scaler.

``amp_dtype`` (a trainforge extension) picks the dtype instead: ``"float16"`` on the CPU uses the
scaler too. Without ``accelerate(amp=True)``, ``prepare_optimizer`` returns the optimizer as it is and
``backward(t)`` is ``t.backward()``, so a loop written with them runs in full precision unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class _Amp:
    device_type: str
    dtype: torch.dtype
    scaler: Any  # a torch.amp.GradScaler, or None (bfloat16)


_state: dict[str, Any] = {"called": False, "amp": None, "model_prepared": False}


def accelerate(amp: bool = False, amp_dtype: torch.dtype | str | None = None) -> None:
    """Turn on mixed precision for this worker's loop (call once, before ``prepare_model``)."""
    if _state["called"]:
        raise RuntimeError(
            "trainforge.torch.accelerate() was already called in this worker: call it once, at the top of "
            "the train loop, before prepare_model()."
        )
    if not isinstance(amp, bool):
        raise ValueError(f"accelerate(amp={amp!r}) is not valid: use True or False")
    dtype = _dtype(amp_dtype)
    if amp and _state["model_prepared"]:
        raise RuntimeError(
            "trainforge.torch.accelerate(amp=True) came after prepare_model(): call it first, so the "
            "model's forward runs under autocast."
        )
    _state["called"] = True
    if not amp:
        return
    from trainforge._internal.torch.device import get_device

    device_type = get_device().type
    if dtype is None:
        dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device_type) if dtype == torch.float16 else None
    _state["amp"] = _Amp(device_type, dtype, scaler)


def _dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    if value is None or value in (torch.float16, torch.bfloat16):
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value in _DTYPES:
        return _DTYPES[value]
    raise ValueError(f"accelerate(amp_dtype={value!r}) is not valid: use None, 'float16' or 'bfloat16'")


def current() -> _Amp | None:
    """The worker's mixed-precision setting (None: full precision)."""
    return _state["amp"]


def note_model_prepared() -> None:
    _state["model_prepared"] = True


def reset() -> None:
    """Forget ``accelerate()`` and ``prepare_model()`` (tests; a worker process runs one loop)."""
    _state.update(called=False, amp=None, model_prepared=False)


def autocast_forward(model: torch.nn.Module) -> torch.nn.Module:
    """``model.forward`` under autocast when mixed precision is on (called by ``prepare_model``, before
    any DDP wrapping, so DDP calls the autocast forward). Its outputs stay in the autocast dtype; a
    loss computed from them under the same precision is what ``torch.amp`` expects."""
    amp = current()
    if amp is None or getattr(model, "_trainforge_autocast", False):
        return model
    original = model.forward
    model.forward = _AutocastForward(original, amp.device_type, amp.dtype)  # type: ignore[method-assign]
    model._trainforge_autocast = True  # type: ignore[assignment]
    return model


class _AutocastForward:
    """A picklable ``forward`` under autocast (a closure would make the model unpicklable, and with it
    ``torch.save(model)``)."""

    def __init__(self, forward: Any, device_type: str, dtype: torch.dtype):
        self.forward = forward
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.forward(*args, **kwargs)


class _ScaledOptimizer:
    """An optimizer whose ``step()`` goes through the gradient scaler (unscale, skip on inf/NaN
    gradients, update the scale); everything else is the optimizer's own."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any):
        self.optimizer = optimizer
        self.scaler = scaler

    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("prepare_optimizer(): step(closure) is not supported with a gradient scaler")
        out = self.scaler.step(self.optimizer)
        self.scaler.update()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    """``optimizer`` ready for mixed precision: with a scaler, a wrapper whose ``step()`` unscales and
    checks the gradients; otherwise the optimizer itself."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"prepare_optimizer(optimizer=...) takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
    amp = current()
    if amp is None or amp.scaler is None:
        return optimizer
    return _ScaledOptimizer(optimizer, amp.scaler)


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, through the gradient scaler when mixed precision uses one."""
    amp = current()
    if amp is None or amp.scaler is None:
        tensor.backward()
    else:
        amp.scaler.scale(tensor).backward()
