"""Compressive Transformer (Rae, Potapenko, Jayakumar, Lillicrap 2019, arXiv 1911.05507).

Per layer and batch row, two gradient-stopped memories of the layer's (normed) input hidden
states h (d_model each), keys and values recomputed with the layer's current W_K, W_V:

    m   : FIFO memory of the last n_m = mem_len states
    cm  : compressed memory of the last n_cm = cmem_len compressed slots

For segment s with hidden states h_s (SG = stop-gradient, f_c = compression function of rate c):

    A        = softmax(Q [K(cm); K(p); K(m); K(h_s)]ᵀ / sqrt(d) + causal mask) [V(cm); V(p); V(m); V(h_s)]
    m, old   = last n_m of [m; SG(h_s)],  the states pushed out         (FIFO eviction)
    new_cm   = f_c(old)                   (c states -> 1 slot; conv kernel = stride = c)
    cm       = last n_cm of [cm; SG(new_cm)]
    L_attn   = || attn(SG(Q), SG(old)) − attn(SG(Q), f_c(SG(old))) ||²   (trains f_c only)

Reconstruction loss. Queries and old memories are gradient-stopped, and the keys/values of the
compression go through W_K, W_V held fixed: gradient reaches the compressed vectors (hence f_c)
but W_K, W_V get none from this loss, and no parameter is frozen (W_K, W_V still learn from the
LM loss through every memory slot). The attention here is content-only (no RoPE: a compressed
slot and the states it replaces sit at different positions by construction); it is the mean
squared difference of the two readouts, over heads, queries and channels, summed over the rows
that compressed something this segment and divided by the batch size; the backbone sums it over
segments and layers and weights it by train.aux_loss_weight. The LM loss does not reach f_c (the
compressed memory is stored gradient-stopped), as in the paper. Computed only while gradient is
enabled and the compressor has parameters (conv); `reconstruction_loss=False` switches it off.

Eviction of fewer than c states (the paper is silent). Groups of c are formed from the oldest
evicted state of the document on; evicted states that do not yet fill a group wait in a pending
buffer p of c − 1 slots (state dtype, counted in the footprint) and are compressed with the next ones.
So every evicted state is compressed exactly once, in time order, whatever the segment lengths
(a final partial segment evicts fewer states). Before the FIFO is full nothing is evicted. Pending
states are attended as they are, between cm and m: they are in the state anyway, and the context
stays contiguous (no hole of up to c − 1 positions behind the FIFO). When states are evicted in
multiples of c (segment length a multiple of c, as in the paper) the buffer is always empty.

Positions (RoPE over the concatenation, relative to the segment's first token 0):
* FIFO slot i of n_m sits at i − n_m (−n_m .. −1), as in Transformer-XL;
* pending slot i of c − 1 (newest last) sits at −n_m − (c − 1 − i), just before the FIFO;
* compressed slot j of n_cm (oldest first) stands for c consecutive states and sits at their
  centre: − (n_m + p) − (n_cm − 1 − j)·c − (c + 1)/2, where p is the row's pending count;
  compressed slots are therefore spaced by c, further back than the memory.

Documents: both memories and the pending buffer are emptied at a document boundary, per row.
Empty slots are masked through bool `valid` flags, never attended as zero vectors, and each
buffer is cut to its filled slots before attention (fifo.filled), so the keys projected and
attended follow the states held, not mem_len + cmem_len. State follows the precision policy
(float32 whatever the autocast dtype, float64 in a float64 model). Footprint: w × (n_cm + n_m + c − 1) × l numbers per
row, w the slot's width (d_model; 2·H·D with cache=kv); "table1" is the paper's d_model × (n_cm + n_m) × l, without
the pending buffer, whatever the cache (as xl.py's "table1" stays Table 1's count).

Backbone window (model.attention_span = W > 0, memzoo.core.window): the window's keys are prepended
to this memory's [cm; p; m; segment] attention. `beyond_window` (default True) makes every part hold
what has LEFT the window, as xl.py's option does: the FIFO gets W - 1 more slots, a delay line whose
newest W - 1 states are never attended (they are the window's positions; counted in the footprint as
"window_delay"), so the attended m is the mem_len positions -(W-1)-mem_len .. -W, and the pending
states and compressed slots sit W - 1 further back than above. What the FIFO evicts is still
compressed in time order, now W - 1 positions later. beyond_window=False keeps the parts as without
a window (the FIFO's newest W - 1 states then repeat the window's keys in the softmax). With W = 0
both are the plain memory.

What a slot holds (`cache`; "kv" departs from the paper, so it is an explicit option):
* "hidden" (default): the paper's, h as above, keys and values re-projected with the current W_K, W_V.
* "kv": the key (pre-RoPE) and value the layer attended, [k | v] (2·H·D numbers a slot), as xl.py's option;
  f_c compresses keys and values apart (conv: one filter bank each, groups = 2), and the reconstruction
  loss reads the kept keys and values in place of W_K, W_V's projections (f_c is still all it trains).
  W_K, W_V then learn nothing through the memory slots. It is there for backbones whose keys are not a
  function of one hidden state (model.qk_conv: memzoo.core.qk_conv), where re-projected keys miss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from memzoo.core.attention import KVPrefix
from memzoo.core.config import ModelConfig
from memzoo.core.fifo import delayed, fifo_init, fifo_push, fifo_reset, filled, kv_slot_numbers, slot_positions
from memzoo.core.memory import LayerMemory, SegmentInputs, State, zero_loss
from memzoo.core.plugins import register_memory
from memzoo.core.window import beyond_window_delay

COMPRESSIONS = ("conv", "depthwise-conv", "mean", "max")
CACHES = ("hidden", "kv")
PARTS = ("cmem", "pend", "mem")  # compressed memory, pending (evicted, not yet compressed), FIFO memory: oldest first


@dataclass
class CompressiveConfig:
    mem_len: int = 2048  # n_m: slots (hidden states, or keys and values with cache=kv) kept in the FIFO memory per layer
    cmem_len: int = 2048  # n_cm: compressed slots kept per layer
    compression_rate: int = 2  # c: evicted states per compressed slot
    # conv (Conv1d, kernel = stride = c; initialised as mean pooling) | depthwise-conv (one filter per
    # channel: d_model·c parameters instead of c·d_model², for parameter-matched comparisons) | mean | max
    compression: str = "conv"
    reconstruction_loss: bool = True  # train the conv compressor with the attention-reconstruction loss
    beyond_window: bool = True  # with model.attention_span W > 0: the memories hold what has left the window
    cache: str = "hidden"  # hidden (the paper) | kv: a slot holds the key and value the layer attended (see above)


class Compressor(nn.Module):
    """f_c: [B, G·c, w] -> [B, G, w], one slot per c consecutive slots of width w; `banks` conv filter banks
    over equal channel blocks (2 for [k | v]: keys and values compressed apart)."""

    def __init__(self, kind: str, width: int, rate: int, banks: int = 1):
        super().__init__()
        self.kind, self.rate = kind, rate
        if kind in ("conv", "depthwise-conv"):
            groups = width if kind == "depthwise-conv" else banks
            self.conv = nn.Conv1d(width, width, kernel_size=rate, stride=rate, groups=groups)
            with torch.no_grad():  # start as mean pooling (the paper gives no initialisation)
                eye = torch.eye(width // groups).repeat(groups, 1)  # [w, w / groups]: each bank the identity
                self.conv.weight.copy_(eye[:, :, None].expand(-1, -1, rate) / rate)
                self.conv.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        """x: [B, G·c, w] (time-ordered) -> [B, G, w]."""
        if self.kind in ("conv", "depthwise-conv"):
            return rearrange(self.conv(rearrange(x, "b t d -> b d t")), "b d g -> b g d")
        groups = rearrange(x, "b (g c) d -> b g c d", c=self.rate)  # [B, G, c, d]
        return groups.mean(dim=2) if self.kind == "mean" else groups.amax(dim=2)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> Tensor:
    """Content-only softmax attention. q: [B, H, N, D], k/v: [B, H, M, D], valid: [B, M] -> [B, H, N, D].
    One fused kernel (the scores are never stored for backward); invalid keys get the dtype's lowest
    score, so a row with none valid averages every value, finite (its loss is masked out: its gradient
    is finite but not the masked formula's)."""
    bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None, None, :])  # scale 1/√D


