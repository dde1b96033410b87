"""The registry of memory plugins: a decorator for in-tree and notebook code, and the entry-point
group `memzoo.memories` for plugins shipped by other installed packages.

    @register_memory("my-memory", config=MyConfig)
    class MyMemory(LayerMemory): ...

An entry point names the module (or object) to import; importing it runs its decorators. The
in-tree plugins (memzoo.memories, a layer above this one) register when `import memzoo` imports
that package; discovery here loads the entry points.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Optional

from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerMemory, MemoryParts, ModelMemory, NoMemory

ENTRY_POINT_GROUP = "memzoo.memories"


class UnknownMethodError(KeyError):
    """An unknown method name; the message lists the registered ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message plainly
        return str(self.args[0])


@dataclass(frozen=True)
class MemorySpec:
    name: str
    cls: type
    config_cls: type
    defaults: dict[str, Any] = field(default_factory=dict)  # config values this entry fixes (e.g. rule)
    source: str = "memzoo"  # module that registered it

    @property
    def level(self) -> str:
        return "model" if issubclass(self.cls, ModelMemory) else "layer"

    def config(self, **options: Any) -> Any:
        return self.config_cls(**{**self.defaults, **options})


_REGISTRY: dict[str, MemorySpec] = {}
_discovered = False


def register_memory(name: str, *, config: type, defaults: Optional[dict[str, Any]] = None) -> Callable[[type], type]:
    """Class decorator: register a LayerMemory/ModelMemory subclass under `name`.

    `config` is the method's config dataclass; `defaults` fixes some of its fields for this entry,
    so one class can be registered twice (e.g. Infini with the linear and the delta rule).
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"a memory name must be a non-empty string, got {name!r}")

    def decorate(cls: type) -> type:
        if not (issubclass(cls, LayerMemory) or issubclass(cls, ModelMemory)):
            raise TypeError(f"{cls.__name__} must subclass LayerMemory or ModelMemory to be registered as {name!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.cls.__qualname__ != cls.__qualname__:
            warnings.warn(f"memory {name!r} re-registered: {existing.cls.__qualname__} -> {cls.__qualname__}", stacklevel=2)
        _REGISTRY[name] = MemorySpec(name, cls, config, dict(defaults or {}), cls.__module__)
        if not cls.name:
            cls.name = name
        return cls

    return decorate


def unregister_memory(name: str) -> None:
    _REGISTRY.pop(name, None)


def discover() -> None:
    """Import every `memzoo.memories` entry point (once); the in-tree plugins registered at `import memzoo`."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # a broken third-party plugin must not break the zoo
            warnings.warn(f"could not load memzoo plugin entry point {ep.name!r} ({ep.value}): {err}", stacklevel=2)


def rediscover() -> None:
    """Forget that discovery ran (after installing a package that adds plugins)."""
    global _discovered
    _discovered = False
    discover()


def registered() -> dict[str, MemorySpec]:
    discover()
    return dict(sorted(_REGISTRY.items()))


def get_memory(name: str) -> MemorySpec:
    discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UnknownMethodError(f"unknown memory method {name!r}; registered: {known}") from None


def build_memory(name: str, cfg: Any, model: ModelConfig) -> MemoryParts:
    """Instantiate a method's memories for a model: one per layer, or one at model level."""
    spec = get_memory(name)
    if spec.level == "model":
        layers = [NoMemory(None, model, i) for i in range(model.n_layers)]
        return MemoryParts(layers=layers, model=spec.cls(cfg, model))
    return MemoryParts(layers=[spec.cls.for_layer(cfg, model, i) for i in range(model.n_layers)], model=None)
