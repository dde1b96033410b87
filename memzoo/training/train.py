"""Training: AdamW with warm-up and cosine decay, truncated BPTT over the segment state, bf16
autocast option, checkpoints every K steps and on interruption, exact resume.

A run folder holds `config.yaml` (resolved), `metrics.jsonl` (one JSON object per logged step,
written through memzoo.runs.tracking beside the optional TensorBoard or W&B tracker of
`log.tracker`), `checkpoint.pt` (model, optimiser, step, RNG; loadable with weights_only=True) and,
at the end, `eval-valid.json` and `result.json`; and `lock` while a process trains it (memzoo.runs.lock:
another process refuses the folder). A write that runs out of space stops the run with one
DiskFullError line (memzoo.runs.disk), the last complete checkpoint kept.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from memzoo.core.config import ConfigError, TrainConfig, to_yaml
from memzoo.core.losses import LN2
from memzoo.core.model import MemoryModel
from memzoo.data.copy_reads import CopyReads
from memzoo.data.corpus import Batch, load_documents, split_documents
from memzoo.data.samplers import StreamSampler, WindowSampler
from memzoo.data.tasks import TaskSampler
from memzoo.runs import distributed as dist
from memzoo.training.backbones import is_shipped, load_shipped_backbone
from memzoo.runs.checkpoints import (carried_state, load_backbone, load_checkpoint, load_run_weights, restore_rng_states,
                                        rng_states, save_checkpoint)
from memzoo.runs.configure import build_model, run_device, saved_run_config, use_tf32
from memzoo.runs.disk import is_disk_full, writing
from memzoo.runs.lock import RunLock
from memzoo.evaluations.lm import evaluate_run
from memzoo.evaluations.registry import end_of_training
from memzoo.evaluations.run_result import gate_values, precision_columns
from memzoo.training.mixing import corpus_batches, mixed_window
from memzoo.runs.tracking import check_tracker, gate_scalars, make_tracker
from memzoo.training.windows import WindowResult, train_window


def lr_at(step: int, tc: TrainConfig | DictConfig) -> float:
    """Linear warm-up to lr, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    floor = tc.lr * tc.min_lr_ratio
    return floor + 0.5 * (tc.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: MemoryModel, tc: TrainConfig | DictConfig) -> torch.optim.Optimizer:
    """AdamW over the model's parameter groups (decay on matrices, the plugins' overrides)."""
    return torch.optim.AdamW(model.optim_groups(tc.weight_decay, tc.lr), lr=tc.lr, betas=tuple(tc.betas))


def batch_source(cfg: DictConfig) -> Callable[[int], Batch]:
    """step -> training batch: corpus windows (task lm) or a synthetic task's examples."""
    tc = cfg.train
    if tc.doc_start != "first" and not tc.carry_state:
        raise ConfigError(f"train.doc_start={tc.doc_start!r} applies to train.carry_state=true only "
                          "(windows that follow documents); set carry_state=true or leave it 'first'")
    if tc.max_doc_segments is not None and not tc.carry_state:
        raise ConfigError(f"train.max_doc_segments={tc.max_doc_segments} applies to train.carry_state=true only "
                          "(windows that follow documents); set carry_state=true or leave it null")
    if tc.carry_state and cfg.task.name != "lm":
        raise ConfigError(f"train.carry_state=true follows corpus documents across steps; task.name={cfg.task.name!r} "
                          "draws independent examples (use task.name=lm, or carry_state=false)")
    if cfg.task.name == "lm":
        docs = split_documents(load_documents(cfg.data), cfg.data)
        copy = CopyReads(float(tc.copy_share), *[int(d) for d in tc.copy_distance], layout=str(tc.copy_layout),
                          draw=str(tc.copy_draw))
        if copy.share > 0 and not tc.carry_state:
            raise ConfigError(f"train.copy_share={tc.copy_share} applies to train.carry_state=true only "
                              "(copy reads are read like documents); set carry_state=true or leave it 0")
        sampler = (StreamSampler(docs["train"], cfg.model.segment_len, cfg.seed, tc.max_doc_segments, tc.doc_start, copy)
                   if tc.carry_state
                   else WindowSampler(docs["train"], cfg.model.segment_len, cfg.seed))
        return lambda step: sampler.sample(step, tc.batch_size, tc.window_segments)
    task_sampler = TaskSampler(cfg.task, cfg.model.segment_len, cfg.seed)
    return lambda step: task_sampler.sample(step, tc.batch_size)


