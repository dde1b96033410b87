"""A run's configuration made usable: presets and `key=value` overrides merged into the schema
(memzoo.core.config) and validated where the registry and the tasks are both known, and the model
and device a resolved config names.

The `memory` section is checked against the chosen plugin's own config dataclass, so an unknown key
or a wrong type is an error that names it, wherever it appears.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError, model_config, run_schema, check_ranges
from memzoo.core.overrides import load_yaml_chain, merge_checked, parse_overrides, preset_path, resolve_interpolations
from memzoo.core.model import INIT_STREAMS, MemoryModel
from memzoo.core.plugins import get_memory, registered
from memzoo.core.precision import PRECISIONS
from memzoo.core.resources import resource_dir
from memzoo.data.tasks import check_task
from memzoo.runs.tracking import TRACKERS, check_log


_MEMORY_SCHEMAS: dict[str, tuple[Any, DictConfig]] = {}


def memory_schema(name: str, spec: Any) -> DictConfig:
    """A plugin's options schema (its config dataclass at its defaults), built once per registration:
    only pass it to a merge, which copies it."""
    known = _MEMORY_SCHEMAS.get(name)
    if known is None or known[0] is not spec:  # a name registered again (a plugin reloaded) gets its new schema
        known = _MEMORY_SCHEMAS[name] = (spec, OmegaConf.structured(spec.config_cls(**spec.defaults)))
    return known[1]


def memory_config(name: str, options: Any) -> Any:
    """Validate one method's options against its plugin's config dataclass; returns the dataclass."""
    spec = get_memory(name)
    opts = OmegaConf.create(options if options is not None else {})
    opts = OmegaConf.masked_copy(opts, [k for k in opts.keys() if k != "name"]) if "name" in opts else opts
    merged = merge_checked(memory_schema(name, spec), opts, where=f"memory[{name}]")
    return OmegaConf.to_object(merged)


DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # train.device


def check_head_width(d_model: int, n_heads: int, head_dim: Optional[int]) -> None:
    """The head width D must be a positive even integer (RoPE rotates pairs): model.head_dim, or
    d_model // n_heads when head_dim is unset, in which case n_heads must divide d_model."""
    if head_dim is None:
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ConfigError(
                f"model.d_model={d_model} must be divisible by model.n_heads={n_heads} into an even head width "
                "(RoPE rotates pairs), or set model.head_dim"
            )
        return
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1 or head_dim % 2:
        raise ConfigError(f"model.head_dim={head_dim!r}; expected a positive even integer (RoPE rotates pairs) or null")


def resolve(cfg: DictConfig) -> DictConfig:
    """Check the memory section against its plugin and derived constraints; returns the full config."""
    check_ranges(cfg)
    name = cfg.memory.get("name") if isinstance(cfg.memory, DictConfig) else None
    if not name:
        raise ConfigError("memory.name is missing; set it to a registered method (see `memzoo list`)")
    if not isinstance(name, str):
        raise ConfigError(f"memory.name={OmegaConf.to_container(name) if isinstance(name, DictConfig) else name!r}; "
                          f"expected a method's name (registered: {', '.join(registered())})")
    mem = memory_config(name, cfg.memory)
    cfg.memory = OmegaConf.merge({"name": name}, OmegaConf.structured(mem))
    for method, options in (cfg.methods or {}).items():
        if method in registered() or not _has_card(method):
            memory_config(method, options)  # validate early; raises naming the key or listing methods
    m = cfg.model
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "segment_len"):
        if m[key] < 1:
            raise ConfigError(f"model.{key}={m[key]}; expected a positive integer")
    check_head_width(m.d_model, m.n_heads, m.get("head_dim"))
    for key in ("valid_fraction", "test_fraction"):
        if not 0 <= cfg.data[key] < 1:
            raise ConfigError(f"data.{key}={cfg.data[key]}; expected a fraction in [0, 1)")
    if cfg.data.valid_fraction + cfg.data.test_fraction >= 1:
        raise ConfigError("data.valid_fraction + data.test_fraction must leave documents for training")
    for key in ("steps", "batch_size", "window_segments"):
        if cfg.train[key] < 1:
            raise ConfigError(f"train.{key}={cfg.train[key]}; expected a positive integer")
    if cfg.train.precision not in PRECISIONS:
        raise ConfigError(
            f"train.precision={cfg.train.precision!r}; expected fp32, bf16 or auto (fp16 would need loss scaling; use bf16)"
        )
    if not DEVICE.fullmatch(str(cfg.train.device)):
        raise ConfigError(f"train.device={cfg.train.device!r}; expected auto, cpu, cuda or cuda:INDEX")
    if cfg.log.tracker not in TRACKERS:
        raise ConfigError(f"log.tracker={cfg.log.tracker!r}; expected one of {', '.join(TRACKERS)}")
    check_log(cfg.log)
    if cfg.model.init_streams not in INIT_STREAMS:
        raise ConfigError(f"model.init_streams={cfg.model.init_streams!r}; expected one of {', '.join(INIT_STREAMS)}")
    if cfg.model.init not in ("small", "torch"):
        raise ConfigError(f"model.init={cfg.model.init!r}; expected small or torch")
    if cfg.model.attention_backend not in ("auto", "sdpa", "xformers"):
        raise ConfigError(f"model.attention_backend={cfg.model.attention_backend!r}; expected auto, sdpa or xformers")
    if cfg.train.bptt_segments < 1 or (cfg.task.name == "lm" and cfg.train.window_segments % cfg.train.bptt_segments):
        raise ConfigError(
            f"train.bptt_segments={cfg.train.bptt_segments} must be >= 1 and divide train.window_segments={cfg.train.window_segments}"
        )
    try:
        check_task(cfg.task, cfg.model.segment_len)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return cfg


