"""The predict route's HTTP pieces, shared by ``trainforge serve`` (:mod:`~trainforge.serve._app`) and
the train server's ``/api/v1/serve/...`` routes: its OpenAPI description, its body read up to a limit,
and its answer from a :class:`~trainforge.serve._engine.ServeEngine`. Imports no web framework until
an answer is built (``import trainforge.serve`` stays light)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainforge._internal.http import json_detail
from trainforge.serve._engine import ServeEngine

if TYPE_CHECKING:
    from fastapi import Request, Response


def predict_openapi(**more: str) -> dict[str, Any]:
    """The OpenAPI description of a predict route (its body and answers; ``more``: other statuses)."""
    responses = {
        "200": {"description": '{"outputs": [one per instance], "model": {"name", "version", "uri"}}',
                "content": {"application/json": {}}},
        "400": {"description": "the body is not JSON, or nests deeper than 100 levels"},
        "413": {"description": "too many instances, or too large a body"},
        "415": {"description": "the body is not sent as JSON (Content-Type: application/json)"},
        "422": {"description": 'no "inputs" list, or the model failed on these inputs (the reason)'},
        **{status: {"description": text} for status, text in more.items()},
    }
    body = {"type": "object", "required": ["inputs"],
            "properties": {"inputs": {"type": "array", "minItems": 1, "items": {},
                                      "description": "the instances, one per input of the model"}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": dict(sorted(responses.items()))}  # fmt: skip


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it passes ``limit`` bytes (413)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def predict_response(request: Request, engine: ServeEngine, max_body_bytes: int) -> Response:
    """The answer to a predict request (a body ``{"inputs": [...]}``) from ``engine``: 413 for a body
    over ``max_body_bytes``, else what :meth:`ServeEngine.handle` answers."""
    from fastapi import responses

    body = await read_body(request, max_body_bytes)
    if body is None:
        engine.refuse(413)
        detail = f"the body is larger than this server takes ({max_body_bytes} bytes): split the request"
        return responses.Response(json_detail(detail), status_code=413, media_type="application/json")
    status, payload = await engine.handle(body)
    return responses.Response(payload, status_code=status, media_type="application/json")