def gather_slots(x: Tensor, index: Tensor) -> Tensor:
    """x: [B, L, ...], index: [B, L'] -> [B, L', ...] (per-row slot selection)."""
    return torch.gather(x, 1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))


@register_memory("compressive", config=CompressiveConfig)
class CompressiveTransformer(LayerMemory):
    """Attention over [compressed memory; FIFO memory; segment]; evicted states compressed at rate c."""

    gradient_through_state = False  # both memories are SG(·), as in the paper
    # folders saved before the options (hashed as absent): no window, where beyond_window changes nothing; hidden slots
    legacy_options = {"beyond_window": True, "cache": "hidden"}

    def __init__(self, cfg: CompressiveConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if int(cfg.mem_len) < 1:
            raise ValueError(f"compressive mem_len={cfg.mem_len}; expected a positive int")
        if int(cfg.cmem_len) < 0:
            raise ValueError(f"compressive cmem_len={cfg.cmem_len}; expected an int >= 0")
        if int(cfg.compression_rate) < 1:
            raise ValueError(f"compressive compression_rate={cfg.compression_rate}; expected an int >= 1")
        if cfg.compression not in COMPRESSIONS:
            raise ValueError(f"compressive compression={cfg.compression!r}; expected one of {COMPRESSIONS}")
        if cfg.cache not in CACHES:
            raise ValueError(f"compressive cache={cfg.cache!r}; expected one of {CACHES}")
        self.rate, self.n_heads = int(cfg.compression_rate), model.n_heads
        self.width = self.slot_width(cfg, model)
        self.compressor = Compressor(cfg.compression, self.width, self.rate, banks=2 if cfg.cache == "kv" else 1)

    @staticmethod
    def slot_width(cfg: CompressiveConfig, model: ModelConfig) -> int:
        """Numbers a slot holds: d_model (a hidden state) or 2·H·D (a key and a value per head)."""
        return kv_slot_numbers(model.n_heads, model.d_head) if cfg.cache == "kv" else model.d_model

    def keys_values(self, x: SegmentInputs, slots: Tensor, fixed_weights: bool = False) -> tuple[Tensor, Tensor]:
        """Slots [B, M, w] -> keys, values [B, H, M, D]: split ([k | v]) or projected with W_K, W_V (hidden)."""
        if self.cfg.cache == "kv":
            k, v = rearrange(slots, "b m (two h d) -> two b h m d", two=2, h=self.n_heads)
            return k, v
        if fixed_weights:
            return x.project_kv(slots, fixed_weights=True)
        return x.project_kv(slots)

    def slots_of(self, x: SegmentInputs) -> Tensor:
        """The segment's slots to push, gradient stopped: h [B, N, d_model] or [k | v] [B, N, 2·H·D]."""
        if self.cfg.cache == "kv":
            return rearrange(torch.stack((x.k, x.v)), "two b h n d -> b n (two h d)").detach()
        return x.h.detach()

    # ---- state -----------------------------------------------------------------------------
    def _capacities(self) -> dict[str, int]:
        """Slots of each part as attended (the FIFO's delay line, if any, excluded)."""
        return {"mem": self.cfg.mem_len, "cmem": self.cfg.cmem_len, "pend": self.rate - 1}

    @classmethod
    def delay(cls, cfg: CompressiveConfig, model: ModelConfig) -> int:
        """The FIFO's delay line: W - 1 slots with the window and beyond_window, else 0."""
        return beyond_window_delay(model.attention_span, cfg.beyond_window, cls.uses_window)

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """Per part: slots [B, C, w] (oldest first; the policy's state dtype) and a bool `<part>_valid` [B, C]
        (the FIFO's C includes the delay line)."""
        state: State = {}
        delay = self.delay(self.cfg, self.model_cfg)
        for part, capacity in self._capacities().items():
            capacity += delay if part == "mem" else 0
            buf = fifo_init(batch_size, capacity, {"h": (self.width,)}, device, self.state_dtype())
            state[part], state[f"{part}_valid"] = buf["h"], buf["valid"]
        return state

    def reset_rows(self, state: State, rows: Tensor) -> State:
        """A document start empties the row's memory, compressed memory and pending buffer."""
        return fifo_reset(state, rows)

    @staticmethod
    def _part(state: State, part: str) -> State:
        return {"h": state[part], "valid": state[f"{part}_valid"]}

    @classmethod
    def lookback(cls, cfg: CompressiveConfig, model: ModelConfig) -> list[int]:
        """The FIFO, the pending buffer (c - 1 at most; always empty when c divides the segment length)
        and the compressed slots (c positions each), behind the delay line with the window."""
        c = int(cfg.compression_rate)
        pending = c - 1 if model.segment_len % c else 0
        return [int(cfg.mem_len) + cls.delay(cfg, model) + pending + int(cfg.cmem_len) * c] * model.n_layers

    @classmethod
    def footprint(cls, cfg: CompressiveConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Fixed-size buffers: independent of tokens_seen. With the window's delay line (beyond_window,
        W > 0) "total" adds its W - 1 slots per layer ("window_delay")."""
        width = cls.slot_width(cfg, model)
        held = width * (cfg.cmem_len + cfg.mem_len) * model.n_layers
        pending = width * (cfg.compression_rate - 1) * model.n_layers
        delay = width * cls.delay(cfg, model) * model.n_layers
        table1 = model.d_model * (cfg.cmem_len + cfg.mem_len) * model.n_layers  # the paper's count: hidden states
        parts = {"total": held + pending + delay, "table1": table1, "pending": pending}
        return parts | ({"window_delay": delay} if delay else {})

    # ---- read --------------------------------------------------------------------------------
    def memory_prefix(self, x: SegmentInputs, state: State) -> KVPrefix:
        """Keys/values of [cm; pending; m] (with the current W_K, W_V for hidden slots), positions and validity.

        Each part is cut to its filled slots (fifo.filled), so empty capacity costs nothing; a slot
        keeps the position of its place in the whole buffer.
        """
        c, n_cm, n_m = self.rate, self.cfg.cmem_len, self.cfg.mem_len
        delay = self.delay(self.cfg, self.model_cfg)  # W - 1 newest FIFO slots: the window's, not attended
        attended = {part: delayed(self._part(state, part), n_m, delay if part == "mem" else 0) for part in PARTS}
        parts = {part: filled(buf) for part, buf in attended.items()}  # {part: h [B, F, d], valid [B, F]}
        first = {part: capacity - parts[part]["valid"].shape[1] for part, capacity in self._capacities().items()}
        dev = state["pend_valid"].device
        pending = state["pend_valid"].sum(dim=1, keepdim=True)  # [B, 1]: p, states between cm and m
        back = n_m + delay  # m's oldest slot sits at -back
        # compressed slots kept, counted in the policy's dtype: the positions are half-integers, exact in either
        j = torch.arange(first["cmem"], n_cm, device=dev, dtype=self.working_dtype(x.q))
        cm_pos = -(back + pending) - (n_cm - 1 - j) * c - (c + 1) / 2  # [B, F_cm]: group centres
        i = torch.arange(first["pend"], c - 1, device=dev)  # pending slots kept (newest last)
        pend_pos = (-back - (c - 1 - i)).expand(pending.shape[0], -1)  # [B, F_p]: just before m
        m_pos = slot_positions(n_m, dev, offset=delay)[first["mem"]:].expand(pending.shape[0], -1)  # [B, F_m]
        h = torch.cat([parts[part]["h"] for part in PARTS], dim=1)  # [B, F_cm + F_p + F_m, w]
        k, v = self.keys_values(x, h.to(x.h.dtype))  # [B, H, F_cm + F_p + F_m, D]
        return KVPrefix(
            k=k,
            v=v,
            pos=torch.cat((cm_pos, pend_pos.to(cm_pos.dtype), m_pos.to(cm_pos.dtype)), dim=1),
            valid=torch.cat([parts[part]["valid"] for part in PARTS], dim=1),
        )

    # ---- write -------------------------------------------------------------------------------
    def _groups(self, state: State, evicted: State) -> tuple[Tensor, Tensor, State]:
        """Pending + evicted states -> whole groups of c to compress and the new pending buffer.

        Valid slots are always a suffix (time-contiguous, newest last). A row with m valid states
        compresses its oldest g = m // c groups and keeps the newest r = m % c pending.
        Returns (old [B, G·c, w], group_valid [B, G], pending state).
        """
        c = self.rate
        joined = torch.cat((state["pend"], evicted["h"]), dim=1)  # [B, L, w]
        joined_valid = torch.cat((state["pend_valid"], evicted["valid"]), dim=1)  # [B, L]
        b, length = joined_valid.shape
        m = joined_valid.sum(dim=1)  # [B]
        g, r = torch.div(m, c, rounding_mode="floor"), m % c  # [B]
        n_groups = length // c  # G >= g for every row
        # Window of G·c states ending before the r pending ones; its last g groups are valid.
        t = torch.arange(n_groups * c, device=m.device)
        index = (length - r[:, None] - n_groups * c + t).clamp(min=0)  # [B, G·c]
        old = gather_slots(joined, index)  # [B, G·c, d]
        group_valid = torch.arange(n_groups, device=m.device) >= (n_groups - g)[:, None]  # [B, G]
        i = torch.arange(c - 1, device=m.device)
        pending = {"h": joined[:, length - (c - 1) :], "valid": i >= (c - 1 - r)[:, None]}  # [B, c-1]
        return old, group_valid, pending

    def _push_compressed(self, state: State, new: Tensor, new_valid: Tensor) -> State:
        """cm = last n_cm of [cm; the row's valid new slots] (a row may add fewer than others)."""
        n_cm, n_new = self.cfg.cmem_len, new.shape[1]
        g = new_valid.sum(dim=1, keepdim=True)  # [B, 1]: valid new slots are the last g
        i = torch.arange(n_cm, device=new.device)
        index = torch.where(g + i < n_cm, g + i, n_new + i)  # [B, n_cm] into [cm (n_cm); new (n_new)]
        joined = torch.cat((state["cmem"], new.to(state["cmem"].dtype)), dim=1)
        joined_valid = torch.cat((state["cmem_valid"], new_valid), dim=1)
        return {"h": gather_slots(joined, index), "valid": torch.gather(joined_valid, 1, index)}

    def _reconstruction_loss(self, x: SegmentInputs, old: Tensor, compressed: Tensor, group_valid: Tensor) -> Tensor:
        """|| attn(SG(Q), SG(old)) − attn(SG(Q), f_c(SG(old))) ||², gradient to f_c only."""
        q = x.q.detach().to(old.dtype)  # [B, H, N, D] in the state's dtype
        with torch.no_grad():
            k_old, v_old = self.keys_values(x, old)  # [B, H, G·c, D]: the target, fixed
            target = masked_attention(q, k_old, v_old, group_valid.repeat_interleave(self.rate, dim=1))
        k_cm, v_cm = self.keys_values(x, compressed, fixed_weights=True)  # [B, H, G, D]: gradient to f_c only
        approx = masked_attention(q, k_cm, v_cm, group_valid)  # [B, H, N, D]
        per_row = (target - approx).pow(2).mean(dim=(1, 2, 3))  # [B]
        return (per_row * group_valid.any(dim=1)).sum() / q.shape[0]

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """Attend over [cm; m; segment] (causal), then push the segment and compress what the FIFO evicts."""
        out = x.attend(x.q, x.k, x.v, prefix=self.memory_prefix(x, state))  # [B, H, N, D]

        aux = zero_loss(x.q)
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            mem, evicted = fifo_push(self._part(state, "mem"), {"h": self.slots_of(x)})  # [B, n_m, w]
            old, group_valid, pending = self._groups(state, evicted)  # old: SG(·) already
            compressed = self.compressor(old)  # [B, G, w]
            train_compressor = any(p.requires_grad for p in self.compressor.parameters())
            if self.cfg.reconstruction_loss and train_compressor and torch.is_grad_enabled():
                aux = self._reconstruction_loss(x, old, compressed, group_valid)
            cmem = self._push_compressed(state, compressed.detach(), group_valid)  # SG: no LM gradient to f_c
        new_state = {}
        for part, buf in (("mem", mem), ("cmem", cmem), ("pend", pending)):
            new_state[part], new_state[f"{part}_valid"] = buf["h"], buf["valid"]
        return out, new_state, aux
