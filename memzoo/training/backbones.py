"""Pretrained backbones shipped inside the package, so every method can be fine-tuned from one trained
transformer without paying for its pretraining (`task.init_from=backbone:NAME`, with
`task.init_backbone_only=true`): the memory is added to a pretrained language model, as the
Infini-attention, RMT and ARMT papers do.

`memzoo/backbones/NAME.pt` holds the backbone's weights (every parameter outside a memory plugin);
`memzoo/backbones/index.json` records, per name, the hash of the model config the weights belong to,
that config, and how they were trained and at what cost. A model whose config hashes otherwise is
refused in one line naming both hashes.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError
from memzoo.core.model import is_memory_name

PREFIX = "backbone:"
INDEX = "index.json"
# What the weights mean: shapes, the positions they were trained at and the vocabulary. Not dropout, the
# attention kernel, activation checkpointing or how weights would be initialised (they are loaded).
HASHED_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "segment_len", "rope_base", "head_dim")
# Keys added later, hashed only where they differ from the value every earlier backbone had, so those keep
# their hash: the backbone's convolution on queries and keys (memzoo.core.qk_conv).
HASHED_UNLESS_DEFAULT = {"qk_conv": 0}


def is_shipped(init_from: Optional[str]) -> bool:
    """Whether task.init_from names a shipped backbone (`backbone:NAME`) rather than a run folder."""
    return bool(init_from) and str(init_from).startswith(PREFIX)


def backbone_config(model_cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The model-config keys a backbone's weights depend on."""
    cfg = OmegaConf.to_container(model_cfg, resolve=True) if isinstance(model_cfg, DictConfig) else dict(model_cfg)
    keys = {key: cfg.get(key) for key in HASHED_KEYS}
    return keys | {key: cfg[key] for key, default in HASHED_UNLESS_DEFAULT.items() if cfg.get(key, default) != default}


def backbone_hash(model_cfg: DictConfig | dict[str, Any]) -> str:
    """A short hash of `backbone_config`: equal exactly when shipped weights fit this model."""
    return hashlib.sha256(json.dumps(backbone_config(model_cfg), sort_keys=True).encode()).hexdigest()[:16]


def shipped_dir() -> Path:
    """memzoo/backbones inside the installed package (or the checkout); MEMZOO_BACKBONES overrides it (tests)."""
    override = os.environ.get("MEMZOO_BACKBONES")
    return Path(override) if override else Path(str(resources.files("memzoo") / "backbones"))


def shipped_index(root: Optional[Path] = None) -> dict[str, Any]:
    """name -> its record (file, model_hash, model, training, cost); {} when none is shipped."""
    path = (root or shipped_dir()) / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def load_shipped_backbone(init_from: str, model_cfg: DictConfig, device: str | torch.device = "cpu",
                          rebase_rope: bool = False) -> dict[str, torch.Tensor]:
    """The weights of `backbone:NAME`, refused unless they were trained for this model config (with
    `rebase_rope`, for this config at any model.rope_base: task.rebase_rope)."""
    name = str(init_from)[len(PREFIX):]
    index = shipped_index()
    if name not in index:
        raise ConfigError(f"task.init_from={init_from!r}: no shipped backbone {name!r}; shipped: {sorted(index) or 'none'}")
    record, mine = index[name], backbone_hash(model_cfg)
    differs = {k: (record["model"].get(k), v) for k, v in backbone_config(model_cfg).items() if record["model"].get(k) != v}
    rebased = rebase_rope and set(differs) <= {"rope_base"}  # on purpose: the weights' shapes and vocabulary are this model's
    if record["model_hash"] != mine and not rebased:
        raise ConfigError(f"task.init_from={init_from!r} was trained for model config {record['model_hash']}, this model is "
                          f"{mine} (shipped vs this: {differs})")
    return torch.load(shipped_dir() / record["file"], map_location=device, weights_only=True)


