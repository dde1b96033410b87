"""Config files and overrides: YAML presets with `defaults:` chains, `key=value` items, and a merge
whose failure names the key and what it expected (the schema itself is memzoo.core.config)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memzoo.core.config import ConfigError
from memzoo.core.resources import resource_dir


def preset_path(name_or_path: str) -> Path:
    """A YAML path as given, else a preset shipped in memzoo/configs/ (e.g. `infini-linear`, `paper/table1`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    root = resource_dir("configs")
    for candidate in (root / name_or_path, root / f"{name_or_path}.yaml", root / "presets" / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    raise ConfigError(f"config {name_or_path!r} is neither a file nor a shipped preset; presets: {', '.join(known)}")


def load_yaml_chain(path: Path) -> DictConfig:
    """Load YAML honouring an optional `defaults: [other.yaml, ...]` list (paths relative to the file)."""
    raw = OmegaConf.load(path)
    parents = raw.pop("defaults", []) if isinstance(raw, DictConfig) else []
    merged = OmegaConf.create()
    for parent in parents:
        merged = OmegaConf.merge(merged, load_yaml_chain((path.parent / parent).resolve()))
    return OmegaConf.merge(merged, raw)


def parse_overrides(overrides: list[str]) -> DictConfig:
    """`key=value` items as one config; a malformed item (no `=`, an empty key part, a value YAML cannot
    read, such as an unclosed quote or bracket, sub-keys of another item's list) is an error naming it."""
    for item in overrides:
        key, eq, _ = item.partition("=")
        if not eq:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(f"override {item!r}: {key!r} is not a dotted key such as train.steps")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError) as err:
        raise _override_error(list(overrides), err) from None


def split_indexed(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(plain overrides, those that reach into a list by index, such as `longrange.0.trials=32`).
    The second kind cannot be merged as a mapping: `apply_indexed` sets them on the merged config."""
    def indexed(item: str) -> bool:
        return any(part.strip().isdigit() for part in item.partition("=")[0].split("."))
    return [o for o in overrides if not indexed(o)], [o for o in overrides if indexed(o)]


def apply_indexed(cfg: DictConfig, overrides: list[str], where: str) -> DictConfig:
    """Set `key.N.sub=value` overrides on a merged config, in order; an index past the list's end
    or a key the entry cannot take is a ConfigError naming the override."""
    for item in overrides:
        key, _, text = item.partition("=")
        try:
            value = parse_overrides([f"value={text}"]).value
        except ConfigError:
            raise _override_error([item], ValueError(text)) from None
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except (OmegaConfBaseException, TypeError, ValueError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"bad config {where}: override {item!r} ({first}); "
                              "an index must name an existing entry of the list") from None
    return cfg


def _override_error(overrides: list[str], err: BaseException) -> ConfigError:
    """The ConfigError for overrides that failed to parse together: the first item that fails alone
    (its value), else the first that does not fit those before it."""
    for item in overrides:
        try:
            OmegaConf.from_dotlist([item])
        except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError) as alone:
            value = item.partition("=")[2]
            return ConfigError(f"override {item!r}: the value {value!r} cannot be read ({str(alone).splitlines()[0]}); "
                               "quote a string with both quotes, close every bracket")
    for i, item in enumerate(overrides):
        try:
            OmegaConf.from_dotlist(overrides[: i + 1])
        except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError) as clash:
            return ConfigError(f"override {item!r} does not fit the overrides before it ({str(clash).splitlines()[0]}): "
                               "sub-keys of a list or of a value")
    return ConfigError(f"could not parse overrides {overrides}: {str(err).splitlines()[0]}")


def resolve_interpolations(cfg: DictConfig, where: str = "") -> DictConfig:
    """Resolve `${...}` references in place (a value may name another key, e.g. ${train.batch_size});
    one that names no key, or loops, is an error naming it."""
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or where
        raise ConfigError(f"bad interpolation at {key!r}: {str(err).splitlines()[0]}") from None
    return cfg


def _shape(node: Any) -> str:
    """What a config node is, in words: a section, a list or a value."""
    return "a section" if isinstance(node, (DictConfig, dict)) else "a list" if isinstance(node, (ListConfig, list)) else "a value"


def _shape_mismatch(base: Any, layer: Any, prefix: str = "") -> Optional[str]:
    """The first dotted key where `layer` gives a section, list or value in place of `base`'s other kind
    (train.betas.x=1: sub-keys of a list; train=3: a value for a section), described; None if none."""
    if not isinstance(layer, (DictConfig, dict)) or not isinstance(base, (DictConfig, dict)):
        return None
    for key in layer.keys():
        if key not in base:
            continue
        old, new = base[key], layer[key]
        if old is not None and new is not None and _shape(old) != _shape(new):
            return f"{prefix}{key} is {_shape(old)}, given {_shape(new)} ({new!r})"
        found = _shape_mismatch(old, new, f"{prefix}{key}.")
        if found:
            return found
    return None


def _plain(node: Any) -> Any:
    """Containers as Python dicts and lists, `${...}` left unresolved (walking must not resolve them)."""
    return OmegaConf.to_container(node, resolve=False) if isinstance(node, (DictConfig, ListConfig)) else node


def _first_mismatch(schema: Any, layers: tuple[Any, ...]) -> Optional[str]:
    """_shape_mismatch of each layer against the merge of those before it."""
    merged = schema
    for layer in layers:
        found = _shape_mismatch(_plain(merged), _plain(layer))
        if found:
            return found
        try:
            merged = OmegaConf.merge(merged, layer)
        except (OmegaConfBaseException, TypeError):
            return None
    return None


def merge_checked(schema: Any, *layers: Any, where: str) -> DictConfig:
    """OmegaConf.merge, with a failure told as a ConfigError naming the key and what it expected."""
    try:
        return OmegaConf.merge(schema, *layers)
    except (OmegaConfBaseException, TypeError) as err:  # TypeError: "Cannot merge incompatible container types"
        shape = _first_mismatch(schema, layers)
        if shape:
            raise ConfigError(f"bad config {where + ': ' if where else ''}{shape}") from None
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        where_key = f"{where}.{key}" if where and key else (key or where)
        raise ConfigError(f"bad config key or value at {where_key!r}: {getattr(err, 'msg', None) or err}") from None
