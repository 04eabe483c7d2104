"""The models one server serves: each with its own engine (``EngineHost``), config and
names, and the rule that picks one for a request (its ``model`` field; none = the first;
an unknown one is 404 ``model_not_found``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from diffserve.config.resolved import ResolvedConfig
from diffserve.engine.client import AsyncEngineClient
from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.engine_host import EngineFactory, EngineHost
from diffserve.registry.models import makes_videos


@dataclass(frozen=True)
class ModelServing:
    """What a caller of ``create_app`` gives for one model: a ready engine or a factory,
    its config, its names."""

    name: str
    engine: AsyncEngineClient | None = None
    factory: EngineFactory | None = None
    config: ResolvedConfig | None = None
    aliases: tuple[str, ...] = ()


@dataclass
class ServedModel:
    """One model of a running server."""

    name: str
    # The name and its aliases: what a request's ``model`` may say.
    names: frozenset[str]
    host: EngineHost
    config: ResolvedConfig | None
    makes: str  # "images" or "videos": which API serves it


class ServedModels:
    """The server's models in the order given; the first is the one a request without
    ``model`` gets."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a server serves at least one model")
        shared = first_shared_name([model.names for model in models])
        if shared is not None:
            raise ValueError(
                f"two models answer to {shared!r}; give them distinct names"
            )
        self.models = list(models)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def first(self) -> ServedModel:
        return self.models[0]

    def pick(
        self, requested: str | None, *, default_makes: str | None = None
    ) -> ServedModel:
        """The model a request names, or the 404 it gets. None: the first model (the
        first that makes ``default_makes`` when given, so a request to the videos API
        without ``model`` gets the video model)."""
        if requested is None:
            return next(
                (m for m in self.models if m.makes == default_makes), self.first
            )
        for model in self.models:
            if requested in model.names:
                return model
        raise APIError(
            404,
            f"model {requested!r} is not served here; GET /v1/models lists "
            f"{[m.name for m in self.models]}",
            param="model",
            code="model_not_found",
        )

    def find(self, name: str) -> ServedModel | None:
        return next((m for m in self.models if name in m.names), None)


def first_shared_name(name_sets: Iterable[Iterable[str]]) -> str | None:
    """A name that two of the models answer to (each model's name and aliases a set), or
    None."""
    owner: dict[str, int] = {}
    for index, names in enumerate(name_sets):
        for name in names:
            if owner.setdefault(name, index) != index:
                return name
    return None


def makes_of(config: ResolvedConfig | None) -> str:
    """What a model's requests produce: "videos" for a video family, else "images" (also
    for a test's stand-in config without a model)."""
    model = getattr(config, "model", None)
    return "videos" if model is not None and makes_videos(model) else "images"
