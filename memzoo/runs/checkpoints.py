"""Run folders on disk: the checkpoint (model, optimiser, step, RNG, a carried memory state; loadable with weights_only=True),
written atomically, and a run's config and trained model read back (evaluation, streaming, fine-tuning)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from memzoo.core.config import ConfigError
from memzoo.core.model import MemoryModel, ModelState, is_memory_name
from memzoo.runs.configure import build_model, load_run_config, pick_device, use_tf32
from memzoo.runs.disk import atomic_write


def _atomic_save(obj: Any, path: Path) -> None:
    """torch.save through PATH-without-suffix.tmp and a rename: the previous file stays whole until the new
    one is; a full disk is one DiskFullError line, the partial file removed (memzoo.runs.disk)."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp), f"the checkpoint ({path.name})", tmp=path.with_suffix(".tmp"))


def rng_states(device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The random states a training step draws from: the CPU generator's (batches, initialisation)
    and, on CUDA, the device's (dropout there), to save with a checkpoint and restore on resume."""
    states = {"rng": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        states["cuda_rng"] = torch.cuda.get_rng_state(device)
    return states


def restore_rng_states(ckpt: dict[str, Any], device: str | torch.device = "cpu") -> None:
    """Set the generators from a checkpoint's rng_states. Each goes back to the CPU first: a checkpoint
    loaded with map_location=cuda holds them on the GPU, where torch.set_rng_state refuses them. A CUDA
    resume from a checkpoint without the device generator's state warns: its GPU draws restart from the seed."""
    torch.set_rng_state(ckpt["rng"].cpu())
    if torch.device(device).type != "cuda":
        return
    if "cuda_rng" not in ckpt:  # saved on the CPU, or before the device generator was saved
        warnings.warn("the checkpoint holds no CUDA generator state: the resumed run's GPU draws (dropout) "
                      "start again from the seed, so it will not match a run that was never interrupted",
                      stacklevel=2)
        return
    torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu(), device)


def save_checkpoint(run_dir: Path, model: MemoryModel, optimizer: torch.optim.Optimizer, step: int,
                    rng: Optional[dict[str, torch.Tensor]] = None, carried: Optional[ModelState] = None,
                    device: str | torch.device = "cpu") -> None:
    """Atomically write the state after `step` completed steps (rng: the rng_states to resume with,
    now's on `device` when None; carried: the memory state train.carry_state carries into the next step)."""
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
            **(rng_states(device) if rng is None else rng)}
    if carried is not None:
        ckpt["carried"] = {"layers": carried.layers, "model": carried.model, "window": carried.window}
    _atomic_save(ckpt, run_dir / "checkpoint.pt")


def carried_state(ckpt: dict[str, Any], device: str | torch.device) -> Optional[ModelState]:
    """The carried memory state a checkpoint holds (None: the run does not carry state)."""
    saved = ckpt.get("carried")
    if saved is None:
        return None
    move = lambda s: {k: v.to(device) for k, v in s.items()}  # noqa: E731
    window = [move(s) for s in saved.get("window", [])]  # the backbone's window (absent: saved before it)
    return ModelState([move(s) for s in saved["layers"]], move(saved["model"]), window)


class CheckpointError(ValueError):
    """A checkpoint.pt that cannot be read (truncated by a full disk or a copy, or not a checkpoint)."""


def load_checkpoint(run_dir: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint of a run folder; a damaged file is a CheckpointError naming it and what to do
    (the run folder's other files are left as they are)."""
    path = Path(run_dir) / "checkpoint.pt"
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises RuntimeError, EOFError or an unpickling error for a damaged file
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path} cannot be read ({reason}): it is damaged; move it aside to start the run "
                              "over, or restore it from a copy") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"{path} is not a memzoo checkpoint (no model weights): move it aside or restore it")
    return ckpt


# The evaluation device a command was given (--device), in the environment so that the worker
# processes an isolated evaluation spawns load their model there too.
EVAL_DEVICE_ENV = "MEMZOO_EVAL_DEVICE"


def run_config(run_dir: str | Path) -> DictConfig:
    """The resolved config of a run folder; a folder without config.yaml is a FileNotFoundError."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    return load_run_config(run_dir)


def eval_device(cfg: DictConfig, override: Optional[str] = None) -> tuple[torch.device, str]:
    """Where a run is evaluated, and why: `override` (--device, else $MEMZOO_EVAL_DEVICE) when given (a
    missing CUDA is then an error), else the run's train.device, with the CPU in its place when the run
    trained on CUDA and this machine has none (the reason says so)."""
    if override or os.environ.get(EVAL_DEVICE_ENV):
        chosen = override or os.environ[EVAL_DEVICE_ENV]
        return pick_device(chosen, "--device"), f"--device {chosen}" if override else f"{EVAL_DEVICE_ENV}={chosen}"
    name = str(cfg.train.device)
    if name.startswith("cuda") and not torch.cuda.is_available():
        return torch.device("cpu"), f"the run trained on train.device={name}; no CUDA device here, so the CPU"
    return pick_device(name), f"the run's train.device={name}"


def load_run(run_dir: str | Path, device: str | torch.device | None = "cpu") -> tuple[DictConfig, MemoryModel]:
    """The resolved config and trained model of a run folder (device None: `eval_device`, the run's train.device)."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    device = eval_device(cfg)[0] if device is None else device
    use_tf32(cfg, torch.device(device))
    model = build_model(cfg).to(device)
    if (run_dir / "checkpoint.pt").is_file():
        model.load_state_dict(load_checkpoint(run_dir, device)["model"])
    return cfg, model


def load_trained(run_dir: str | Path) -> tuple[DictConfig, MemoryModel]:
    """A run's config and trained model on its evaluation device (`eval_device`: --device, else the run's
    train.device); a folder without a checkpoint is an error, not silently random weights."""
    run_dir = Path(run_dir)
    if not (run_dir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoint.pt: train the run first")
    return load_run(run_dir, device=None)


def load_run_weights(run_dir: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The trained weights of a run folder (`task.init_from`: fine-tuning starts from them)."""
    run_dir = Path(run_dir)
    if not (run_dir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"task.init_from={str(run_dir)!r} has no checkpoint.pt; train that run first")
    return load_checkpoint(run_dir, device)["model"]


def load_backbone(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Copy the backbone's weights from another run's state dict into `model`, leaving the memory's
    own parameters as initialised. The two backbones must match name for name and shape for shape
    (the error names the first weight that does not)."""
    own = {k: v for k, v in model.state_dict().items() if not is_memory_name(k)}
    backbone = {k: v for k, v in weights.items() if not is_memory_name(k)}
    for name, tensor in own.items():
        if name not in backbone:
            raise ConfigError(f"task.init_from={source!r} has no backbone weight {name!r}: another backbone")
        if backbone[name].shape != tensor.shape:
            raise ConfigError(f"task.init_from={source!r}: {name!r} has shape {list(backbone[name].shape)}, "
                             f"this model {list(tensor.shape)}: another backbone")
    extra = sorted(set(backbone) - set(own))
    if extra:
        raise ConfigError(f"task.init_from={source!r} holds backbone weights this model lacks: {extra[:3]}")
    model.load_state_dict(backbone, strict=False)