def run_dir_for(cfg: DictConfig) -> Path:
    return Path(cfg.out_dir) / cfg.name


class NonFiniteStep(RuntimeError):
    """A training step whose gradients are not finite: the run stops before applying it."""


def train(cfg: DictConfig, run_dir: Optional[Path] = None, resume: bool = True, evaluate_at_end: bool = True,
          on_step: Optional[Callable[[int], None]] = None, progress: bool = True) -> Path:
    """Train per `cfg` into `run_dir` (default out_dir/name), resuming from its checkpoint if any.

    `on_step(step)` is called after each completed step (tests use it to interrupt a run).
    Under torchrun (WORLD_SIZE > 1) every rank trains on its rows of each global batch through
    DDP (memzoo.runs.distributed); only rank 0 writes the run folder, and holds its lock: a folder
    another process holds is a RunLockedError, nothing trained (memzoo.runs.lock).
    """
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    with RunLock(run_dir, enabled=dist.env_info().is_main):
        return _train(cfg, run_dir, resume, evaluate_at_end, on_step, progress)


def _train(cfg: DictConfig, run_dir: Path, resume: bool, evaluate_at_end: bool,
           on_step: Optional[Callable[[int], None]], progress: bool) -> Path:
    """`train` in a folder this process holds."""
    tc = cfg.train
    # a missing tensorboard or wandb, or a device the run cannot use, stops it before anything is written
    check_tracker(cfg.log.tracker)
    device = run_device(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    rank, device = dist.setup(device)
    use_tf32(cfg, device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    ckpt_path = run_dir / "checkpoint.pt"
    # Read before anything in the folder is written: a damaged checkpoint stops the run, losing nothing.
    ckpt = load_checkpoint(run_dir, device) if resume and ckpt_path.is_file() else None
    if ckpt is not None and (run_dir / "config.yaml").is_file():
        saved = saved_run_config(run_dir)
        # A resumed run keeps the initialisation it started with (its weights come from the checkpoint).
        cfg.model.init_streams = saved.model.init_streams
        if OmegaConf.to_container(OmegaConf.masked_copy(saved, ["model", "memory"]), resolve=True) != \
                OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "memory"]), resolve=True):
            raise ConfigError(f"{run_dir} holds a run with a different model or memory config; use another name or out_dir")
    dist.barrier(rank)  # every rank has read the folder before rank 0 writes to it
    if rank.is_main:
        with writing(run_dir, "the run config (config.yaml)"):
            (run_dir / "config.yaml").write_text(to_yaml(cfg))

    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device)
    net = dist.wrap(model, rank, device)  # the model itself in a plain run
    optimizer = build_optimizer(model, tc)
    step = 0
    carried = None  # train.carry_state: each row's memory state after the last completed step
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng_states(ckpt, device)
        step = int(ckpt["step"])
        carried = carried_state(ckpt, device) if tc.carry_state else None

    elif is_shipped(cfg.task.init_from):  # a backbone shipped inside the package: no memory weights to take
        if not cfg.task.init_backbone_only:
            raise ConfigError(f"task.init_from={cfg.task.init_from!r} is a shipped backbone (no memory weights): "
                              "set task.init_backbone_only=true")
        load_backbone(model, load_shipped_backbone(cfg.task.init_from, cfg.model, device, cfg.task.rebase_rope), cfg.task.init_from)
    elif cfg.task.init_from and cfg.task.init_backbone_only:
        load_backbone(model, load_run_weights(cfg.task.init_from, device), cfg.task.init_from)
    elif cfg.task.init_from:
        try:
            model.load_state_dict(load_run_weights(cfg.task.init_from, device))
        except RuntimeError as err:
            raise ConfigError(f"task.init_from={cfg.task.init_from!r} holds weights of another model or memory config: "
                             f"{str(err).splitlines()[0]}") from None
    sample = batch_source(cfg)
    mix = float(cfg.task.lm_fraction)
    corpus = None
    if mix > 0:  # (1 - f) x task loss + f x corpus loss (memzoo.training.mixing)
        corpus = corpus_batches(cfg)
    tracker = make_tracker(cfg, run_dir, rank, start_step=step)  # metrics.jsonl (rows past `step` dropped) + log.tracker
    if rank.is_main:
        drop_evaluations_after(run_dir, step)
    tracker.config({**OmegaConf.to_container(cfg, resolve=True), "resolved": precision_columns(cfg, model)})
    bar = tqdm(total=tc.steps, initial=step, desc=f"train {cfg.name}", disable=not progress or not rank.is_main,
               dynamic_ncols=True)
    model.train()
    in_update = False  # True while optimizer.step() may have changed some parameters but not all
    rng_at_step_start: Optional[dict[str, torch.Tensor]] = None  # None between steps
    t_last, tokens_since = time.perf_counter(), 0
    try:
        while step < tc.steps:
            rng_at_step_start = rng_states(device)
            batch = dist.shard_rows(sample(step), rank).to(device)
            lr = lr_at(step, tc)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_mult", 1.0)
            lm_bpb = None
            if corpus is None:
                res = train_window(net, batch, tc.bptt_segments, tc.aux_loss_weight, tc.precision,
                                   state=carried if carried is not None else model.initial_state(batch.tokens.shape[0], device),
                                   align_end=cfg.task.name != "lm", denominator=dist.loss_denominator(batch, rank, device),
                                   block_context=dist.block_sync(net))
            else:
                lm_batch = dist.shard_rows(corpus(step, tc.batch_size, batch.tokens.shape[1]), rank).to(device)
                mixed = mixed_window(net, batch, lm_batch, mix, tc.bptt_segments, tc.aux_loss_weight, tc.precision,
                                     dist.loss_denominator(batch, rank, device),
                                     dist.loss_denominator(lm_batch, rank, device), dist.block_sync(net))
                res = WindowResult(mixed.task_nll, mixed.task_tokens, mixed.aux, None, mixed.answer_nll, mixed.answer_tokens)
                lm_sum, lm_n = dist.all_sum([mixed.lm_nll, mixed.lm_tokens], rank, device)
                lm_bpb = lm_sum / max(lm_n, 1) / LN2
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            if not bool(torch.isfinite(grad_norm)):  # one NaN step would overwrite every weight and checkpoint
                raise NonFiniteStep(f"train {cfg.name}: step {step + 1}'s gradient norm is {float(grad_norm)} "
                                    f"(loss {float(res.nll_sum) / max(float(res.tokens), 1) / LN2:.4g} bits a byte); "
                                    f"not applied: the weights of step {step} are kept in {run_dir / 'checkpoint.pt'} "
                                    f"(the run diverged: a state that overflows, or the learning rate)")
            in_update = True
            optimizer.step()
            step += 1
            if tc.carry_state:  # the next window continues these rows' documents (state detached: train_window)
                carried = res.state
            in_update, rng_at_step_start = False, None
            optimizer.zero_grad(set_to_none=True)
            tokens_since += batch.tokens.numel() * rank.world  # every input position is computed (answer-only losses too)
            nll_sum, n_tokens, aux, answer_sum, answer_n = dist.all_sum(
                [res.nll_sum, res.tokens, res.aux, res.answer_nll, res.answer_tokens], rank, device)
            aux /= rank.world  # each rank's aux loss is a mean over its rows
            bpb = nll_sum / max(n_tokens, 1) / LN2
            bar.update(1)
            bar.set_postfix(bpb=f"{bpb:.3f}", lr=f"{lr:.2e}")
            if rank.is_main:  # the other ranks write nothing
                if step % tc.log_every == 0 or step == tc.steps:
                    now = time.perf_counter()
                    row = {"train_bpb": bpb, "aux": aux, "lr": lr, "grad_norm": float(grad_norm),
                           "tokens_per_s": tokens_since / max(now - t_last, 1e-9)}
                    if answer_n:  # a task's answer bytes alone, whatever task.loss trains on
                        row["answer_bpb"] = answer_sum / answer_n / LN2
                    tracker.log(step, row if lm_bpb is None else {**row, "lm_bpb": lm_bpb})  # train_bpb: the task's
                    t_last, tokens_since = now, 0
                if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                    save_checkpoint(run_dir, model, optimizer, step, carried=carried, device=device)
                if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
                    ev = evaluate_run(cfg, model, progress=False)
                    tracker.log(step, {"valid_bpb": ev["bpb"]})
                    log_evaluation(run_dir, step, ev)
                    model.train()
            if on_step is not None:
                on_step(step)
    except BaseException as err:
        # Keep what was done: the weights are those of the last completed step (a step cut off
        # inside optimizer.step() is not saved; the previous checkpoint stands). A full disk would
        # fail this write too: the previous checkpoint stands then as well.
        try:
            if step > 0 and not in_update and rank.is_main and not is_disk_full(err):
                save_checkpoint(run_dir, model, optimizer, step, rng=rng_at_step_start, carried=carried, device=device)
        finally:
            tracker.close()
        raise
    finally:
        bar.close()
    try:
        if rank.is_main:
            save_checkpoint(run_dir, model, optimizer, step, carried=carried, device=device)
            if evaluate_at_end:  # the kind the registry names for this run (capacity for recall across segments)
                row = end_of_training(cfg).finish(run_dir, cfg, model, progress)
            else:
                row = {"gates": gate_values(model)}
            tracker.summary(step, summary_scalars(row))
    finally:
        tracker.close()
    dist.teardown(rank)
    return run_dir


