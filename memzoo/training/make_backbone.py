"""`memzoo backbone CONFIG NAME`: train a backbone from a config, ship it inside the package under NAME,
and write on its card how it was made, at what cost, to what valid bits per byte, and how well it
copies at each distance (memzoo.evaluations.copy_distance), so a user can make one for their own corpus."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import copy_by_distance
from memzoo.runs.checkpoints import load_trained
from memzoo.runs.configure import load_config
from memzoo.training.backbones import add_to_card, card_cost, ship_backbone, training_card
from memzoo.training.train import train


def probed_distances(cfg: Any, distances: Sequence[int]) -> list[int]:
    """The probe distances within what the backbone was trained to read (at least the shortest)."""
    span = int(cfg.train.max_doc_segments or cfg.eval.max_segments_per_doc) * int(cfg.model.segment_len)
    return [d for d in distances if d < span] or [min(distances)]


def make_backbone(config: str, name: str, overrides: Sequence[str] = (), dest: Optional[str] = None,
                  resume: bool = True, distances: Sequence[int] = (32, 128, 512, 1024, 2048, 4000),
                  probe_rows: int = 16, chunk_len: int = 32) -> dict[str, Any]:
    """Train (resuming an interrupted run), ship and probe; returns the card written to the index."""
    cfg = load_config(config, list(overrides))
    run_dir = train(cfg, resume=resume)
    card = training_card(cfg, json.loads((run_dir / "result.json").read_text()))
    where = Path(dest) if dest else None
    ship_backbone(run_dir, name, cost=card_cost(card), dest=where)
    _, model = load_trained(run_dir)
    texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"]]
    rows = copy_by_distance(model, texts, probed_distances(cfg, distances), chunk_len, probe_rows)
    card["copy_probe"] = [{"distance": r.distance, "kind": r.kind, "first_bits": round(r.first_bits, 3),
                           "second_bits": round(r.second_bits, 3)} for r in rows]
    add_to_card(name, card, where)
    return card
