"""A tiny ``trainforge.model.Model`` for the serving tests: ``[a, b] -> scale * (a + b)``."""

from __future__ import annotations

from typing import Any

import pytest


def affine_model(scale: float) -> Any:
    """A Model: [a, b] -> scale * (a + b). Defined in a function, so it is saved by value and a
    server process needs no import path for it."""
    torch = pytest.importorskip("torch")
    from trainforge.model import Model

    class Affine(Model):
        def setup(self, config: dict[str, Any]) -> None:
            net = torch.nn.Linear(2, 1)
            with torch.no_grad():
                net.weight.fill_(config["scale"])
                net.bias.zero_()
            self.register(models=net)

        def preprocess(self, data: Any) -> Any:
            return torch.as_tensor(data, dtype=torch.float32).reshape(-1, 2)

        def postprocess(self, output: Any) -> Any:
            return output.squeeze(-1)

    return Affine({"scale": scale})