EVALS_FILE = "evals.jsonl"


def log_evaluation(run_dir: Path, step: int, ev: dict[str, Any]) -> None:
    """One row of `evals.jsonl` per `train.eval_every` evaluation, by segment index, so that a
    difference between methods on segments >= 1 can be read against training steps (a curve from one
    run instead of one run per budget). A resumed run drops the rows after its checkpoint."""
    row = {"step": step, "split": ev["split"], "bpb": ev["bpb"], "bpb_by_segment": ev["bpb_by_segment"],
           "tokens_by_segment": ev["tokens_by_segment"]}
    with writing(run_dir, f"the evaluations during training ({EVALS_FILE})"), open(run_dir / EVALS_FILE, "a") as f:
        f.write(json.dumps(row) + "\n")


def drop_evaluations_after(run_dir: Path, step: int) -> None:
    """Keep the `evals.jsonl` rows of steps <= `step` (a resumed run repeats what came after)."""
    path = run_dir / EVALS_FILE
    if path.is_file():
        rows = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        with writing(run_dir, f"the evaluations during training ({EVALS_FILE})"):
            path.write_text("".join(r + "\n" for r in rows))


SUMMARY_KEYS = ("valid_bpb", "test_bpb", "train_bpb", "recall_accuracy", "recall_accuracy_reset", "recall_accuracy_within")


def summary_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The end-of-run numbers a tracker gets from the result row: the evaluated split's bits per byte
    (or recall accuracy), and the per-head gates."""
    out = {k: float(row[k]) for k in SUMMARY_KEYS if isinstance(row.get(k), (int, float))}
    return {**out, **gate_scalars(row.get("gates") or {})}