def _has_card(name: str) -> bool:
    """A catalogued method that is not implemented yet may still be listed (footprint from its card)."""
    return (resource_dir("registry") / f"{name}.yaml").is_file()


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Schema <- preset YAML <- `key=value` overrides, validated. Errors name the bad key."""
    schema = run_schema()
    layers: list[Any] = []
    if name_or_path:
        layers.append(load_yaml_chain(preset_path(name_or_path)))
    if overrides:
        layers.append(parse_overrides(overrides))
    # `memory` is free-form in the schema: when an override changes the method, the preset's
    # options belong to the old method and are dropped, not merged into the new one.
    if overrides and layers and "memory" in layers[0]:
        new_name = OmegaConf.select(layers[-1], "memory.name")
        if new_name is not None and new_name != layers[0].memory.get("name"):
            layers[0] = OmegaConf.merge(layers[0], {})
            layers[0].memory = {"name": new_name}
    cfg = merge_checked(schema, *layers, where="")
    return resolve(resolve_interpolations(cfg))


def pick_device(name: str, what: str = "train.device") -> torch.device:
    """The device `what` (train.device, --device) names (auto: CUDA when present); asking for a missing CUDA is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE.fullmatch(str(name)):
        raise ConfigError(f"{what}={name!r}; expected auto, cpu, cuda or cuda:INDEX")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{what}={name!r} but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


def run_device(cfg: DictConfig) -> torch.device:
    """The device a run trains on, checked against what the model needs (xformers: CUDA only)."""
    device = pick_device(cfg.train.device)
    if cfg.model.attention_backend == "xformers" and device.type != "cuda":
        raise ConfigError(f"model.attention_backend=xformers needs a CUDA device (xformers has no CPU kernels) and "
                          f"train.device={cfg.train.device!r} gives {device.type}; use model.attention_backend=sdpa or auto")
    return device


def use_tf32(cfg: DictConfig, device: torch.device) -> None:
    """Set CUDA's TF32 switches (matrix products, cuDNN) to the run's train.tf32 when it runs on CUDA; on
    the CPU leave them (they do not apply there)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bool(cfg.train.tf32)
        torch.backends.cudnn.allow_tf32 = bool(cfg.train.tf32)


def build_model(cfg: DictConfig) -> MemoryModel:
    """The untrained model of a resolved config: the backbone with its method's memory, initialised
    from the run's seed (`model.init_streams`)."""
    return MemoryModel(model_config(cfg), cfg.memory.name, memory_config(cfg.memory.name, cfg.memory), seed=int(cfg.seed))


# Keys added to the schema after run folders existed, with the value an older folder was made under
# (a saved config.yaml without them describes a run made before them, not under today's default).
LEGACY_DEFAULTS = {"model.init_streams": "shared"}


def legacy_memory_options(name: Any) -> dict[str, Any]:
    """A memory's options added after run folders existed, with the value those folders had (the
    plugin's `legacy_options`; none for a name no plugin registers)."""
    spec = registered().get(str(name))
    return dict(spec.cls.legacy_options) if spec else {}


def saved_run_config(path: str | Path) -> DictConfig:
    """A run folder's saved config.yaml (or the file itself), as written: with LEGACY_DEFAULTS filled
    in where the file predates a key, not yet merged into the schema."""
    path = Path(path)
    raw = OmegaConf.load(path / "config.yaml" if path.is_dir() else path)
    for key, value in LEGACY_DEFAULTS.items():
        if OmegaConf.select(raw, key, default=None) is None:
            OmegaConf.update(raw, key, value, force_add=True)
    for key, value in legacy_memory_options(OmegaConf.select(raw, "memory.name", default="")).items():
        if OmegaConf.select(raw, f"memory.{key}", default=None) is None:
            OmegaConf.update(raw, f"memory.{key}", value, force_add=True)
    return raw


def load_run_config(path: str | Path) -> DictConfig:
    """A run folder's config, resolved against today's schema (legacy keys as the run was made)."""
    cfg = merge_checked(run_schema(), saved_run_config(path), where="")
    return resolve(cfg)
