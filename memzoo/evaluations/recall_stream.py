"""Recall generalisation: a model trained on the capacity suite's recall across segments
(`task.gap_segments` >= 1) streamed with its pairs `length` bytes before its queries.

The layout is the run's own training layout (memzoo.data.recall.segment_recall_batch: its pairs,
local queries and alphabet open segment 0, the queries open the query segment) with
length // segment_len segments between them, filler in between. Scored as the capacity suite
scores: teacher-forced argmax at each key's first query; `chance` is guessing among the stored
values. With `reset_after_key` the state is reset right after the pairs' segment (the memory-reset
ablation: accuracy must fall to chance where the memory carried the pairs).
"""
from __future__ import annotations

from typing import Any

import torch

from memzoo.evaluations.generate import StreamingDecoder
from memzoo.core.model import MemoryModel
from memzoo.data.recall import check_segment_recall, recall_chance, segment_recall_batch


def training_layout(task: Any) -> dict[str, int]:
    """The recall-across-segments layout a run was trained on; an error names what is missing."""
    if task is None or task.name != "recall" or not task.gap_segments:
        got = "no task" if task is None else f"task.name={task.name!r}, gap_segments={task.gap_segments}"
        raise ValueError(f"recall layout=training needs a run trained with task.name=recall and task.gap_segments >= 1 "
                         f"(the capacity suite); got {got}")
    return {"pairs": int(task.pairs), "queries": int(task.queries), "local_queries": int(task.local_queries),
            "alphabet": int(task.alphabet), "rewrites": int(getattr(task, "rewrites", 0))}


def segment_recall_length(model: MemoryModel, length: int, cfg: Any, task: Any, precision: str, meter: Any,
                          stream: Any, progress: bool) -> list[dict[str, Any]]:
    """One row for one length: `cfg.trials` examples of the run's layout, the query segment
    length // N segments after the pairs' segment, streamed as one batch."""
    layout = training_layout(task)
    n = model.cfg.segment_len
    gap = max(1, length // n)
    rewrites = layout["rewrites"]
    check_segment_recall(n, layout["pairs"], layout["queries"], gap, layout["local_queries"], layout["alphabet"],
                         rewrites=rewrites)
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + length)
    batch = segment_recall_batch(gen, cfg.trials, n, layout["pairs"], layout["queries"], gap, layout["local_queries"],
                                 layout["alphabet"], rewrites=rewrites)
    examples = [batch.example(row) for row in range(cfg.trials)]
    data = batch.tokens.to(torch.uint8)  # [B, (R + gap + 1) N]: one byte per token on long streams
    query = batch.query_segment * n  # the query segment's first byte
    decoder = StreamingDecoder(model, data.shape[0], cfg.segments_per_call, precision)
    if cfg.reset_after_key:  # right after the last write (the pairs' segment, or the last rewrite's)
        decoder.reset_at = torch.full((data.shape[0],), rewrites + 1, dtype=torch.long)
    seconds = stream(decoder, data[:, :query], meter, f"recall {length:,}", progress)
    logits = decoder.feed(data[:, query:].long(), return_logits=True)  # [B, N, V]: the query segment
    hits, chance = [], []
    for row, e in enumerate(examples):
        predicted = logits[row, [p - query for p in e.scored_positions]].argmax(-1).cpu().tolist()
        hits += [p == a for p, a in zip(predicted, e.answers)]
        chance += recall_chance(e)
    return [{"status": "ok", "accuracy": sum(hits) / max(len(hits), 1), "chance": sum(chance) / max(len(chance), 1),
             "scored": len(hits), "gap_segments": gap, "tokens_done": data.shape[1],
             "tokens_per_s": data.numel() / max(seconds, 1e-9), "seconds": seconds, **layout}]
