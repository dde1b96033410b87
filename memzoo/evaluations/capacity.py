"""Recall capacity: a model trained from scratch on associative recall across segments
(`task.gap_segments` >= 1), scored where only the memory state can carry the answer.

Three numbers per run, on one fixed set of held-out examples:

* `recall_accuracy`: teacher-forced argmax at the scored queries (their pair sits `gap_segments`
  segments earlier; a key's first appearance in the query segment only);
* `recall_chance`: guessing uniformly among the stored values, on the same queries;
* `recall_accuracy_reset`: the same model with its state reset just before the query segment. If
  the answer came through the memory it falls to chance, as `local` does.

With rewrites (`task.rewrites` >= 1: every key given new values after its pair), the answer is
the latest value, and two more: `recall_stale`, the share of scored queries answered with an
earlier value of the same key, and `recall_stale_chance`, the uniform guess among the written
values landing on one (memzoo.data.recall.stale_chance), on the same queries.

And one diagnostic, `recall_accuracy_within`: accuracy at the answers that are visible in their own
segment (the local queries of segment 0, a key asked again in the query segment). Near 1 it says the
model has learned the association itself, so a low `recall_accuracy` is the memory's, not the
backbone's.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from memzoo.core.config import model_config
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory
from memzoo.data.recall import SegmentRecallExample, recall_chance, segment_recall_example, stale_chance
from memzoo.runs.configure import memory_config
from memzoo.analysis.capacity import capacity_curves, is_capacity_table
from memzoo.evaluations.registry import Command, Evaluation, Figure, Score, register_evaluation
from memzoo.evaluations.reporting import capacity_notes, capacity_sections, capacity_summary
from memzoo.evaluations.run_result import gate_values, measure_footprint, peak_rss_mb, precision_columns, write_row
from memzoo.runs.checkpoints import load_run

EVAL_SEED_OFFSET = 7_919_000_003  # held-out examples: a generator no training step uses


def recall_examples(task: Any, segment_len: int, count: int, seed: int) -> list[SegmentRecallExample]:
    """`count` held-out examples of the run's task, in its training layout (deterministic in seed),
    every one at the task's largest gap (`gap_segments`; a gap curriculum's shorter gaps are the
    distance evaluation's, memzoo.evaluations.distance)."""
    if count < 1:
        raise ValueError(f"recall examples={count}; expected >= 1")
    gen = torch.Generator().manual_seed(EVAL_SEED_OFFSET + seed)
    # The training layout, local queries included (they are not scored): the same inputs the model learned on.
    local, alphabet = getattr(task, "local_queries", 0), getattr(task, "alphabet", 64)
    rewrites = getattr(task, "rewrites", 0)
    return [segment_recall_example(gen, segment_len, task.pairs, task.queries, task.gap_segments, local, alphabet,
                                   rewrites=rewrites) for _ in range(count)]


def within_positions(example: SegmentRecallExample) -> list[int]:
    """The answer positions whose pair lies in the same segment (trained on, never scored)."""
    scored = set(example.scored_positions)
    return [p for p in example.answer_positions if p not in scored]


