"""Where a served model comes from: a ``ModelSource`` says which version is current (``resolve``, cheap,
polled) and builds it (``load``, slow, run in the background).

    RegistrySource("models:/digits@production")   follows an alias (or the latest version) of a registry
    StaticSource(model)                            one in-memory model object (tests, notebooks)
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

from trainforge.registry import SCHEME as MODEL_URI_SCHEME


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The version that answers: ``name``, ``version`` and its exact ``uri`` (``models:/name/3``);
    ``size``: bytes of its files when known."""

    name: str
    version: int
    uri: str
    size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "uri": self.uri}


class ModelGoneError(LookupError):
    """What ``resolve`` raises when the model, version or alias it serves no longer exists (deleted):
    the engine then answers 404 until it resolves again."""


class ModelSource(abc.ABC):
    """Where the served model comes from. Both methods run in a worker thread, never on the event loop."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What is served, for messages (``models:/digits@production``)."""

    @abc.abstractmethod
    def resolve(self) -> ModelInfo:
        """The version that should be served now (polled every ``poll_s``: keep it cheap)."""

    @abc.abstractmethod
    def load(self, info: ModelInfo) -> Callable[[Any], Any]:
        """The model object of ``info`` (what ``resolve`` returned), ready for ``model(batch)``."""

    @property
    def follows(self) -> bool:
        """Whether ``resolve`` can name another version over time (an alias, the latest)."""
        return True

    @property
    def watched(self) -> bool:
        """Whether ``resolve`` is asked every ``poll_s``: a source that follows, or whose version can be
        deleted (False: never polled)."""
        return True


class StaticSource(ModelSource):
    """One model object, always the same version: ``StaticSource(model, name="digits", version=1)``."""

    def __init__(self, model: Callable[[Any], Any], *, name: str = "model", version: int = 1):
        if not callable(model):
            raise TypeError(f"StaticSource(model={model!r}): give a callable model object (model(batch) -> outputs).")
        self._model = model
        self._info = ModelInfo(name, int(version), f"{MODEL_URI_SCHEME}{name}/{int(version)}")

    def describe(self) -> str:
        return f"{self._info.name} (in memory)"

    def resolve(self) -> ModelInfo:
        return self._info

    def load(self, info: ModelInfo) -> Callable[[Any], Any]:
        return self._model

    @property
    def follows(self) -> bool:
        return False

    @property
    def watched(self) -> bool:
        return False


def split_registry(uri: str, registry: str | None) -> tuple[str, str | None]:
    """``("models:/name@alias", registry)`` from a URI that may carry ``?registry=<url>``
    (parsed by :func:`trainforge.registry.parse_model_uri`)."""
    from trainforge.registry import ModelRef, parse_model_uri

    ref = parse_model_uri(uri)
    if ref.registry is not None and registry is not None and registry != ref.registry:
        raise ValueError(f"{uri!r} names registry {ref.registry!r} but {registry!r} was given too: give one.")
    return str(ModelRef(ref.name, ref.version, ref.alias)), ref.registry or registry


class RegistrySource(ModelSource):
    """A model of a ``trainforge.registry.Registry``: ``ref`` is ``models:/name@alias`` (followed),
    ``models:/name`` (the latest version, followed) or ``models:/name/3`` (fixed); ``name@alias`` and
    ``name/3`` work too. ``resolve`` reads the alias (one small file); ``load`` loads the exact version
    that ``resolve`` named, so an alias moving again meanwhile is picked up at the next poll.
    ``models:/name`` follows the latest *trained* version (a definition registered since is not
    served); an alias or version naming a definition is refused."""

    def __init__(self, ref: str, registry: str | None = None):
        if not isinstance(ref, str) or not ref.strip():
            raise ValueError(f"RegistrySource(ref={ref!r}): give a model URI such as 'models:/name@production'.")
        self.ref, self.registry_uri = split_registry(ref.strip(), registry)
        self._fixed = "@" not in self.ref and self.ref.count("/") > 1  # models:/name/3
        self._registry: Any = None

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from trainforge.registry import Registry

            self._registry = Registry(self.registry_uri)
        return self._registry

    def describe(self) -> str:
        where = f" in {self.registry.uri}" if self._registry is not None else ""
        return f"{self.ref}{where}"

    def resolve(self) -> ModelInfo:
        from trainforge.registry import ModelNotFoundError

        try:
            mv = self.registry.get(self.ref, kind="trained")  # models:/name: its latest trained version
        except ModelNotFoundError as exc:  # deleted (a fixed version is watched for this too)
            raise ModelGoneError(str(exc)) from exc
        if mv.kind != "trained":
            raise ValueError(f"{mv.uri} is a model definition (a class and its config, no trained state): train it "
                             f"(`trainforge train {mv.uri}`), register the result and serve that")  # fmt: skip
        return ModelInfo(mv.name, int(mv.version), mv.uri, getattr(mv, "size", None))

    def load(self, info: ModelInfo) -> Callable[[Any], Any]:
        model = self.registry.load(info.uri)
        if not callable(model):
            raise TypeError(f"{info.uri} loaded as {type(model).__name__}, which is not callable: register it with a "
                            "trainforge.model.Model class or a loader returning a callable model.")  # fmt: skip
        return model

    @property
    def follows(self) -> bool:
        return not self._fixed
