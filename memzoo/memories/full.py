"""Baseline `full`: causal attention over the whole document so far (the ceiling where it fits).

The state is every past key and value of the current document (no positional encoding; RoPE is
applied at attention time with positions relative to the segment), so streaming segment by
segment gives the same outputs as one call over the whole input. Cost and state grow linearly
with the input; `max_len` (off by default) turns it into a sliding window for long streams.
Gradient flows through the cache within a truncated-BPTT block, like through one long sequence.

The backbone's sliding window (model.attention_span > 0) does not apply: `uses_window = False`, so
full attention stays full (its own cache already holds every position the window would) and its
layers carry no window state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from memzoo.core.config import ModelConfig
from memzoo.core.fifo import fifo_reset
from memzoo.core.memory import LayerInputs, LayerMemory, State, zero_loss
from memzoo.core.plugins import register_memory


@dataclass
class FullConfig:
    max_len: Optional[int] = None  # keep at most this many past positions (None: all of the document)


@register_memory("full", config=FullConfig)
class FullAttention(LayerMemory):
    uses_window = False  # it already sees the whole document: no backbone window on top

    def __init__(self, cfg: FullConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.max_len is not None and cfg.max_len < 1:
            raise ValueError(f"full max_len={cfg.max_len}; expected a positive int or None")

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        h, d = self.model_cfg.n_heads, self.model_cfg.d_head
        return {
            "k": torch.zeros(batch_size, h, 0, d, device=device, dtype=self.state_dtype()),  # [B, H, P, D]
            "v": torch.zeros(batch_size, h, 0, d, device=device, dtype=self.state_dtype()),
            "valid": torch.zeros(batch_size, 0, dtype=torch.bool, device=device),  # [B, P]
        }

    def reset_rows(self, state: State, rows: Tensor) -> State:
        return fifo_reset(state, rows)

    @classmethod
    def lookback(cls, cfg: FullConfig, model: ModelConfig) -> Optional[list[int]]:
        return None if cfg.max_len is None else [int(cfg.max_len)] * model.n_layers  # max_len: a sliding window

    @classmethod
    def footprint(cls, cfg: FullConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        kept = tokens_seen if cfg.max_len is None else min(tokens_seen, cfg.max_len)
        return {"total": 2 * model.d_head * model.n_heads * kept * model.n_layers}

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        b, s, h, n, d = x.q.shape
        past = state["k"].shape[2]
        window = lambda t: t.transpose(1, 2).reshape(b, h, s * n, d)  # noqa: E731  [B, H, S*N, D]
        q, k_new, v_new = window(x.q), window(x.k), window(x.v)
        k_all = torch.cat((state["k"].to(q.dtype), k_new), dim=2)  # [B, H, P+S*N, D]
        v_all = torch.cat((state["v"].to(q.dtype), v_new), dim=2)

        # Which document each position belongs to: 0 = the one the state continues, +1 per reset.
        doc = torch.cumsum(x.reset.long(), dim=1).repeat_interleave(n, dim=1)  # [B, S*N]
        key_doc = torch.cat((torch.zeros(b, past, dtype=torch.long, device=q.device), doc), dim=1)
        key_ok = torch.cat((state["valid"], torch.ones(b, s * n, dtype=torch.bool, device=q.device)), dim=1)
        q_pos = torch.arange(s * n, device=q.device)
        k_pos = torch.arange(-past, s * n, device=q.device)
        mask = (
            (doc[:, :, None] == key_doc[:, None, :])
            & key_ok[:, None, :]
            & (k_pos[None, None, :] <= q_pos[None, :, None])
        )  # [B, S*N, P+S*N]
        if self.cfg.max_len is not None:
            # Streaming keeps the last max_len positions before each segment: see exactly those.
            segment_start = (q_pos // n) * n
            mask = mask & (k_pos[None, :] >= (segment_start - self.cfg.max_len)[:, None])[None]
        mask = mask[:, None]  # [B, 1, S*N, P+S*N]
        out = x.attend.with_mask(q, k_all, v_all, q_pos, k_pos, mask)  # [B, H, S*N, D]
        out = out.view(b, h, s, n, d).transpose(1, 2)  # [B, S, H, N, D]

        valid = key_ok & (key_doc == doc[:, -1:])  # only the last document's positions stay visible
        dtype = self.working_dtype(q)  # the precision policy: float32 under autocast, float64 stays
        state = {"k": k_all.to(dtype), "v": v_all.to(dtype), "valid": valid}
        return out, self._trim(state), zero_loss(x.q)

    def _trim(self, state: State) -> State:
        """Drop leading positions no row can see any more; apply max_len."""
        valid = state["valid"]
        keep_from = 0
        if valid.shape[1]:
            any_valid = valid.any(dim=0)
            keep_from = int(any_valid.int().argmax()) if bool(any_valid.any()) else valid.shape[1]
        if self.cfg.max_len is not None:
            keep_from = max(keep_from, valid.shape[1] - self.cfg.max_len)
        if keep_from == 0:
            return state
        return {"k": state["k"][:, :, keep_from:], "v": state["v"][:, :, keep_from:], "valid": valid[:, keep_from:]}
