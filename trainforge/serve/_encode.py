"""JSON in and out of a served model: instances become the model's input (:func:`infer`), its
outputs one JSON-able value per instance (:func:`split_outputs`), and an answer's bytes
(:func:`encode_outputs`, NaN and infinities as null: the HTTP foundation's ``json_safe``). Run in the
worker thread."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from trainforge._internal.http import json_detail, json_safe


def infer(model: Callable[[Any], Any], instances: list[Any]) -> list[Any]:
    """``model(batch)`` on a list of JSON instances, split into one JSON-able output per instance.
    A model object without its own ``preprocess`` gets them as its framework's input (:func:`adapt_input`)."""
    return split_outputs(model(adapt_input(model, instances)), len(instances))


def adapt_input(model: Any, instances: list[Any]) -> Any:
    """A model object without its own ``preprocess`` gets its framework's input (torch: a float32
    tensor; XGBoost, LightGBM, Keras: a float32 array); anything else the JSON instances."""
    from trainforge.model import BaseModel

    if isinstance(model, BaseModel) and type(model).preprocess is BaseModel.preprocess:
        return model._default_input(instances)
    return instances


def split_outputs(output: Any, n: int) -> list[Any]:
    """One JSON-able output per instance: a tensor or array's rows, a list's items, or for a dict of
    per-instance values, one dict per instance."""
    if _is_array(output):
        if len(getattr(output, "shape", ())) == 0 or output.shape[0] != n:
            raise ValueError(f"the model returned an array of shape {tuple(output.shape)} for {n} instance(s): "
                             f"its first dimension must be {n}, one output per instance")  # fmt: skip
        return _to_list(output)  # type: ignore[no-any-return]
    if isinstance(output, (list, tuple)):
        if len(output) != n:
            raise ValueError(f"the model returned {len(output)} outputs for {n} instance(s): return one output per instance")
        return [jsonable(x) for x in output]
    if isinstance(output, dict) and output:
        columns = {str(k): split_outputs(v, n) for k, v in output.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(n)]
    raise ValueError(f"the model returned a {type(output).__name__} for {n} instance(s): return a tensor, array or "
                     "list with one output per instance (first dimension), or a dict of them")  # fmt: skip


def _is_array(x: Any) -> bool:
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    return (torch is not None and isinstance(x, torch.Tensor)) or (np is not None and isinstance(x, np.ndarray))


def _to_list(x: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
    return x.tolist()


def jsonable(x: Any) -> Any:
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if _is_array(x):
        return _to_list(x)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    raise TypeError(f"an output of type {type(x).__name__} is not JSON: return numbers, strings, lists, tensors or "
                    "arrays from postprocess")  # fmt: skip


def encode_outputs(outputs: list[Any], model_json: bytes) -> tuple[int, bytes]:
    """``(200, {"outputs": [...], "model": <model_json>})`` as bytes, NaN and infinities as null;
    ``(422, {"detail": ...})`` when an output is not JSON."""
    try:
        try:
            encoded = json.dumps(outputs, allow_nan=False, separators=(",", ":")).encode()
        except ValueError:  # NaN or infinity: null
            encoded = json.dumps(json_safe(outputs, nonfinite="null"), allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        return 422, json_detail(f"the model's outputs are not JSON: {exc}")
    return 200, b'{"outputs":' + encoded + b',"model":' + model_json + b"}"


def json_type(x: Any) -> str:
    """The JSON name of ``x``'s type (``object``, ``array``, ...), for messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(x), type(x).__name__)  # fmt: skip
