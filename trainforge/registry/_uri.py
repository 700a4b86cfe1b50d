"""Model references: ``models:/name/3``, ``models:/name@production``, ``models:/name`` (the latest
version), the same without ``models:/``, and ``?registry=<url>`` naming the registry."""

from __future__ import annotations

import dataclasses
import re

SCHEME = "models:/"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(name: object, what: str = "name") -> str:
    """``name`` when a model (or alias) may be called that; ValueError saying what is allowed otherwise."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"{what}={name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit, at "
            "most 100 characters (e.g. 'digits-mlp')"
        )
    return name


def check_alias(alias: object) -> str:
    check_name(alias, "alias")
    assert isinstance(alias, str)
    if alias.isdigit() or alias == "latest":
        raise ValueError(
            f"alias={alias!r} would read as a version: all digits and 'latest' are not allowed (e.g. "
            "'production', 'staging', 'v3')"
        )
    return alias


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """A parsed reference: ``version`` or ``alias`` or neither (the latest version); ``registry``
    when the URI named one (``?registry=s3://bucket/registry``)."""

    name: str
    version: int | None = None
    alias: str | None = None
    registry: str | None = None

    def __str__(self) -> str:
        tail = f"/{self.version}" if self.version is not None else f"@{self.alias}" if self.alias else ""
        return f"{SCHEME}{self.name}{tail}"


def is_model_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def parse_model_uri(ref: str) -> ModelRef:
    """Parse ``models:/name/3``, ``models:/name@alias``, ``models:/name`` (or those without
    ``models:/``; ``name/latest`` is the latest version); ValueError saying the accepted forms."""
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"model reference {ref!r}: give 'models:/name/3', 'models:/name@production' or 'models:/name'")
    text = ref.strip()
    body, sep, query = text.partition("?")
    registry = None
    if sep:
        from urllib.parse import parse_qs

        given = parse_qs(query).get("registry")
        if not given or set(parse_qs(query)) != {"registry"}:
            raise ValueError(f"{ref!r}: the only query a model URI takes is ?registry=<url>")
        registry = given[0]
    body = body.removeprefix(SCHEME).strip("/")
    version: int | None = None
    alias: str | None = None
    if "@" in body:
        name, _, alias = body.partition("@")
        check_alias(alias)
    elif "/" in body:
        name, _, tail = body.partition("/")
        if tail != "latest":
            if not tail.isdigit() or int(tail) < 1:
                raise ValueError(f"{ref!r}: the version must be a number from 1 (or 'latest'), got {tail!r}")
            version = int(tail)
    else:
        name = body
    try:
        check_name(name)
    except ValueError as exc:
        raise ValueError(f"{ref!r}: the model's {exc}") from None
    return ModelRef(name, version, alias, registry)
