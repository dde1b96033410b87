"""Memorizing Transformer (Wu, Rabe, Hutchins, Szegedy 2022, arXiv 2203.08913).

Every layer keeps a Transformer-XL cache of the previous `mem_len` keys and values (stop-gradient)
and attends over [cache; segment] with RoPE. One layer near the top (`knn_layer`) also keeps a
non-differentiable store of past (key, value) pairs per head and batch row, FIFO with capacity
`store_size`. For segment s at that layer, with hats for L2 normalisation and SG for stop-gradient:

    idx      = top-k over the valid store slots j of  q̂_t · k̂_j          (exact: matrix product)
    A_mem,t  = softmax_j∈idx(τ_h q̂_t · k̂_j) V_j                         (no positional encoding)
    A_dot    = causal softmax attention over [XL cache; segment] with RoPE
    A        = sigmoid(b_h) ⊙ A_mem + (1 − sigmoid(b_h)) ⊙ A_dot          (b: one scalar per head)
    store_s  = last store_size slots of [store_{s-1}; SG(k̂, v) of segment s]

Order: the store is read (state_{s-1}) before the segment is written, so a segment never
retrieves its own keys. Empty slots (a fresh or reset row) are masked out of the search and the
softmax, never retrieved as zero vectors. The search and the XL attention run only over the filled
part of a buffer (from the oldest slot valid in any row: `fifo.filled`), so an empty capacity costs
nothing: a store of 65,536 with 900 keys in it searches 900 slots, with the same neighbours. The
store is written the same way (`fifo.fifo_push_filled`: the filled slots and the new ones are
copied, the rest of a not-yet-full store is never touched and stays uninitialised), so a fresh
store costs nothing to create and a push costs the keys held, not store_size.

Choices where the paper is silent (also in memzoo/registry/memorizing.yaml):
* kNN layer: `knn_layer=None` means ceil(0.75 × n_layers) − 1, the first layer at or past three
  quarters of the depth (index 8 = the 9th of 12 layers, as in the paper; index 1 of 2).
* Normalisation only on the memory path: the local softmax path of every layer keeps the
  backbone's raw queries/keys (1/sqrt(d) scaling); the memory path compares unit vectors and
  multiplies the cosine by a learned per-head temperature τ_h = exp(log_scale_h), initialised to
  sqrt(d_head) (`scale_init=None`), the typical size of q·k/sqrt(d) for unnormalised vectors.
  Its learning-rate multiplier `scale_lr_mult` (1 by default) lets τ move within a short fine-tune
  (at τ = 5.7 a softmax over 32 near-tied neighbours is close to uniform). On the passkey it did
  not help: the key's slot was not ranked first, so a sharper read only sharpened onto the wrong
  slots (experiments/longrange/README.md, experiment 7).
* The store holds the L2-normalised keys (what the search compares) and the raw values.
* A query with no valid slot to retrieve (the first segment of a document) reads A_mem = 0, so
  its output is (1 − sigmoid(b)) A_dot, as Infini's `first_read=zeros`. With fewer valid slots
  than top_k, it attends over the valid ones only.
* Gradient: the store and the XL caches are stop-gradient (`gradient_through_state = False`);
  gradient reaches the queries, the temperature and the gate, never a previous segment.
* The XL cache holds keys and values (as Table 1 counts), RoPE over [cache; segment] with
  positions relative to the segment (cache slot i of C at i − C); reset at document boundaries.
* `knn_backend="faiss"` (optional; imported only when chosen) searches an exact inner-product
  index (IndexFlatIP) per row and head over the valid slots: same neighbours as "exact"; the
  attention over them is the same code. faiss searches in float32 on the CPU (its index is
  float32 only); the search is a non-differentiable index lookup, and everything that feeds the
  outputs (the retrieved keys and values, the softmax) runs in the state's dtype.

State follows the precision policy (float32 under any autocast dtype, float64 in a float64 model);
masks are bool bookkeeping.

Backbone window (model.attention_span = W > 0, memzoo.core.window): the window's keys are prepended
to every layer's [XL cache; segment] attention. `beyond_window` (default True) makes every XL cache
hold what has LEFT the window, as xl.py's option does: mem_len positions -(W-1)-mem_len .. -W, the
W - 1 newest waiting in a delay line that is never attended (counted in the footprint as
"window_delay"). beyond_window=False keeps the caches as without a window (their newest W - 1 then
repeat the window's keys). The kNN store is the paper's either way: every past key up to store_size,
the window's and the caches' included (the paper's store also holds what its XL cache holds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.core.config import ModelConfig
from memzoo.core.fifo import (delayed, fifo_init, fifo_push_filled, fifo_reset, filled, kv_prefix, kv_slot_shapes, push_kv,
                              shifted)
from memzoo.core.memory import LayerMemory, SegmentInputs, State, zero_loss
from memzoo.core.head_gate import HeadGate
from memzoo.core.plugins import register_memory
from memzoo.core.probe import probe
from memzoo.core.window import beyond_window_delay

BACKENDS = ("exact", "faiss")


@dataclass
class MemorizingConfig:
    store_size: int = 65536  # (key, value) slots per head and row in the kNN layer's store
    top_k: int = 32  # neighbours retrieved per query (the paper's k)
    knn_layer: Optional[int] = None  # layer index of the store; None: ceil(0.75 * n_layers) - 1
    mem_len: int = 2048  # XL cache positions per layer (one segment in the paper's setting)
    gate_init: float = 0.0  # b at initialisation; sigmoid(0) = 0.5
    gate_lr_mult: float = 1.0  # learning-rate multiplier for b
    gate_weight_decay: float = 0.0  # weight decay on b (decay pulls gates to 0.5)
    scale_init: Optional[float] = None  # memory-path temperature τ at init; None: sqrt(d_head)
    scale_lr_mult: float = 1.0  # learning-rate multiplier for log τ (no weight decay)
    knn_backend: str = "exact"  # exact (matrix product + top-k) | faiss (optional package)
    beyond_window: bool = True  # with model.attention_span W > 0: the XL caches hold what has left the window


def knn_layer_index(cfg: MemorizingConfig, model: ModelConfig) -> int:
    """The index of the layer holding the kNN store (negative indices count from the top)."""
    n = model.n_layers
    index = math.ceil(0.75 * n) - 1 if cfg.knn_layer is None else int(cfg.knn_layer)
    if index < 0:
        index += n
    if not 0 <= index < n:
        raise ValueError(f"memorizing knn_layer={cfg.knn_layer}; expected an index in [-{n}, {n}) or None")
    return index


def l2_normalise(x: Tensor) -> Tensor:
    """Unit vectors along the last axis (zero vectors stay zero)."""
    return F.normalize(x, p=2.0, dim=-1, eps=1e-6)


def substate(state: State, prefix: str) -> State:
    """The entries of `state` named prefix + name, as {name: tensor}."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(prefix: str, sub: State) -> State:
    """{prefix + name: tensor} for a sub-state."""
    return {prefix + k: v for k, v in sub.items()}


