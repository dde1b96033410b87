"""The plugin interface: what a memory is to the backbone.

Two kinds, covering every method:

* `LayerMemory` (one instance per layer; Infini, XL, Compressive, Memorizing, ∞-former, and the
  baselines). The layer hands it the segment's queries, keys and values (no positional encoding)
  and its normed hidden states, for S consecutive segments at once, plus a `LocalAttention` that
  applies RoPE and takes an optional prefix of extra keys/values. The memory returns the heads'
  outputs (before W_O), its new state and an auxiliary loss. Whether it prepends keys/values (XL),
  mixes a separate readout through a gate (Infini, Memorizing) or adds one (∞-former) is its own
  business.
* `ModelMemory` (one per model; RMT, ARMT). It wraps each segment's embeddings before the layers
  and reads its next state from the last layer's outputs; it may replace the causal mask over the
  wrapped segment (`attention_mask`). It may also act at every layer (ARMT reads at each layer's
  input and writes from the same layer's output): `before_layer(i, x, state) -> x` runs on block
  i's input (the residual stream of the wrapped segment) and `after_layer(i, x, state) -> state` on
  block i's output, for every block in order, with or without activation checkpointing. Both
  default to no-ops (the input returned as it is), so a memory that does not override them runs
  exactly as before they existed.

State is a flat `dict[str, Tensor]` whose tensors all have the batch row as dim 0, so that reset
per row, detaching, checkpointing and measuring are generic. Only floating-point tensors count
as memory numbers; masks, pointers and counters are bool/int bookkeeping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import torch
from torch import Tensor, nn

from memzoo.core.attention import LocalAttention
from memzoo.core.config import ModelConfig
from memzoo.core.precision import working_dtype

State = dict[str, Tensor]


@dataclass
class LayerInputs:
    """One layer's view of S consecutive segments of a batch."""

    h: Tensor  # [B, S, N, d_model] normed layer input (what XL-style memories cache)
    q: Tensor  # [B, S, H, N, D] queries, no positional encoding
    k: Tensor  # [B, S, H, N, D] keys, no positional encoding
    v: Tensor  # [B, S, H, N, D] values
    reset: Tensor  # [B, S] bool: this row starts a new document at this segment (fresh state first)
    attend: LocalAttention
    # The layer's own key/value projection, for memories that cache hidden states and recompute
    # keys/values with the current weights (original XL, Compressive): [B, M, d_model] -> 2 x [B, H, M, D].
    # `project_kv(h, fixed_weights=True)` treats W_K, W_V as constants (gradient to h only).
    project_kv: Callable[..., tuple[Tensor, Tensor]]

    def local_attention(self) -> Tensor:
        """Causal attention within each segment, all S segments at once: [B, S, H, N, D]. With the
        backbone's sliding window (model.attention_span > 0) each segment also sees its own window."""
        b, s, h, n, d = self.q.shape
        flat = lambda t: t.reshape(b * s, h, n, d)  # noqa: E731  segments are independent here
        return self.attend(flat(self.q), flat(self.k), flat(self.v)).view(b, s, h, n, d)

    def segment(self, s: int) -> "SegmentInputs":
        """Segment s alone, its attention carrying segment s's window (if the backbone has one)."""
        return SegmentInputs(self.h[:, s], self.q[:, s], self.k[:, s], self.v[:, s], self.attend.at_segment(s),
                             self.project_kv)

    def segments(self) -> list["SegmentInputs"]:
        """All S segments in order. By unbind: in backward, S indexings `[:, s]` would each write a
        zero tensor of all S segments; unbind stacks the S gradients once."""
        parts = zip(*(t.unbind(1) for t in (self.h, self.q, self.k, self.v)))
        return [SegmentInputs(h, q, k, v, self.attend.at_segment(s), self.project_kv)
                for s, (h, q, k, v) in enumerate(parts)]


@dataclass
class SegmentInputs:
    h: Tensor  # [B, N, d_model]
    q: Tensor  # [B, H, N, D]
    k: Tensor  # [B, H, N, D]
    v: Tensor  # [B, H, N, D]
    attend: LocalAttention
    project_kv: Callable[..., tuple[Tensor, Tensor]]


