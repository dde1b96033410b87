"""Footprint tables: for each method of a config, the state its plugin counts (analytic), the
paper's Table-1 formula from its card, and the numbers a real state holds (measured), with the
compression relative to a reference method (`memzoo footprint CONFIG`)."""
from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from memzoo.core.config import model_config
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import registered
from memzoo.runs.configure import memory_config
from memzoo.evaluations.run_result import measure_footprint
from memzoo.conformance.catalog import card_footprint, get_card


def footprint_row(cfg: DictConfig, method: str, options: Any, measure: bool = True) -> dict[str, Any]:
    """One method at this config: plugin analytic, card formula, measured state, compression."""
    mcfg = model_config(cfg)
    input_len = cfg.train.window_segments * mcfg.segment_len
    card = get_card(method)
    row: dict[str, Any] = {"method": method, "input_len": input_len, "footprint_formula": card.footprint_formula}
    spec = registered().get(method)
    if spec is None:
        row.update(implemented=False, analytic=None, measured=None,
                   card=card_footprint(card, mcfg, dict(options or {}), input_len))
        return row
    mem_cfg = memory_config(method, options)
    parts = spec.cls.footprint(mem_cfg, mcfg, input_len)
    row.update(implemented=True, analytic=parts["total"], analytic_parts=parts,
               card=card_footprint(card, mcfg, mem_cfg, input_len))
    row["card_matches"] = row["card"] == parts.get("table1", parts["total"])
    if measure:
        torch.manual_seed(0)
        model = MemoryModel(mcfg, method, mem_cfg)
        row["measured"] = measure_footprint(model)
        row["measured_after_tokens"] = mcfg.segment_len
        row["analytic_at_measured"] = spec.cls.footprint(mem_cfg, mcfg, mcfg.segment_len)["total"]
    return row


def footprint_table(cfg: DictConfig, measure: bool = True) -> list[dict[str, Any]]:
    """Rows for every method in cfg.methods (or the config's own method), with `compression`
    relative to cfg.footprint_reference (Table 2 of the Infini paper compares against the
    Memorizing Transformer; memzoo/configs/paper/table1.yaml says so)."""
    methods = dict(cfg.methods) if cfg.methods else {cfg.memory.name: dict(cfg.memory)}
    reference = cfg.footprint_reference
    bar = tqdm(methods.items(), desc="footprint", disable=not measure, leave=False)
    rows = [footprint_row(cfg, name, opts, measure) for name, opts in bar]
    ref = next((r for r in rows if r["method"] == reference), None)
    for r in rows:
        count = r.get("card")
        if ref is not None and ref.get("card") and count:
            r["compression"] = round(ref["card"] / count, 1)
        else:
            r["compression"] = None
    return rows