@torch.no_grad()
def predict_scored(model: MemoryModel, examples: list[SegmentRecallExample], reset_before_query: bool = False,
                   batch_size: int = 64, within: bool = False) -> list[list[int]]:
    """The model's argmax byte at each example's scored positions, all segments in one call.

    reset_before_query: the state is reset at the start of the query segment (the ablation).
    within: at the within-segment answers instead (`within_positions`).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n = model.cfg.segment_len
    out: list[list[int]] = []
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo : lo + batch_size]
        s = len(chunk[0].tokens) // n
        tokens = torch.tensor([list(e.tokens) for e in chunk], dtype=torch.long, device=device).view(len(chunk), s, n)
        reset = torch.zeros(len(chunk), s, dtype=torch.bool, device=device)  # [B, S]
        reset[:, 0] = True
        if reset_before_query:
            reset[torch.arange(len(chunk)), torch.tensor([e.query_segment for e in chunk])] = True
        logits = model(tokens, None, reset).logits.reshape(len(chunk), s * n, -1)  # [B, S*N, V]
        for row, e in enumerate(chunk):
            out.append(logits[row, within_positions(e) if within else e.scored_positions].argmax(-1).tolist())
    model.train(was_training)
    return out


def accuracy(predicted: list[list[int]], examples: list[SegmentRecallExample], within: bool = False) -> float:
    """Share of scored queries (or of the within-segment answers) answered right, pooled over examples."""
    answers = [[e.tokens[p + 1] for p in within_positions(e)] if within else list(e.answers) for e in examples]
    hits = sum(p == a for pred, ans in zip(predicted, answers) for p, a in zip(pred, ans))
    return hits / max(sum(len(a) for a in answers), 1)


def stale_accuracy(predicted: list[list[int]], examples: list[SegmentRecallExample]) -> float:
    """Share of scored queries answered with an earlier value of their key (rewrites only; NaN without)."""
    stale = [p in set(old) for pred, e in zip(predicted, examples) for p, old in zip(pred, e.stale)]
    return sum(stale) / len(stale) if stale else float("nan")


def rewrite_metrics(predicted: list[list[int]], examples: list[SegmentRecallExample]) -> dict[str, Any]:
    """recall_stale and recall_stale_chance on the scored queries of examples with rewrites ({} without)."""
    if not any(e.rewrites for e in examples):
        return {}
    chance = [c for e in examples for c in stale_chance(e)]
    return {"recall_stale": stale_accuracy(predicted, examples), "recall_stale_chance": sum(chance) / len(chance)}


def hits_by_example(predicted: list[list[int]], examples: list[SegmentRecallExample]) -> list[int]:
    """Scored queries answered right, per example (the same examples for every method at a seed: the
    unit of the per-example paired bootstrap)."""
    return [sum(p == a for p, a in zip(pred, e.answers)) for pred, e in zip(predicted, examples)]


def capacity_metrics(model: MemoryModel, examples: list[SegmentRecallExample]) -> dict[str, Any]:
    """recall_accuracy, recall_chance, recall_accuracy_reset, recall_accuracy_within and recall_queries,
    the scored hits and queries per example, and with rewrites recall_stale and recall_stale_chance."""
    chance = [c for e in examples for c in recall_chance(e)]
    predicted = predict_scored(model, examples)
    return {
        **rewrite_metrics(predicted, examples),
        "recall_accuracy": accuracy(predicted, examples),
        "recall_hits_by_example": hits_by_example(predicted, examples),
        "recall_queries_by_example": [len(e.answers) for e in examples],
        "recall_chance": sum(chance) / max(len(chance), 1),
        "recall_accuracy_reset": accuracy(predict_scored(model, examples, reset_before_query=True), examples),
        "recall_accuracy_within": accuracy(predict_scored(model, examples, within=True), examples, within=True),
        "recall_queries": len(chance),
    }


def write_capacity_result(run_dir: Path, cfg: DictConfig, model: MemoryModel,
                          examples: Optional[int] = None) -> dict[str, Any]:
    """Evaluate a recall-across-segments run and write its result.json (the run's table row)."""
    task = cfg.task
    if task.name != "recall" or not task.gap_segments:
        raise ValueError(f"capacity evaluation needs task.name=recall with task.gap_segments >= 1; got "
                         f"task.name={task.name!r}, gap_segments={task.gap_segments}")
    run_dir = Path(run_dir)
    mcfg = model_config(cfg)
    count = examples or int(cfg.eval.recall_examples)
    metrics = capacity_metrics(model, recall_examples(task, mcfg.segment_len, count, int(cfg.seed)))
    segments = int(task.rewrites) + int(task.gap_segments) + 1
    mem_cfg = memory_config(cfg.memory.name, cfg.memory)
    train_rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                  if line.strip()] if (run_dir / "metrics.jsonl").is_file() else []
    tps = [r["tokens_per_s"] for r in train_rows if "tokens_per_s" in r]
    row = {
        "name": cfg.name, "method": cfg.memory.name, "seed": int(cfg.seed), "task": "recall",
        "params": model.num_parameters(),
        "footprint_analytic": get_memory(cfg.memory.name).cls.footprint(mem_cfg, mcfg, segments * mcfg.segment_len)["total"],
        "footprint_measured": measure_footprint(model, segments=segments),  # the state the query segment reads
        "footprint_tokens": segments * mcfg.segment_len,
        "lr": float(cfg.train.lr), "d_model": int(mcfg.d_model), "pairs": int(task.pairs),
        "gap_segments": int(task.gap_segments), "queries": int(task.queries), "local_queries": int(task.local_queries),
        "alphabet": int(task.alphabet), "rewrites": int(task.rewrites), "min_gap_segments": int(task.min_gap_segments),
        "backbone_init": cfg.model.init_streams,
        **metrics, "recall_examples": count,
        "final_train_loss_bpb": train_rows[-1]["train_bpb"] if train_rows else None,
        "train_steps": int(cfg.train.steps),
        "train_tokens": int(cfg.train.steps) * int(cfg.train.batch_size) * segments * mcfg.segment_len,
        "train_tokens_per_s": sum(tps) / len(tps) if tps else None, "peak_rss_mb": peak_rss_mb(),
        **precision_columns(cfg, model), "gates": gate_values(model),
    }
    return write_row(run_dir, row)


def is_capacity_run(cfg: DictConfig) -> bool:
    """Recall across segments (task recall with a gap): scored by recall, not bits per byte."""
    return cfg.task.name == "recall" and bool(cfg.task.gap_segments)


@dataclass
class CapacityConfig:
    """`memzoo capacity RUN_DIR`: a recall-across-segments run scored again (examples: None, the run's
    eval.recall_examples)."""

    task: str = "capacity"
    examples: Optional[int] = None

    def __post_init__(self) -> None:
        if self.examples is not None and self.examples < 1:
            raise ValueError(f"capacity examples={self.examples}; expected >= 1")


def capacity_folder(run_dir: str | Path, cfg: CapacityConfig, resume: bool = True, progress: bool = True) -> list[dict]:
    """The run's result.json row after scoring its trained model on recall across segments."""
    run_cfg, model = load_run(run_dir, device=None)
    return [write_capacity_result(Path(run_dir), run_cfg, model, examples=cfg.examples)]


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("run_dir")
    s.add_argument("--examples", type=int, default=None, help="examples to score (default: the run's eval.recall_examples)")
    s.add_argument("--json", action="store_true")


register_evaluation(Evaluation(
    "capacity", CapacityConfig, capacity_folder,
    Command("score a recall-across-segments run (the capacity suite's evaluation)", _arguments,
            lambda args: {"examples": args.examples},
            lambda row: {"method": row["method"], "accuracy": f"{row['recall_accuracy']:.3f}",
                         "reset": f"{row['recall_accuracy_reset']:.3f}", "chance": f"{row['recall_chance']:.3f}"},
            ["method", "accuracy", "reset", "chance"], ""),
    in_suite=False, ends_training=is_capacity_run, scores=(Score("recall_accuracy", True),),
    finish=lambda run_dir, cfg, model, progress=True: write_capacity_result(run_dir, cfg, model),
    section=capacity_sections, notes=capacity_notes, summary=capacity_summary, holds=is_capacity_table,
    figure=Figure("Cross-segment recall accuracy against state numbers (log), per gap and number of pairs",
                  capacity_curves)))