def zero_loss(ref: Tensor) -> Tensor:
    """A zero auxiliary loss in the policy's dtype for `ref` (float64 in a float64 model, else float32)."""
    return ref.new_zeros((), dtype=working_dtype(ref))


HOST_CHECKED = ("cpu",)  # devices where reset_rows reads `rows.any()` to skip the blend (free on the host)


def where_rows(rows: Tensor, fresh: State, state: State) -> State:
    """Take `fresh` for the rows marked in `rows` [B], `state` elsewhere (shapes must agree)."""
    out: State = {}
    for key, value in state.items():
        mask = rows.view(-1, *([1] * (value.dim() - 1)))
        out[key] = torch.where(mask, fresh[key].to(value.dtype), value)
    return out


class _Memory(nn.Module):
    """What both kinds share: config, state life cycle, footprint."""

    # Set by the registry decorator.
    name: ClassVar[str] = ""
    # Does gradient flow through the carried state (BPTT), or is it stopped by design (XL caches)?
    gradient_through_state: ClassVar[bool] = True
    # Does the method carry anything across segments at all? (False only for the `local` control.)
    has_memory: ClassVar[bool] = True
    # Do this memory's layers take the backbone's sliding window (model.attention_span > 0; the window
    # is prepended to every attention it calls: memzoo.core.window)? False opts out: segment-local
    # attention and no window carried for its layers (`full`, which already sees the whole document).
    uses_window: ClassVar[bool] = True
    # Options added after run folders existed, with the value those folders were trained under (the
    # behaviour before the option): a saved config without the key is read with it, and hashes alike.
    legacy_options: ClassVar[dict[str, Any]] = {}
    # Parameters whose optimiser settings differ: {parameter-name suffix: {"lr_mult": x, "weight_decay": y}}.
    optim_overrides: dict[str, dict[str, float]]
    # The precision policy (memzoo.core.precision.working_dtype): the narrowest dtype this memory keeps
    # its state and recurrence in. A float64 model is float64 throughout; fp32, bf16 or fp16 weights and
    # bf16/fp16 autocast give float32 with this default. A plugin whose state may be bf16 sets bfloat16.
    state_floor: ClassVar[torch.dtype] = torch.float32

    def __init__(self, cfg: Any, model: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model_cfg = model
        self.optim_overrides = {}
        # Follows the model's dtype through .double()/.to(): what `state_dtype` reads (not saved).
        self.register_buffer("_model_dtype", torch.empty(0), persistent=False)

    def state_dtype(self) -> torch.dtype:
        """The dtype of this memory's floating state: the policy applied to the model's dtype."""
        return working_dtype(self._model_dtype.dtype, self.state_floor)

    def working_dtype(self, x: Tensor) -> torch.dtype:
        """The dtype of this memory's arithmetic on inputs like x (under autocast: x's autocast dtype)."""
        return working_dtype(x, self.state_floor)

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """A fresh state for `batch_size` rows (what a document starts from)."""
        return {}

    def reset_rows(self, state: State, rows: Tensor) -> State:
        """Fresh state for the rows marked in `rows` [B] (a document boundary), unchanged elsewhere.
        Off the CPU the fresh state is blended in unconditionally: asking whether any row resets would
        make the host wait for every queued kernel, once per layer and segment."""
        if not state or (rows.device.type in HOST_CHECKED and not bool(rows.any())):
            return state
        batch = rows.shape[0]
        return where_rows(rows, self.initial_state(batch, rows.device), state)

    def gate_values(self) -> Optional[Tensor]:
        """Per-head mixing weights toward memory (0 = local only, 1 = memory only), if the method has any."""
        return None

    @classmethod
    def footprint(cls, cfg: Any, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Analytic numbers held per sequence after `tokens_seen` tokens of one document.

        Returns {"total": n, ...named parts}. "total" must equal what a real state holds (the
        measured count). When the paper's Table-1 count differs from the carried state (RMT counts
        read/write activations in every layer; Memorizing adds XL caches), also return it as
        "table1": the card's formula is held against "table1" if present, else "total".
        """
        raise NotImplementedError

    @classmethod
    def lookback(cls, cfg: Any, model: ModelConfig) -> Optional[list[int]]:
        """Per layer, how many positions before its segment's first token the layer can attend to,
        when what it reads of the past is a window of positions (XL's cache, a kNN store); None when
        its state can in principle carry anything from any earlier segment (a matrix, memory tokens,
        full attention). memzoo.evaluations.reach turns the windows into the farthest gap a memory can
        bridge. Default: None."""
        return None


class LayerMemory(_Memory):
    """A memory that lives inside one attention layer."""

    def __init__(self, cfg: Any, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model)
        self.layer_index = layer_index

    @classmethod
    def for_layer(cls, cfg: Any, model: ModelConfig, layer_index: int) -> "LayerMemory":
        """The memory module for one layer (a method may use different ones per layer)."""
        return cls(cfg, model, layer_index)

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """Run S segments in order. Returns (heads [B, S, H, N, D], state after the last, aux loss).

        The default loops over segments, resetting rows at document starts; methods that can
        vectorise across segments override it (and keep `segment` as the readable form).
        """
        outs, aux = [], zero_loss(x.q)
        for seg, reset in zip(x.segments(), x.reset.unbind(1)):
            state = self.reset_rows(state, reset)
            out, state, seg_aux = self.segment(seg, state)
            outs.append(out)
            aux = aux + seg_aux
        return torch.stack(outs, dim=1), state, aux

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """One segment: read from state_{s-1}, combine with local attention, write state_s."""
        raise NotImplementedError


class ModelMemory(_Memory):
    """A memory at the model's input and output (RMT): tokens around each segment."""

    def enter(self, x: Tensor, state: State) -> tuple[Tensor, Tensor]:
        """Wrap the segment's embeddings x [B, N, d_model]: returns (x' [B, N', d_model], token_mask [N'])

        where token_mask marks the positions that carry the segment's own tokens (in order).
        """
        raise NotImplementedError

    def leave(self, h: Tensor, state: State) -> State:
        """The next state from the last layer's outputs h [B, N', d_model] (after the final norm)."""
        raise NotImplementedError

    def attention_mask(self, length: int, device: torch.device) -> Optional[Tensor]:
        """Which of the `length` wrapped positions may attend to which: [N', N'] bool (True = may
        attend), or None for the plain causal mask (the default). Every layer uses it."""
        return None

    def before_layer(self, index: int, x: Tensor, state: State) -> Tensor:
        """Block `index`'s input x [B, N', d_model] (the residual stream of the wrapped segment, before
        the block's norm), as the block will see it. `state` is this memory's state so far in the
        segment (after the `after_layer` calls of the blocks below). Default: x unchanged."""
        return x

    def after_layer(self, index: int, x: Tensor, state: State) -> State:
        """This memory's state after block `index`, given the block's output x [B, N', d_model] (the
        residual stream, before the next block). The state returned is what the next blocks' hooks
        and `leave` see. Default: the state unchanged."""
        return state


class NoMemory(LayerMemory):
    """Local causal attention within the segment and nothing else: the floor of every comparison.

    Also the layer used by model-level memories (RMT) and by layers a method leaves alone.
    """

    has_memory = False

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        return x.local_attention(), state, zero_loss(x.q)

    @classmethod
    def footprint(cls, cfg: Any, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        return {"total": 0}

    @classmethod
    def lookback(cls, cfg: Any, model: ModelConfig) -> Optional[list[int]]:
        return [0] * model.n_layers  # the segment itself and nothing before it


def state_numbers(states: list[State], batch_size: int) -> int:
    """Measured: floating-point numbers held per sequence across the given states."""
    total = 0
    for state in states:
        for value in state.values():
            if value.is_floating_point():
                total += value.numel()
    return total // max(batch_size, 1)


def state_bytes(states: list[State], batch_size: int) -> int:
    """Measured: bytes of every tensor in the states, per sequence (bookkeeping included)."""
    total = sum(v.numel() * v.element_size() for state in states for v in state.values())
    return total // max(batch_size, 1)


def map_state(state: State, fn) -> State:
    return {k: fn(v) for k, v in state.items()}


@dataclass
class MemoryParts:
    """What a built model holds for its method: one memory per layer and an optional model memory."""

    layers: list[LayerMemory]
    model: Optional[ModelMemory]