def knn_exact(q_hat: Tensor, keys: Tensor, valid: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k by matrix product over the valid slots.

    q_hat: [B, H, N, D]; keys: [B, C, H, D] (unit); valid: [B, C]. Returns (idx [B, H, N, k'] slot
    indices, ok [B, H, N, k'] bool: a real neighbour), k' = min(k, C), best first.
    """
    sims = q_hat.detach() @ rearrange(keys, "b c h d -> b h d c")  # [B, H, N, C]
    if not bool(valid.all()):
        sims.masked_fill_(~valid[:, None, None, :], float("-inf"))  # empty slots are never chosen
    top, idx = sims.topk(min(k, keys.shape[1]), dim=-1)  # [B, H, N, k']
    return idx, torch.isfinite(top)


def knn_faiss(q_hat: Tensor, keys: Tensor, valid: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The same search with a faiss exact inner-product index per row and head (same outputs)."""
    faiss = import_faiss()
    b, h, n, _ = q_hat.shape
    kk = min(k, keys.shape[1])
    idx = torch.zeros(b, h, n, kk, dtype=torch.long)
    ok = torch.zeros(b, h, n, kk, dtype=torch.bool)
    # faiss searches float32 only: the cast happens in numpy, for the index lookup alone (no gradient, and
    # no torch op narrower than the model's: what feeds the outputs stays in the state's dtype)
    q_np = q_hat.detach().cpu().numpy().astype("float32")  # [B, H, N, D], C-contiguous
    keys_cpu, valid_cpu = keys.detach().cpu(), valid.cpu()
    for row in range(b):
        slots = valid_cpu[row].nonzero().squeeze(-1)  # [V] slot index of each valid entry
        if slots.numel() == 0:
            continue
        for head in range(h):
            index = faiss.IndexFlatIP(keys.shape[-1])
            index.add(keys_cpu[row, slots, head].numpy().astype("float32"))
            _, found = index.search(q_np[row, head], kk)  # [N, k'], -1 where none
            found_t = torch.from_numpy(found).long()
            ok[row, head] = found_t >= 0
            idx[row, head] = slots[found_t.clamp(min=0)]
    return idx.to(q_hat.device), ok.to(q_hat.device)


def import_faiss():
    """faiss, imported lazily; a clear error if the optional package is missing."""
    try:
        import faiss
    except ImportError as err:
        raise ImportError("memorizing knn_backend='faiss' needs faiss (pip install faiss-cpu); or use 'exact'") from err
    return faiss


def attend_retrieved(q_hat: Tensor, keys: Tensor, values: Tensor, idx: Tensor, ok: Tensor, scale: Tensor) -> Tensor:
    """softmax(τ q̂ · k̂) V over each query's retrieved slots; 0 for a query with none.

    q_hat: [B, H, N, D]; keys, values: [B, C, H, D]; idx, ok: [B, H, N, K]; scale: [H]. -> [B, H, N, D]
    """
    b, h = q_hat.shape[:2]
    rows = torch.arange(b, device=idx.device).view(b, 1, 1, 1)
    heads = torch.arange(h, device=idx.device).view(1, h, 1, 1)
    empty = ~ok[..., None]  # [B, H, N, K, 1]: padding picks of a query with fewer than K valid slots
    k_ret = keys[rows, idx, heads].masked_fill(empty, 0.0)  # [B, H, N, K, D]; whatever an empty slot
    v_ret = values[rows, idx, heads].masked_fill(empty, 0.0)  # holds cannot reach outputs or gradients
    logits = einsum(q_hat, k_ret, "b h n d, b h n k d -> b h n k") * scale.view(1, h, 1, 1)
    logits = logits.masked_fill(~ok, float("-inf"))
    any_ok = ok.any(dim=-1, keepdim=True)  # [B, H, N, 1]
    weights = torch.softmax(logits.masked_fill(~any_ok, 0.0), dim=-1) * any_ok  # all-masked rows -> 0
    return einsum(weights, v_ret, "b h n k, b h n k d -> b h n d")


@register_memory("memorizing", config=MemorizingConfig)
class MemorizingXL(LayerMemory):
    """A layer of the Memorizing Transformer without the store: attention over [XL cache; segment]."""

    gradient_through_state = False  # XL caches and the kNN store are stop-gradient by design
    # folders saved before the option: no window, where beyond_window changes nothing (hashed as absent)
    legacy_options = {"beyond_window": True}

    def __init__(self, cfg: MemorizingConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if int(cfg.mem_len) < 0:
            raise ValueError(f"memorizing mem_len={cfg.mem_len}; expected an int >= 0")
        if int(cfg.store_size) < 1:
            raise ValueError(f"memorizing store_size={cfg.store_size}; expected a positive int")
        if int(cfg.top_k) < 1:
            raise ValueError(f"memorizing top_k={cfg.top_k}; expected a positive int")
        if cfg.knn_backend not in BACKENDS:
            raise ValueError(f"memorizing knn_backend={cfg.knn_backend!r}; expected one of {BACKENDS}")
        knn_layer_index(cfg, model)  # validates knn_layer
        self.n_heads, self.d_head = model.n_heads, model.d_head

    @classmethod
    def for_layer(cls, cfg: MemorizingConfig, model: ModelConfig, layer_index: int) -> LayerMemory:
        """The kNN layer at `knn_layer`, an XL-cache layer everywhere else."""
        if layer_index == knn_layer_index(cfg, model):
            return MemorizingKNN(cfg, model, layer_index)
        return MemorizingXL(cfg, model, layer_index)

    @classmethod
    def lookback(cls, cfg: MemorizingConfig, model: ModelConfig) -> list[int]:
        """Every layer's XL cache (behind the window's W - 1 with beyond_window); the kNN layer's store of
        the last store_size positions beside it."""
        out = [int(cfg.mem_len) + cls.delay(cfg, model)] * model.n_layers
        knn = knn_layer_index(cfg, model)
        out[knn] = max(out[knn], int(cfg.store_size))
        return out

    @classmethod
    def footprint(cls, cfg: MemorizingConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Fixed-size buffers: store keys+values at one layer, XL keys+values in every layer."""
        per_slot = (model.d_head + model.d_head) * model.n_heads  # (d_key + d_value) × H
        store = per_slot * cfg.store_size
        caches = per_slot * cfg.mem_len * model.n_layers
        delay = per_slot * cls.delay(cfg, model) * model.n_layers
        parts = {"total": store + caches + delay, "store": store, "xl_caches": caches}
        return parts | ({"window_delay": delay} if delay else {})

    @classmethod
    def delay(cls, cfg: MemorizingConfig, model: ModelConfig) -> int:
        """Slots of each XL cache's delay line: W - 1 with the window and beyond_window (and a cache), else 0."""
        return beyond_window_delay(model.attention_span, cfg.beyond_window and int(cfg.mem_len) > 0, cls.uses_window)

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """An empty XL cache: cache_k, cache_v [B, C, H, D] (the policy's state dtype), cache_valid [B, C],
        C = mem_len plus the delay line."""
        shapes = kv_slot_shapes(self.n_heads, self.d_head)
        capacity = self.cfg.mem_len + self.delay(self.cfg, self.model_cfg)
        return prefixed("cache_", fifo_init(batch_size, capacity, shapes, device, self.state_dtype()))

    def reset_rows(self, state: State, rows: Tensor) -> State:
        """A document start empties the row's buffers (every `*valid` mask cleared for that row)."""
        return fifo_reset(state, rows)

    def local(self, x: SegmentInputs, state: State) -> tuple[Tensor, State]:
        """Causal attention over [XL cache; segment] with RoPE, then push the segment (SG) into the cache."""
        cache, delay = substate(state, "cache_"), self.delay(self.cfg, self.model_cfg)
        prefix = shifted(kv_prefix(delayed(cache, self.cfg.mem_len, delay)), delay)  # behind the window's W - 1
        out = x.attend(x.q, x.k, x.v, prefix=prefix)  # [B, H, N, D]: the filled slots only
        cache, _ = push_kv(cache, x.k, x.v)
        return out, {**state, **prefixed("cache_", cache)}

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """One segment of an XL-cache layer."""
        out, state = self.local(x, state)
        return out, state, zero_loss(x.q)


class MemorizingKNN(MemorizingXL):
    """The kNN-augmented layer: XL-cache attention gated with top-k attention over a FIFO store."""

    def __init__(self, cfg: MemorizingConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.knn_backend == "faiss":
            import_faiss()  # fail at build time, not mid-run
        scale = math.sqrt(model.d_head) if cfg.scale_init is None else float(cfg.scale_init)
        self.gate = HeadGate(model.n_heads, cfg.gate_init, cfg.gate_lr_mult, cfg.gate_weight_decay)  # b per head
        self.log_scale = nn.Parameter(torch.full((model.n_heads,), math.log(scale)))  # log τ, one per head
        self.optim_overrides = {"log_scale": {"lr_mult": float(cfg.scale_lr_mult), "weight_decay": 0.0}}

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """XL cache plus an empty store: store_k (unit keys), store_v [B, store_size, H, D], store_valid."""
        shapes = {"k": (self.n_heads, self.d_head), "v": (self.n_heads, self.d_head)}
        store = fifo_init(batch_size, self.cfg.store_size, shapes, device, self.state_dtype(), lazy=True)  # O(1)
        return {**super().initial_state(batch_size, device), **prefixed("store_", store)}

    def gate_values(self) -> Tensor:
        """sigmoid(b) per head: 0 = local only, 1 = memory only."""
        return self.gate.values()

    def search(self, q_hat: Tensor, store: State) -> tuple[Tensor, Tensor]:
        """Top-k slot indices (into `store`) and their validity for each query: 2 x [B, H, N, k']."""
        fn = knn_faiss if self.cfg.knn_backend == "faiss" else knn_exact
        return fn(q_hat, store["k"], store["valid"], self.cfg.top_k)

    def read(self, q: Tensor, store: State) -> Tensor:
        """A_mem from the store as it was before this segment: q [B, H, N, D] -> [B, H, N, D] (policy dtype)."""
        dtype = self.working_dtype(q)
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_hat = l2_normalise(q.to(dtype))  # no positional encoding on the memory path
            store = filled(store)  # [B, F, H, D]: the search costs the filled slots, not store_size
            probe("memorizing.read", layer=self.layer_index, q_hat=q_hat, keys=store["k"])  # what the search compares
            idx, ok = self.search(q_hat, store)
            return attend_retrieved(q_hat, store["k"], store["v"], idx, ok, self.log_scale.to(dtype).exp())

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """Read the store (state_{s-1}), local attention over [cache; segment], gate, then write."""
        store = substate(state, "store_")
        a_mem = self.read(x.q, store)  # [B, H, N, D]
        a_dot, state = self.local(x, state)  # [B, H, N, D]
        out = self.gate(a_mem, a_dot)  # [B, H, N, D]

        dtype = self.working_dtype(x.k)
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            new = {
                "k": l2_normalise(rearrange(x.k, "b h n d -> b n h d").detach().to(dtype)),  # [B, N, H, D]
                "v": rearrange(x.v, "b h n d -> b n h d").detach().to(dtype),
            }
            store = fifo_push_filled(store, new)  # write after read; keep the newest store_size slots
        return out, {**state, **prefixed("store_", store)}, zero_loss(x.q)
