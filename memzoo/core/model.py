"""The segment-recurrent backbone: a pre-norm decoder whose attention layers hold a memory plugin.

A model is one function `(segments, state) -> (logits, state)`. It takes S >= 1 consecutive
segments of N tokens at once ([B, S, N]); streaming feeds S = 1 at a time, training feeds one
truncated-BPTT block at a time. Layer-level memories run layer-major (each layer sees all S
segments, so a plugin may vectorise across them); a model-level memory (tokens around each
segment) needs the previous segment's top layer, so the model then runs segment-major, calling
the memory's per-layer hooks (`before_layer`, `after_layer`; no-ops unless the memory overrides
them) around every block. The backbone knows no method by name.

With model.attention_span = W > 0 the backbone's attention is a sliding window (memzoo.core.window):
each layer carries the previous segment's last W - 1 keys and values as backbone state
(`ModelState.window`), and the attention handed to the memory prepends them; a memory opts out with
`uses_window = False`. With model.qk_conv = K > 0 every layer's queries and keys pass a short causal
convolution over time (memzoo.core.qk_conv), whose last K - 1 raw rows ride in the same per-layer state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from memzoo.core.attention import LocalAttention
from memzoo.core.block import Block
from memzoo.core.config import ConfigError, ModelConfig
from memzoo.core.memory import LayerMemory, MemoryParts, ModelMemory, State, map_state, zero_loss
from memzoo.core.plugins import build_memory, get_memory
from memzoo.core.qk_conv import TAIL, check_qk_conv, tail_init, tail_numbers
from memzoo.core.window import WindowState, check_span, window_footprint, window_init


@dataclass
class ModelState:
    """Everything carried from one call to the next: one memory state per layer, the model memory's,
    and the backbone's own state per layer: its sliding window and its convolution's history (empty when
    it carries neither; `{}` for a layer with no window and no convolution). It is not memory: `all()` (what a memory's
    footprint measures) leaves it out, `carried()` has it."""

    layers: list[State]
    model: State
    window: list[WindowState] = field(default_factory=list)

    def all(self) -> list[State]:
        """The memory's states: every layer's, then the model memory's (the window is not memory)."""
        return [*self.layers, self.model]

    def carried(self) -> list[State]:
        """Every state tensor carried, the backbone's window included."""
        return [*self.all(), *self.window]

    def detach(self) -> "ModelState":
        """Cut the gradient here (the truncated-BPTT horizon), the window's included."""
        return ModelState([map_state(s, Tensor.detach) for s in self.layers], map_state(self.model, Tensor.detach),
                          [map_state(s, Tensor.detach) for s in self.window])


@dataclass
class ModelOutput:
    logits: Tensor  # [B, S, N, vocab]
    state: ModelState
    aux_loss: Tensor  # scalar: sum of the memories' auxiliary losses (0 for most methods)


INIT_STREAMS = ("split", "shared")


def memory_stream_seed(seed: int) -> int:
    """The seed of the memory parameters' own generator: a fixed function of the run's seed, apart
    from the backbone's (which is the seed itself)."""
    return (int(seed) * 0x9E3779B1 + 0x6D656D) % (2**63)


def is_memory_name(name: str) -> bool:
    """A module or parameter name inside a memory plugin (a layer's `attn.memory`, the model's
    `model_memory`): the plugin initialises and owns it; everything else is the shared backbone."""
    parts = name.split(".")
    return parts[0] == "model_memory" or "memory" in parts[1:]


