"""Does a trained run copy from its context? (the induction-head probe behind the long-range recipe)

Each probe is a 60-byte chunk of held-out corpus text written twice in one segment. A model that
copies from its context predicts the second copy far better than the first; a model that only
learned the corpus's statistics predicts both alike. Prints bits per byte on each copy per run.

    python experiments/longrange/induction.py RUN_DIR [RUN_DIR ...] [--chunks 32] [--chunk-len 60]
"""
from __future__ import annotations

import math

import torch

from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel
from memzoo.data.corpus import load_documents, split_documents
from memzoo.runs.checkpoints import load_trained


def probe_batch(cfg, chunks: int, chunk_len: int, seed: int = 0) -> torch.Tensor:
    """[chunks, segment_len + 1] bytes: a held-out chunk, the same chunk again, spaces to the end."""
    n = int(cfg.model.segment_len)
    if 2 * chunk_len + 1 > n:
        raise ValueError(f"--chunk-len {chunk_len}: two copies must fit in one segment of {n} bytes")
    docs = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"] if len(d.data) > 4 * chunk_len]
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(chunks):
        doc = docs[int(torch.randint(len(docs), (1,), generator=gen))]
        start = int(torch.randint(len(doc) - chunk_len, (1,), generator=gen))
        chunk = list(doc[start:start + chunk_len])
        rows.append(chunk + chunk + [32] * (n + 1 - 2 * chunk_len))
    return torch.tensor(rows)


@torch.no_grad()
def copy_bits(run_dir: str, chunks: int, chunk_len: int) -> tuple[float, float]:
    """Bits per byte on the first and the second copy (the first 5 bytes of each left out)."""
    cfg, model = load_trained(run_dir)
    model.eval()
    return copy_bits_on(model, probe_batch(cfg, chunks, chunk_len), chunk_len)


def copy_bits_on(model: MemoryModel, seq: torch.Tensor, chunk_len: int) -> tuple[float, float]:
    """copy_bits on given probes seq [C, N + 1] (probe_batch's): one segment from a fresh state."""
    seq = seq.to(next(model.parameters()).device)
    b, n = seq.shape[0], seq.shape[1] - 1
    out = model(seq[:, None, :n], model.initial_state(b, seq.device), torch.ones(b, 1, dtype=torch.bool, device=seq.device))
    bits = token_nll(out.logits, seq[:, None, 1:]).view(b, n) / math.log(2)  # [C, N]
    return float(bits[:, 5:chunk_len - 1].mean()), float(bits[:, chunk_len + 5:2 * chunk_len - 1].mean())
