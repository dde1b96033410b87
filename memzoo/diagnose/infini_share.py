"""How much of Infini-attention's memory read can one key get?

The read is σ(q) M / (σ(q) z) with z = Σ_j σ(k_j) over every token written so far. Under the
linear rule M = Σ_j σ(k_j)ᵀ v_j, so the read is an average of the values with weights
w_j = σ(q)·σ(k_j) / Σ_i σ(q)·σ(k_i): the share one key can get is its similarity over the sum of
all similarities, and with σ > 0 everywhere that sum grows with every token written. For passkey
prompts of several lengths, at each teacher-forced answer position, this prints per layer the
best head's weight on the key sentence's matching digit, and that key's similarity over the
mean similarity (its selectivity; a share of 1/2 needs a selectivity near the number of tokens),
and the norm of the memory read the model actually makes (either rule) over the values' mean norm
(a read that averages many values is shorter than any one of them; one that retrieves a value is
not).

    python experiments/longrange/infini_share.py RUN_DIR [--lengths 668,4096,32768] [--trials 2]
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

import memzoo.memories.infini as infini
from memzoo.core.probe import recording
from memzoo.data.passkey import passkey_prompt, random_key
from memzoo.data.tasks import bytes_to_tensor
from memzoo.runs.checkpoints import load_trained
from memzoo.evaluations.generate import StreamingDecoder


@torch.no_grad()
def key_share(run_dir: str, length: int, trials: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """[L, H] each, means over answer digits and trials: the weight on the key's digit, its
    selectivity, and the read's norm over the values' mean norm."""
    _, model = load_trained(run_dir)
    layers = [m for m in model.modules() if isinstance(m, infini.InfiniAttention)]
    if not layers:
        raise ValueError(f"{run_dir} is not an Infini-attention run")
    ordinal = {m.layer_index: i for i, m in enumerate(layers)}
    seen: dict[int, list[tuple[torch.Tensor, ...]]] = {i: [] for i in range(len(layers))}
    reads: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}

    def record(name: str, r: dict[str, Any]) -> None:  # the plugin's "infini.memory" probe
        i = ordinal[r["layer"]]
        seen[i].append((r["sq"][0], r["sk"][0], r["v"][0]))  # [S, H, N, D] each
        reads[i].append(r["read"][0].permute(1, 0, 2, 3).flatten(1, 2))  # [H, S N, Dv]: the memory's read

    for layer in layers:  # the paper's per-segment loop (the option vectorized: false), whose numbers these are
        layer.cfg = dataclasses.replace(layer.cfg, vectorized=False)
    n = model.cfg.segment_len
    gen = torch.Generator().manual_seed(seed)
    shares, selectivity, read_norms = [], [], []
    with recording(record, {"infini.memory"}):
        for _ in range(trials):
            key = random_key(gen, 5)
            prompt = passkey_prompt(length, 0.0, key)  # the key at the start: every filler byte after it
            text = prompt.prompt + b" " + key.encode()
            first = prompt.prompt.find(key.encode())
            for calls in (*seen.values(), *reads.values()):
                calls.clear()
            StreamingDecoder(model, 1, segments_per_call=8).feed(bytes_to_tensor(text)[None])
            # per layer, every position in order (whole segments, then the partial one): [H, T, D] each
            flat = [[torch.cat([t[j].permute(1, 0, 2, 3).flatten(1, 2) for t in seen[i]], dim=1) for j in range(3)]
                    for i in range(len(layers))]
            read_all = [torch.cat(reads[i], dim=1) for i in range(len(layers))]  # [H, T, D]
            for d in range(len(key)):
                query, target = len(prompt.prompt) + d, first + d
                written = query // n * n  # the memory holds the segments before the query's own
                per_layer_share, per_layer_sel, per_layer_read = [], [], []
                for (qs, ks, vs), read in zip(flat, read_all):
                    per_layer_read.append(read[:, query].norm(dim=-1) / vs[:, :written].norm(dim=-1).mean(1))
                    share, sel = share_and_selectivity(qs[:, query], ks[:, :written], target)
                    per_layer_share.append(share)
                    per_layer_sel.append(sel)
                shares.append(torch.stack(per_layer_share))
                selectivity.append(torch.stack(per_layer_sel))
                read_norms.append(torch.stack(per_layer_read))
    return tuple(torch.stack(x).mean(0) for x in (shares, selectivity, read_norms))


def share_and_selectivity(sq: torch.Tensor, sk: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the linear read's weight on key `target`, σ(q)·σ(k_t) / Σ_j σ(q)·σ(k_j), and its
    selectivity σ(q)·σ(k_t) / mean_j σ(q)·σ(k_j). sq [H, D], sk [H, T, D] -> [H] each."""
    sims = torch.einsum("hd,htd->ht", sq, sk)  # [H, T]
    return sims[:, target] / sims.sum(1), sims[:, target] / sims.mean(1)