class MemoryModel(nn.Module):
    """Byte-level language model on the segment-recurrent backbone with one memory method."""

    def __init__(self, cfg: ModelConfig, method: str, memory_cfg: Any, seed: Optional[int] = None):
        """seed: the run's seed, from which the initial weights are drawn (`cfg.init_streams`); None
        takes the global generator's seed (`torch.manual_seed(s)` before building gives seed s)."""
        super().__init__()
        try:
            check_span(cfg.attention_span, cfg.segment_len)
            check_qk_conv(cfg.qk_conv)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if cfg.init_streams not in INIT_STREAMS:
            raise ValueError(f"model.init_streams={cfg.init_streams!r}; expected one of {INIT_STREAMS}")
        self.cfg = cfg
        self.method = method
        self.memory_cfg = memory_cfg
        self.spec = get_memory(method)
        seed = torch.initial_seed() if seed is None else int(seed)
        if cfg.init_streams == "shared":  # the memory's draws first, then the backbone's, one stream
            parts = build_memory(method, memory_cfg, cfg)
            self._build_backbone(cfg, parts)
            return
        with torch.random.fork_rng(devices=[]):  # the memory's own stream: it shifts no backbone draw
            torch.manual_seed(memory_stream_seed(seed))
            parts = build_memory(method, memory_cfg, cfg)
        with torch.random.fork_rng(devices=[]):  # the backbone from the run's seed alone
            torch.manual_seed(seed)
            self._build_backbone(cfg, parts)

    def _build_backbone(self, cfg: ModelConfig, parts: MemoryParts) -> None:
        """Embedding, blocks around the memory's layers, final norm and tied head, initialised."""
        attend = LocalAttention(cfg.rope_base, cfg.attention_backend)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, mem, attend) for mem in parts.layers)
        self.model_memory: Optional[ModelMemory] = parts.model
        self.norm_out = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self._init_weights()

    def _init_weights(self) -> None:
        """model.init small: normal(0.02) (residual projections scaled down); torch: PyTorch's defaults."""
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if is_memory_name(name):
                continue  # plugins initialise their own parameters
            if self.cfg.init == "torch":
                if isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, 0.0, 1.0)  # the head shares it (tied)
                elif isinstance(module, nn.Linear) and module is not self.head:
                    module.reset_parameters()
                continue
            if isinstance(module, nn.Linear):
                std = resid_std if name.endswith(("proj", "down")) else 0.02
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)

    @property
    def memories(self) -> list[LayerMemory]:
        return [b.attn.memory for b in self.blocks]

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> ModelState:
        device = torch.device(device) if device is not None else self.embed.weight.device
        layers = [m.initial_state(batch_size, device) for m in self.memories]
        model = self.model_memory.initial_state(batch_size, device) if self.model_memory else {}
        return ModelState(layers, model, self.initial_window(batch_size, device))

    def forget_memory(self, state: ModelState, batch_size: int) -> ModelState:
        """The memory ablation's state: every memory's state fresh, the backbone's window kept (what a
        memory buys beyond the window, read apart from what the window sees)."""
        fresh = self.initial_state(batch_size, self.embed.weight.device)
        return ModelState(fresh.layers, fresh.model, state.window)

    @property
    def carries_backbone_state(self) -> bool:
        """Whether the backbone carries state of its own per layer: a sliding window or the history of
        its convolution on queries and keys (memzoo.core.qk_conv)."""
        return bool(self.cfg.attention_span or self.cfg.qk_conv)

    def initial_window(self, batch_size: int, device: torch.device) -> list[WindowState]:
        """The backbone's empty state per layer: the window ({} for a layer that opts out) and the
        convolution's zero history; [] when it carries neither."""
        if not self.carries_backbone_state:
            return []
        dtype, c = self.embed.weight.dtype, self.cfg
        windows = [window_init(batch_size, b.attn.span, c.n_heads, c.d_head, device, dtype) if b.attn.span else {}
                   for b in self.blocks]
        if c.qk_conv:
            windows = [{**w, TAIL: tail_init(batch_size, c.qk_conv, c.n_heads, c.d_head, device, dtype)} for w in windows]
        return windows

    def window_footprint(self) -> dict[str, int]:
        """Numbers the backbone carries per sequence, apart from the memory's footprint: its window's
        (2 x H x D x (W - 1) x the layers that use it) and its convolution's history ("qk_tail": 2 x H x
        D x (K - 1) x layers); measured: state_numbers(state.window, B)."""
        layers = sum(1 for b in self.blocks if b.attn.span)
        c = self.cfg
        out = window_footprint(c.attention_span, c.n_heads, c.d_head, layers)
        tail = tail_numbers(c.qk_conv, c.n_heads, c.d_head, len(self.blocks))
        return {**out, "total": out["total"] + tail, "qk_tail": tail}

    def forward(self, tokens: Tensor, state: Optional[ModelState] = None, reset: Optional[Tensor] = None) -> ModelOutput:
        """tokens: [B, S, N] (or [B, N] for one segment); reset: [B, S] bool, document starts.

        Every segment but the last must be full (N = segment_len); the last may be shorter.
        """
        if tokens.dim() == 2:
            tokens = tokens[:, None]
        b, s, n = tokens.shape
        if n > self.cfg.segment_len:
            raise ValueError(f"segments of {n} tokens exceed model.segment_len={self.cfg.segment_len}")
        if tokens.dtype not in (torch.int64, torch.int32) or (
            tokens.numel() and not 0 <= int((lo_hi := torch.aminmax(tokens)).min) <= int(lo_hi.max) < self.cfg.vocab_size
        ):
            raise ValueError(f"tokens must be integer ids in [0, {self.cfg.vocab_size}); got dtype {tokens.dtype}")
        state = state if state is not None else self.initial_state(b, tokens.device)
        reset = reset if reset is not None else torch.zeros(b, s, dtype=torch.bool, device=tokens.device)
        if reset.shape != (b, s) or reset.dtype != torch.bool:
            raise ValueError(f"reset must be a bool tensor of shape [B, S] = {[b, s]}; got {reset.dtype} {list(reset.shape)}")
        if len(state.layers) != len(self.blocks):
            raise ValueError(f"state has {len(state.layers)} layer states for a {len(self.blocks)}-layer model")
        if self.carries_backbone_state and not state.window:  # a state made without the window: start it empty
            state = ModelState(state.layers, state.model, self.initial_window(b, tokens.device))
        if len(state.window) not in (0, len(self.blocks)) or (state.window and not self.carries_backbone_state):
            raise ValueError(f"state has {len(state.window)} window states for a {len(self.blocks)}-layer model "
                             f"with model.attention_span={self.cfg.attention_span}, model.qk_conv={self.cfg.qk_conv}")
        for st in state.carried():
            for key, value in st.items():
                if value.shape[0] != b:
                    raise ValueError(f"state tensor {key!r} is for batch size {value.shape[0]}, tokens have {b} rows")
        if self.model_memory is None:
            return self._layer_major(tokens, state, reset)
        return self._segment_major(tokens, state, reset)

    def _run_blocks(self, x: Tensor, reset: Tensor, layer_states: list[State], mask: Optional[Tensor] = None,
                    hooks: Optional[ModelMemory] = None, hook_state: Optional[State] = None,
                    windows: Optional[list[WindowState]] = None, token_mask: Optional[Tensor] = None,
                    ) -> tuple[Tensor, list[State], Tensor, Optional[State], list[WindowState]]:
        """Run every block on x [B, S, N, d_model]. With `hooks` (a model memory, one segment: S = 1),
        its `before_layer` sees each block's input and its `after_layer` each block's output, threading
        `hook_state`; under activation checkpointing the hooks run outside the checkpointed block
        (their activations are kept). `windows`: the backbone's window per layer ([] without one);
        `token_mask` [N]: the real token positions of a wrapped segment. Returns (x, layer states,
        aux loss, hook state, windows)."""
        aux = zero_loss(x)
        new_states, new_windows = [], []
        windows = windows or [{}] * len(self.blocks)
        for index, (block, st, win) in enumerate(zip(self.blocks, layer_states, windows)):
            if hooks is not None:
                x = hooks.before_layer(index, x[:, 0], hook_state)[:, None]
            if self.cfg.checkpoint_activations and self.training:
                x, st, a, win = checkpoint(block, x, reset, st, mask, win, token_mask, use_reentrant=False)
            else:
                x, st, a, win = block(x, reset, st, mask, win, token_mask)
            if hooks is not None:
                hook_state = hooks.after_layer(index, x[:, 0], hook_state)
            new_states.append(st)
            new_windows.append(win)
            aux = aux + a
        return x, new_states, aux, hook_state, new_windows if self.carries_backbone_state else []

    def _layer_major(self, tokens: Tensor, state: ModelState, reset: Tensor) -> ModelOutput:
        x = self.embed(tokens)  # [B, S, N, d_model]
        x, layers, aux, _, windows = self._run_blocks(x, reset, state.layers, windows=state.window)
        logits = self.head(self.norm_out(x))  # [B, S, N, V]
        return ModelOutput(logits, ModelState(layers, state.model, windows), aux)

    def _segment_major(self, tokens: Tensor, state: ModelState, reset: Tensor) -> ModelOutput:
        assert self.model_memory is not None
        logits, aux = [], zero_loss(self.embed.weight)
        layers, mem, windows = state.layers, state.model, state.window
        for s in range(tokens.shape[1]):
            mem = self.model_memory.reset_rows(mem, reset[:, s])
            x, token_mask = self.model_memory.enter(self.embed(tokens[:, s]), mem)  # [B, N', d_model]
            mask = self.model_memory.attention_mask(x.shape[1], x.device)  # [N', N'] or None (causal)
            # the window holds and shows the real tokens only (memzoo.core.window)
            x, layers, a, mem, windows = self._run_blocks(x[:, None], reset[:, s : s + 1], layers, mask,
                                                          self.model_memory, mem, windows, token_mask)
            h = self.norm_out(x[:, 0])  # [B, N', d_model]
            mem = self.model_memory.leave(h, mem)
            logits.append(self.head(h[:, token_mask]))
            aux = aux + a
        return ModelOutput(torch.stack(logits, dim=1), ModelState(layers, mem, windows), aux)

    def optim_groups(self, weight_decay: float, lr: float) -> list[dict[str, Any]]:
        """AdamW groups: decay on matrices, none on norms/biases/embeddings' 1-d params, and the
        memory plugins' own overrides (e.g. the Infini gate's learning-rate multiplier and decay)."""
        overrides: dict[str, dict[str, float]] = {}
        for mname, module in self.named_modules():
            for suffix, opt in getattr(module, "optim_overrides", {}).items():
                overrides[f"{mname}.{suffix}" if mname else suffix] = opt
        groups: dict[tuple[float, float], list[Tensor]] = {}
        for pname, p in self.named_parameters():
            if not p.requires_grad:
                continue
            opt = overrides.get(pname, {})
            wd = opt.get("weight_decay", weight_decay if p.dim() >= 2 else 0.0)
            mult = opt.get("lr_mult", 1.0)
            groups.setdefault((wd, mult), []).append(p)
        return [
            {"params": ps, "weight_decay": wd, "lr_mult": mult, "lr": lr * mult} for (wd, mult), ps in groups.items()
        ]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
