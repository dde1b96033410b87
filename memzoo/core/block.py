"""One pre-norm decoder block: multi-head attention whose mixing of local attention and memory is the
plugin's (with the backbone's sliding window prepended when model.attention_span > 0, and its queries and
keys convolved over time when model.qk_conv > 0), then the MLP."""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from memzoo.core.attention import LocalAttention
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, LayerMemory, State
from memzoo.core.qk_conv import TAIL, convolve_qk, identity_taps
from memzoo.core.window import WindowState, slide


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class MemoryAttention(nn.Module):
    """Multi-head attention whose mixing of local attention and memory is the plugin's."""

    def __init__(self, cfg: ModelConfig, memory: LayerMemory, attend: LocalAttention):
        super().__init__()
        self.span = cfg.attention_span if memory.uses_window else 0  # W of this layer (0: segment-local)
        self.n_heads = cfg.n_heads
        self.d_inner = cfg.d_inner  # H x D (= d_model unless model.head_dim is set)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_inner, bias=False)  # W_Q, W_K, W_V: d_model -> 3 x H x D
        self.proj = nn.Linear(cfg.d_inner, cfg.d_model, bias=False)  # W_O: H x D -> d_model
        self.memory = memory
        self.attend = attend
        self.drop = nn.Dropout(cfg.dropout)
        self.qk_conv = cfg.qk_conv  # K taps over time on queries and keys (0: none)
        if cfg.qk_conv:  # the backbone's short convolution (memzoo.core.qk_conv), from the identity
            self.qk_taps = nn.Parameter(identity_taps(cfg.qk_conv, cfg.n_heads, cfg.d_head))  # [K, 2, H, 1, D]
            self.optim_overrides = {"qk_taps": {"lr_mult": cfg.qk_conv_lr_mult, "weight_decay": 0.0}}

    def forward(self, h: Tensor, reset: Tensor, state: State, mask: Optional[Tensor] = None,
                window: Optional[WindowState] = None, token_mask: Optional[Tensor] = None,
                ) -> tuple[Tensor, State, Tensor, WindowState]:
        """h: [B, S, N, d_model] (normed); mask: [N, N] within-segment attention mask, None = causal;
        window: this layer's carried backbone state, the window and the convolution's history ({} without
        either); token_mask [N] bool: which positions are real tokens (segment-major), None = all.
        Returns ([B, S, N, d_model], state, aux, window)."""
        # Heads are split with a transpose (never a bare view, which mixes positions into heads), into
        # one contiguous [3, B, S, H, N, D] block: every later op (RoPE, σ, SDPA, the memory's
        # einsums) then reads contiguous rows instead of strided ones (a copy here, cheaper than theirs).
        q, k, v = rearrange(self.qkv(h), "b s n (three h d) -> three b s h n d", three=3, h=self.n_heads).contiguous()
        attend = self.attend if mask is None else self.attend.with_segment_mask(mask)
        window = window or {}
        if self.qk_conv:  # keys and queries made of the K positions up to each one
            q, k, tail = convolve_qk(q, k, self.qk_taps, window[TAIL], reset, token_mask)
            window = {**window, TAIL: tail}
        if self.span:  # the backbone's sliding window: each segment's, and the one after the last
            sliding, slid = slide(window, k, v, reset, self.span, token_mask)
            attend, window = attend.with_window(sliding), {**window, **slid}
        inputs = LayerInputs(h, q, k, v, reset, attend, self.project_kv)
        heads, state, aux = self.memory(inputs, state)  # [B, S, H, N, D]
        return self.drop(self.proj(rearrange(heads, "b s h n d -> b s n (h d)"))), state, aux, window

    def project_kv(self, h: Tensor, fixed_weights: bool = False) -> tuple[Tensor, Tensor]:
        """Keys and values of hidden states h [B, M, d_model] with this layer's weights: 2 x [B, H, M, D].
        With model.qk_conv these keys are NOT convolved (memzoo.core.qk_conv says why).

        fixed_weights: W_K, W_V act as constants (gradient reaches h only), for auxiliary losses that
        must train something upstream of the projection without training the projection itself.
        """
        weight = self.qkv.weight[self.d_inner :]  # [2 x H x D, d_model]: rows d_inner: are W_K then W_V
        kv = F.linear(h, weight.detach() if fixed_weights else weight)
        k, v = rearrange(kv, "b m (two h d) -> two b h m d", two=2, h=self.n_heads)
        return k, v


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, memory: LayerMemory, attend: LocalAttention):
        super().__init__()
        self.norm_attn = nn.LayerNorm(cfg.d_model)
        self.attn = MemoryAttention(cfg, memory, attend)
        self.norm_mlp = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, reset: Tensor, state: State, mask: Optional[Tensor] = None,
                window: Optional[WindowState] = None, token_mask: Optional[Tensor] = None,
                ) -> tuple[Tensor, State, Tensor, WindowState]:
        y, state, aux, window = self.attn(self.norm_attn(x), reset, state, mask, window, token_mask)
        x = x + y
        return x + self.mlp(self.norm_mlp(x)), state, aux, window
