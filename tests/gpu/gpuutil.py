"""Helpers of the GPU tests that other processes import by name: the registry loader that puts a
model on the GPU, and a server job's loop."""

from __future__ import annotations

import os
import time
from typing import Any

LOADED: list[Any] = []  # every model load_on_cuda returned in this process


def load_on_cuda(directory: str) -> Any:
    """A registry loader (``loader="gpuutil:load_on_cuda"``): the version's ``trainforge.model.Model``,
    its networks moved to ``cuda``; its ``device`` then says ``cuda:0``, where ``preprocess`` puts inputs."""
    from trainforge.model import Model, load_model

    model = load_model(directory, Model)
    for net in model.models:
        net.to("cuda")
    LOADED.append(model)
    return model


def gpu_job(config: dict[str, Any]) -> None:
    """A server job's loop: report what the worker sees, hold ``config["mib"]`` MiB on its GPU (if it
    has one) until the file ``config["gate"]`` exists, report again."""
    import torch

    import trainforge
    from trainforge.torch import get_device

    device = get_device()
    info: dict[str, Any] = {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "available": torch.cuda.is_available(),
                            "count": torch.cuda.device_count(), "device": str(device), "pid": os.getpid()}  # fmt: skip
    held = None
    if device.type == "cuda":
        held = torch.ones(config["mib"] * 2**20, dtype=torch.uint8, device=device)
        info["uuid"] = "GPU-" + str(torch.cuda.get_device_properties(device).uuid).removeprefix("GPU-")
        info["held"] = int(held.sum().item())
    trainforge.report({**info, "step": 0})
    while not os.path.exists(config["gate"]):  # the test reads the job's usage meanwhile
        time.sleep(0.02)
    trainforge.report({**info, "step": 1})
    del held