def ship_backbone(run_dir: Path, name: str, cost: str, dest: Optional[Path] = None) -> Path:
    """Write a trained run's backbone weights as shipped backbone `name` (and its index record)."""
    from memzoo.runs.checkpoints import load_checkpoint
    from memzoo.runs.configure import saved_run_config

    dest = dest or shipped_dir()
    cfg = saved_run_config(run_dir)
    ckpt = load_checkpoint(run_dir)
    return write_backbone(ckpt["model"], name, cfg.model, dest, {
        "method": str(cfg.memory.name), "seed": int(cfg.seed), "steps": int(ckpt["step"]),
        "batch_size": int(cfg.train.batch_size), "window_segments": int(cfg.train.window_segments),
        "data": str(cfg.data.source), "cost": cost})


def write_backbone(state: dict[str, torch.Tensor], name: str, model_cfg: DictConfig, dest: Path,
                   record: dict[str, Any]) -> Path:
    """Ship a model state's backbone weights (memory weights left out) as `name` in `dest`, with its index
    record: `record` (how it was trained, at what cost) plus the file, the model config and its hash."""
    weights = {k: v.clone() for k, v in state.items() if not is_memory_name(k)}
    dest.mkdir(parents=True, exist_ok=True)
    torch.save(weights, dest / f"{name}.pt")
    index = shipped_index(dest)
    index[name] = {"file": f"{name}.pt", "model_hash": backbone_hash(model_cfg), "model": backbone_config(model_cfg),
                   "python": platform.python_version(), **record}
    (dest / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return dest / f"{name}.pt"


def training_card(cfg: DictConfig, result: dict[str, Any]) -> dict[str, Any]:
    """How a backbone was made and at what cost, from its run's config and result.json (the index card)."""
    tc = cfg.train
    seconds = float(result["train_tokens"]) / max(1e-9, float(result["train_tokens_per_s"]))
    return {"recipe": {"method": str(cfg.memory.name), "init_from": cfg.task.init_from, "steps": int(tc.steps),
                       "batch_size": int(tc.batch_size), "window_segments": int(tc.window_segments),
                       "carry_state": bool(tc.carry_state), "max_doc_segments": tc.max_doc_segments,
                       "doc_start": str(tc.doc_start), "copy_share": float(tc.copy_share),
                       "copy_distance": [int(d) for d in tc.copy_distance], "copy_layout": str(tc.copy_layout),
                       "copy_draw": str(tc.copy_draw),
                       "rope_base": float(cfg.model.rope_base), "rebase_rope": bool(cfg.task.rebase_rope), "lr": float(tc.lr)},
            "train_tokens": int(result["train_tokens"]), "train_seconds": round(seconds),
            "threads": int(tc.threads), "valid_bpb": float(result["valid_bpb"])}


def card_cost(card: dict[str, Any]) -> str:
    """One sentence of the card: steps, bytes, time and valid bits per byte."""
    r = card["recipe"]
    start = f"from {r['init_from']}" if r["init_from"] else "from scratch"
    layout = f", {r['copy_layout']}" if r.get("copy_layout", "periodic") != "periodic" else ""  # cards before layouts: periodic
    layout += f", d {r['copy_draw']}" if r.get("copy_draw", "log-uniform") != "log-uniform" else ""  # before draws: log-uniform
    return (f"{r['steps']:,} steps of {r['method']} {start} (batch {r['batch_size']} x {r['window_segments']} segments, "
            f"{card['train_tokens']:,} training bytes, copy reads {r['copy_share']:.0%}{layout}): {card['train_seconds'] / 60:.0f} "
            f"minutes of training on {card['threads'] or 'the default number of'} thread(s); valid bpb {card['valid_bpb']:.4f}")


def add_to_card(name: str, extra: dict[str, Any], dest: Optional[Path] = None) -> None:
    """Merge `extra` into shipped backbone `name`'s index record (e.g. its copy probe by distance)."""
    dest = dest or shipped_dir()
    index = shipped_index(dest)
    if name not in index:
        raise ConfigError(f"no shipped backbone {name!r} in {dest}; shipped: {sorted(index) or 'none'}")
    index[name].update(extra)
    (dest / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
