"""∞-former (Martins, Marinho, Martins 2021, arXiv 2109.00301): short-term plus continuous long-term memory.

Two memories per layer and batch row, as the paper and the authors' code have them:

* short-term memory (STM): the layer's normed inputs h of the last `mem_len` positions, as in
  Transformer-XL, attended exactly together with the segment (keys and values recomputed with the
  layer's current W_K, W_V, as the authors' `cat = torch.cat([mems[-mem_len:], w])`);
* long-term memory (LTM): a continuous signal fed only with the states that LEAVE the STM (the
  authors' `mems[:-mem_len]`); its read is added to the STM attention's output.

    A = softmax(Q [K(stm); K]ᵀ / √D + causal mask) [V(stm); V] + z        (per head, before W_O)
    stm, evicted = last mem_len of [stm; SG(h_s)], the states pushed out     (FIFO, memzoo.core.fifo)
    B_s = write(B_{s-1}, evicted)                                         (only if something left)

`mem_len = 0` is the LTM alone, fed with every segment (the segment's own attention plus z).

The long-term signal. The past inputs X (L × d_model) are a signal over t ∈ [0, 1] written with N
Gaussian radial basis functions ψ_i(t) = N(t; μ_i, σ_i²):

    X(t) ≈ Bᵀ ψ(t),        B = (Ψ Ψᵀ + λ I)⁻¹ Ψ X          (ridge regression; B is [N, d_model])

which is the paper's B = Xᵀ Ψᵀ (Ψ Ψᵀ + λI)⁻¹ stored transposed (one row per basis function).
Centres μ_i are evenly spaced in [0, 1], one set per width in `basis_widths` (N split evenly).
With `ridge_padding` (authors' code) the Gram matrix also counts zero-valued positions outside
[0, 1]: Ψ Ψᵀ + Ψ_pad Ψ_padᵀ + λI, so the signal is pulled to 0 beyond the ends.

Write (L new vectors): sample the old signal at M points s_m = m / M, contract them to τ s_m ∈
[0, τ], place the new vectors at τ + (1 − τ) j / L ∈ (τ, 1], refit:

    B_s = (Ψ Ψᵀ + λI)⁻¹ Ψ [Ψ(s)ᵀ B_{s-1} ; X_s] = A B_{s-1} + G X_s

A (N × N, the contraction) and G (N × L) depend only on L, so both are precomputed.

Read (segment s, from B_{s-1}), per head h with query q (no positional encoding):

    K_h = B W_K^h,  V_h = B W_V^h                                   ([N, D] each)
    μ = sigmoid(w_μᵀ K_h q / √D),  σ² = softplus(w_σᵀ K_h q / √D)    (w_μ, w_σ ∈ R^N)
    z = E_{t ~ N(μ, σ²)}[V_hᵀ ψ(t)] = V_hᵀ r,   r_i = ∫ N(t; μ, σ²) N(t; μ_i, σ_i²) dt = N(μ; μ_i, σ² + σ_i²)

Choices where the paper is silent or where we follow the authors' code (also in the card):
* STM: caches h (d_model per slot, the authors' `mems`), not keys/values: the LTM needs the evicted
  h anyway, so a key/value cache carries both. `cache: kv` (an explicit deviation, as xl.py's option)
  does: each STM slot also keeps the key (pre-RoPE) and value the layer attended, which the STM's
  attention reads in place of re-projected ones (2·H·D more numbers a slot, in "total"; "table1" stays
  the card's count; W_K, W_V then learn nothing through the STM's slots). It is there for backbones
  whose keys are not a function of one hidden state (model.qk_conv: memzoo.core.qk_conv), where
  re-projected keys miss; the LTM is unchanged. It needs an STM (mem_len > 0).
  Positions: RoPE over [STM; segment] relative to the segment's first token, STM slot i of C at
  i − C, as xl.py. Empty slots (document start, reset rows) are masked. Gradient stops at the STM
  (with cache=hidden W_K, W_V learn through its slots).
* Until the STM is full nothing leaves it, so the LTM stays empty (it reads 0); a segment may evict
  fewer than L states (STM not yet full, mem_len not a multiple of L, a row reset mid-batch), and
  the write then uses that row's own count of new vectors. A document reset empties both memories.
* r is the closed form over the whole real line (as the authors' ContinuousSoftmax), not the
  integral over [0, 1]; the density is not renormalised to [0, 1].
* w_μ, w_σ ∈ R^N are shared by the heads of a layer; σ² is clamped below at `sigma_sq_min`; the
  scores K_h q are scaled by 1/√D (authors' code).
* `kv_weights="own"` (default): W_K, W_V are the memory's own projections (authors' code);
  `"layer"`: the layer's own W_K, W_V through `project_kv(B)` (no extra parameters).
* Empty memory (nothing written since the document started): the read is z = 0 and it adds no KL
  term. The first write of a document fits its new vectors alone, at t_j = (j − ½) / L over the
  whole [0, 1] (authors' code), not to a zero past.
* Gradient stops at the state (`gradient_through_state = False`): B and the STM are carried
  detached, as the authors' code does (`B_past.detach()`), so the read trains W_K, W_V, w_μ, w_σ
  and the queries, and no gradient reaches past segments through the memory.
* Sticky memories (option): the M sample points follow the current segment's read densities
  (summed over heads and queries, histogram of `sticky_bins` bins over [0, 1]); we take them
  deterministically at the quantiles (m − ½) / M of that histogram (the paper samples at random),
  so streaming equals one call. The fit then has per-row positions and is solved per row.
* KL regulariser (option): KL(N(μ, σ²) ‖ N(μ₀, σ₀²)) = ½ (σ²/σ₀² − log(σ²/σ₀²) − 1 + (μ − μ₀)²/σ₀²),
  the μ term only when `kl_mu_0` is set (authors' code); averaged over every non-empty read of the
  call and multiplied by `kl_weight`; returned as the auxiliary loss.
* The ridge solves run in float64; the state and the read follow the precision policy (float32
  whatever the autocast dtype, float64 in a float64 model).

Backbone window (model.attention_span = W > 0, memzoo.core.window): the window's keys are prepended
to the [STM; segment] attention. With mem_len > 0, `beyond_window` (default True) makes the STM hold
what has LEFT the window, as xl.py's option does: mem_len positions -(W-1)-mem_len .. -W, the W - 1
newest waiting in a never-attended delay line (the footprint's "window_delay"); what the STM evicts
enters the LTM as before, W - 1 positions later. beyond_window=False keeps the STM as without a
window (its newest W - 1 then repeat the window's keys). mem_len = 0 has no STM and no delay line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.core.config import ModelConfig
from memzoo.core.fifo import (delayed, fifo_init, fifo_push, hidden_prefix, kv_prefix, kv_slot_numbers, kv_slot_shapes,
                              kv_slots, shifted)
from memzoo.core.memory import LayerInputs, LayerMemory, SegmentInputs, State, zero_loss
from memzoo.core.plugins import register_memory
from memzoo.core.window import beyond_window_delay

KV_WEIGHTS = ("own", "layer")
CACHES = ("hidden", "kv")
STM_KEYS = {"h": "stm", "k": "stm_k", "v": "stm_v", "valid": "stm_valid"}  # FIFO name -> state key
ProjectKV = Callable[[Tensor], tuple[Tensor, Tensor]]


@dataclass
class InftyFormerConfig:
    mem_len: int = 2048  # L_STM: positions in the short-term memory (paper: as long as the segment; 0 = none)
    beyond_window: bool = True  # with model.attention_span W > 0: the STM holds what has left the window
    cache: str = "hidden"  # hidden (the paper) | kv: STM slots also keep the keys and values the layer attended
    n_basis: int = 512  # N Gaussian RBFs (split evenly over basis_widths)
    basis_widths: list[float] = field(default_factory=lambda: [0.01, 0.05])  # σ_i of the RBFs
    tau: float = 0.75  # τ: the old signal is contracted into [0, τ]
    ridge_lambda: float = 0.5  # λ of the ridge regression
    ridge_padding: bool = True  # zero-valued positions outside [0, 1] in the fit (authors' code)
    n_samples: int = 512  # M points at which the old signal is sampled at each write
    kv_weights: str = "own"  # own | layer: W_K, W_V of the memory, or the layer's (project_kv)
    sigma_sq_min: float = 1e-6  # lower clamp of σ² (authors' code)
    sticky_memories: bool = False  # sample the old signal where the reads were dense
    sticky_bins: int = 64  # D histogram bins over [0, 1] for sticky memories
    kl_weight: float = 0.0  # weight of the KL regulariser (0 = off)
    kl_sigma_0: float = 0.05  # prior width σ₀ (authors' config)
    kl_mu_0: Optional[float] = None  # prior mean μ₀ (None: no μ term, authors' default)


# --- the continuous signal ------------------------------------------------------------------


def rbf_basis(n_basis: int, widths: list[float]) -> tuple[Tensor, Tensor]:
    """Centres μ_i [N] (evenly spaced in [0, 1], one set per width) and widths σ_i [N]."""
    if n_basis < len(widths) or n_basis % len(widths):
        raise ValueError(f"infty-former n_basis={n_basis} must be a positive multiple of len(basis_widths)={len(widths)}")
    centres = torch.linspace(0.0, 1.0, n_basis // len(widths), dtype=torch.float64)
    mu, sigma = torch.meshgrid(centres, torch.tensor(widths, dtype=torch.float64), indexing="ij")
    return mu.flatten(), sigma.flatten()


def gaussian(t: Tensor, mu: Tensor, var: Tensor) -> Tensor:
    """N(t; μ, var), broadcasting."""
    return torch.exp(-0.5 * (t - mu) ** 2 / var) / torch.sqrt(2 * math.pi * var)


def basis_matrix(t: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """Ψ: ψ_i(t_p) for positions t [..., P] -> [..., N, P]."""
    return gaussian(t[..., None, :], mu[:, None], sigma[:, None] ** 2)


def pad_positions(count: int) -> Tensor:
    """Zero-valued positions around a fit of `count` points (authors' padding): ⌈count/2⌉ evenly
    spaced in (−½, 0) and as many in (1, 1½), about the fit's own spacing -> [2⌈count/2⌉]."""
    n = -(-count // 2)
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / (2 * n)  # [n] in (0, ½)
    return torch.cat((u - 0.5, 1.0 + u))


def ridge_operator(psi: Tensor, lam: float, psi_pad: Optional[Tensor] = None) -> Tensor:
    """G = (Ψ Ψᵀ + Ψ_pad Ψ_padᵀ + λI)⁻¹ Ψ for Ψ [..., N, P] -> [..., N, P], so that B = G X.

    Ψ_pad [N, P'] (optional) are positions whose target is 0: they enter the Gram matrix only.
    """
    n = psi.shape[-2]
    gram = psi @ psi.transpose(-1, -2) + lam * torch.eye(n, dtype=psi.dtype, device=psi.device)
    if psi_pad is not None:
        gram = gram + psi_pad @ psi_pad.transpose(-1, -2)
    return torch.linalg.solve(gram, psi)


def ridge_fit(x: Tensor, t: Tensor, mu: Tensor, sigma: Tensor, lam: float, pad: Optional[Tensor] = None) -> Tensor:
    """B = argmin ‖Ψᵀ B − X‖² + ‖Ψ_padᵀ B − 0‖² + λ‖B‖² for X [..., P, d] at positions t [..., P]
    (and zero targets at positions `pad` [P'], if given) -> [..., N, d]."""
    psi_pad = None if pad is None else basis_matrix(pad.to(t.device), mu, sigma)
    return ridge_operator(basis_matrix(t, mu, sigma), lam, psi_pad) @ x


def signal(b: Tensor, t: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """X(t) = Bᵀ ψ(t): B [..., N, d], t [..., P] -> [..., P, d]."""
    return basis_matrix(t, mu, sigma).transpose(-1, -2) @ b


def expected_basis(mean: Tensor, var: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """r_i = ∫_R N(t; μ, σ²) ψ_i(t) dt = N(μ; μ_i, σ² + σ_i²): mean, var [...] -> [..., N]."""
    return gaussian(mean[..., None], mu, var[..., None] + sigma**2)


def first_positions(length: int) -> Tensor:
    """Where the first write of a document puts its L vectors: (j − ½) / L over [0, 1]."""
    return (torch.arange(length, dtype=torch.float64) + 0.5) / length


def new_positions(length: int, tau: float) -> Tensor:
    """Where a later write puts its L new vectors: τ + (1 − τ) j / L, j = 1..L, in (τ, 1]."""
    return tau + (1 - tau) * torch.arange(1, length + 1, dtype=torch.float64) / length


def sample_positions(n_samples: int) -> Tensor:
    """Where the old signal is sampled (before contraction by τ): m / M, m = 1..M."""
    return torch.arange(1, n_samples + 1, dtype=torch.float64) / n_samples


def sticky_positions(mean: Tensor, var: Tensor, n_samples: int, n_bins: int) -> Tensor:
    """Sticky memories: M positions in [0, 1] dense where the reads' densities were.

    mean, var: [B, R] (all heads' and queries' Gaussians of one row) -> [B, M], sorted. Bin mass
    p(d_j) ∝ Σ_r ∫_{d_j} N(t; μ_r, σ_r²) dt; positions are the histogram's quantiles (m − ½) / M.
    """
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=mean.dtype, device=mean.device)  # [D+1]
    std = var.sqrt()[..., None]
    cdf_r = 0.5 * (1 + torch.erf((edges - mean[..., None]) / (std * math.sqrt(2))))  # [B, R, D+1]
    mass = (cdf_r[..., 1:] - cdf_r[..., :-1]).sum(dim=1) + 1e-8  # [B, D]
    mass = mass / mass.sum(dim=-1, keepdim=True)
    cdf = F.pad(torch.cumsum(mass, dim=-1), (1, 0))  # [B, D+1], cdf[:, 0] = 0
    u = (torch.arange(n_samples, dtype=mean.dtype, device=mean.device) + 0.5) / n_samples  # [M]
    u = u.expand(mean.shape[0], -1).contiguous()
    j = torch.searchsorted(cdf[:, 1:].contiguous(), u).clamp(max=n_bins - 1)  # bin of each quantile
    lo, p = cdf.gather(1, j), mass.gather(1, j)
    return ((j + (u - lo) / p) / n_bins).clamp(0.0, 1.0)


def kl_to_prior(mean: Tensor, var: Tensor, sigma_0: float, mu_0: Optional[float]) -> Tensor:
    """KL(N(μ, σ²) ‖ N(μ₀, σ₀²)) elementwise; without μ₀ only the width term."""
    ratio = var / sigma_0**2
    kl = 0.5 * (ratio - torch.log(ratio) - 1)
    if mu_0 is not None:
        kl = kl + 0.5 * (mean - mu_0) ** 2 / sigma_0**2
    return kl


# --- the plugin -----------------------------------------------------------------------------


@register_memory("infty-former", config=InftyFormerConfig)
class InftyFormer(LayerMemory):
    """Attention over [short-term memory; segment] plus a continuous read of what left the STM."""

    gradient_through_state = False  # B is carried detached (authors' code)
    # folders saved before the options (hashed as absent): no window (beyond_window changes nothing), an STM of h
    legacy_options = {"beyond_window": True, "cache": "hidden"}

    def __init__(self, cfg: InftyFormerConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.kv_weights not in KV_WEIGHTS:
            raise ValueError(f"infty-former kv_weights={cfg.kv_weights!r}; expected one of {KV_WEIGHTS}")
        if cfg.cache not in CACHES:
            raise ValueError(f"infty-former cache={cfg.cache!r}; expected one of {CACHES}")
        if cfg.cache == "kv" and cfg.mem_len == 0:
            raise ValueError("infty-former cache='kv' with mem_len=0; cache=kv keeps keys in the short-term memory, "
                             "so it needs mem_len > 0 (mem_len=0 has none: use cache='hidden')")
        if not 0.0 < cfg.tau < 1.0:
            raise ValueError(f"infty-former tau={cfg.tau}; expected 0 < tau < 1")
        if cfg.n_samples < 1 or cfg.ridge_lambda <= 0 or cfg.kl_sigma_0 <= 0 or cfg.sticky_bins < 1:
            raise ValueError("infty-former needs n_samples >= 1, ridge_lambda > 0, kl_sigma_0 > 0, sticky_bins >= 1")
        if isinstance(cfg.mem_len, bool) or not isinstance(cfg.mem_len, int) or cfg.mem_len < 0:
            raise ValueError(f"infty-former mem_len={cfg.mem_len!r}; expected an int >= 0 (0: no short-term memory)")
        self.n_heads, self.d_head, self.d_model = model.n_heads, model.d_head, model.d_model
        mu, sigma = rbf_basis(cfg.n_basis, list(cfg.basis_widths))
        self.register_buffer("basis_mu", mu, persistent=False)  # [N] float64
        self.register_buffer("basis_sigma", sigma, persistent=False)  # [N] float64
        bound = 1.0 / math.sqrt(cfg.n_basis)  # as nn.Linear(N, 1) in the authors' code
        self.w_mu = nn.Parameter(torch.empty(cfg.n_basis).uniform_(-bound, bound))  # w_μ [N]
        self.w_sigma = nn.Parameter(torch.empty(cfg.n_basis).uniform_(-bound, bound))  # w_σ [N]
        if cfg.kv_weights == "own":
            self.w_k = nn.Linear(model.d_model, model.d_inner, bias=False)  # W_K (all heads): d_model -> H x D
            self.w_v = nn.Linear(model.d_model, model.d_inner, bias=False)  # W_V (all heads): d_model -> H x D
            for lin in (self.w_k, self.w_v):
                nn.init.normal_(lin.weight, 0.0, 0.02)
        self._operators: dict[tuple[int, str], tuple[Tensor, Tensor, Tensor]] = {}

    # -- state --

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """LTM: B [B, N, d] and `written` [B]; STM (mem_len > 0): `stm` [B, C, d] and `stm_valid` [B, C]
        (C = mem_len plus the delay line), with cache=kv also `stm_k`, `stm_v` [B, C, H, D]."""
        state = {
            "B": torch.zeros(batch_size, self.cfg.n_basis, self.d_model, device=device, dtype=self.state_dtype()),  # [B, N, d]
            "written": torch.zeros(batch_size, dtype=torch.bool, device=device),  # [B] anything stored yet
        }
        if self.cfg.mem_len > 0:
            capacity = self.cfg.mem_len + self.delay(self.cfg, self.model_cfg)
            kv = kv_slot_shapes(self.n_heads, self.d_head) if self.cfg.cache == "kv" else {}
            slots = {"h": (self.d_model,)} | kv  # [B, C, d] (and [B, C, H, D] each)
            stm = fifo_init(batch_size, capacity, slots, device, self.state_dtype())
            state |= {STM_KEYS[name]: t for name, t in stm.items()}
        return state

    def _stm(self, state: State) -> State:
        """The STM's FIFO as memzoo.core.fifo reads it: {h[, k, v], valid}."""
        return {name: state[key] for name, key in STM_KEYS.items() if key in state}

    @classmethod
    def footprint(cls, cfg: InftyFormerConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """B (n_basis × d_model) plus the STM's mem_len slots (a hidden state, d_model, and with cache=kv a key
        and a value, 2·H·D), per layer, and the STM's delay line behind the window ("window_delay")."""
        slot = model.d_model + (kv_slot_numbers(model.n_heads, model.d_head) if cfg.cache == "kv" else 0)
        long_term = cfg.n_basis * model.d_model * model.n_layers
        short_term = cfg.mem_len * slot * model.n_layers
        delay = cls.delay(cfg, model) * slot * model.n_layers
        table1 = (cfg.n_basis + cfg.mem_len) * model.d_model * model.n_layers  # the card's count: hidden states
        parts = {"total": long_term + short_term + delay, "long_term": long_term, "short_term": short_term,
                 "table1": table1}
        return parts | ({"window_delay": delay} if delay else {})

    @classmethod
    def delay(cls, cfg: InftyFormerConfig, model: ModelConfig) -> int:
        """The STM's delay line: W - 1 slots with the window, beyond_window and an STM, else 0."""
        return beyond_window_delay(model.attention_span, cfg.beyond_window and cfg.mem_len > 0, cls.uses_window)

    # -- write --

    def operators(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """Precomputed for L new vectors: (G_first [N, L], A [N, N], G_new [N, L]), in `dtype`.

        First write: B = G_first X. Later writes: B_s = A B_{s-1} + G_new X, where
        [G_past | G_new] = (ΨΨᵀ + λI)⁻¹ Ψ over positions [τ s_m ; τ + (1 − τ) j / L] and
        A = G_past Ψ(s)ᵀ (sample the old signal at s_m, refit it at τ s_m).
        """
        key = (length, str(device), dtype)
        if key not in self._operators:
            with torch.inference_mode(False), torch.no_grad():
                self._operators[key] = self._build_operators(length, device, dtype)
        return self._operators[key]

    def _build_operators(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """The three operators of `operators`, solved in float64 on the CPU."""
        cfg, mu, sigma = self.cfg, self.basis_mu.cpu(), self.basis_sigma.cpu()
        g_first = ridge_operator(basis_matrix(first_positions(length), mu, sigma), cfg.ridge_lambda, self._pad_basis(length))
        s = sample_positions(cfg.n_samples)
        t = torch.cat((cfg.tau * s, new_positions(length, cfg.tau)))  # [M + L]
        g = ridge_operator(basis_matrix(t, mu, sigma), cfg.ridge_lambda, self._pad_basis(len(t)))  # [N, M + L]
        g_past, g_new = g[:, : cfg.n_samples], g[:, cfg.n_samples :]
        contract = g_past @ basis_matrix(s, mu, sigma).T  # [N, N]: old B -> its samples -> refit
        return tuple(o.to(device=device, dtype=dtype) for o in (g_first, contract, g_new))

    def _pad(self, count: int) -> Optional[Tensor]:
        """The zero-valued padding positions of a fit of `count` points, or None without padding."""
        return pad_positions(count) if self.cfg.ridge_padding else None

    def _pad_basis(self, count: int) -> Optional[Tensor]:
        """Ψ_pad [N, P'] at `_pad(count)` (CPU, float64), or None."""
        pad = self._pad(count)
        return None if pad is None else basis_matrix(pad, self.basis_mu.cpu(), self.basis_sigma.cpu())

    def write(self, b_old: Tensor, written: Tensor, x: Tensor, sticky: Optional[Tensor]) -> Tensor:
        """B_s from B_{s-1} [B, N, d] and the segment's inputs x [B, L, d]; sticky [B, M] positions or None."""
        g_first, contract, g_new = self.operators(x.shape[1], x.device, x.dtype)
        first = g_first @ x  # [B, N, d]
        if sticky is None:
            later = contract @ b_old + g_new @ x
        else:
            cfg, mu, sigma = self.cfg, self.basis_mu, self.basis_sigma
            s = sticky.double()  # [B, M]
            x_past = signal(b_old.double(), s, mu, sigma)  # [B, M, d]: old signal at s_m
            new = new_positions(x.shape[1], cfg.tau).to(x.device).expand(s.shape[0], -1)
            t = torch.cat((cfg.tau * s, new), dim=1)  # [B, M + L]
            pad = self._pad(t.shape[1])
            later = ridge_fit(torch.cat((x_past, x.double()), dim=1), t, mu, sigma, cfg.ridge_lambda, pad).to(x.dtype)
        return torch.where(written[:, None, None], later, first)

    # -- read --

    def keys_values(self, b: Tensor, project_kv: ProjectKV) -> tuple[Tensor, Tensor]:
        """K = B W_K, V = B W_V per head: B [B, N, d_model] -> 2 × [B, H, N, D] (B's dtype)."""
        if self.cfg.kv_weights == "layer":
            k, v = project_kv(b)
            return k.to(b.dtype), v.to(b.dtype)
        split = lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.n_heads)  # noqa: E731
        return split(F.linear(b, self.w_k.weight.to(b.dtype))), split(F.linear(b, self.w_v.weight.to(b.dtype)))

    def read(self, q: Tensor, b: Tensor, project_kv: ProjectKV) -> tuple[Tensor, Tensor, Tensor]:
        """z = E_{N(μ, σ²)}[V(t)] per query: q [B, H, n, D], B [B, N, d] -> (z [B, H, n, D], μ, σ² [B, H, n])."""
        k, v = self.keys_values(b, project_kv)  # [B, H, N, D]
        scores = einsum(q, k, "b h n d, b h i d -> b h n i") / math.sqrt(self.d_head)  # K_h q: [B, H, n, N]
        dtype = scores.dtype  # the precision policy's (step casts q and B)
        mean = torch.sigmoid(scores @ self.w_mu.to(dtype))  # μ [B, H, n]
        var = F.softplus(scores @ self.w_sigma.to(dtype)).clamp(min=self.cfg.sigma_sq_min)  # σ² [B, H, n]
        r = expected_basis(mean, var, self.basis_mu.to(dtype), self.basis_sigma.to(dtype))  # [B, H, n, N]
        return einsum(r, v, "b h n i, b h i d -> b h n d"), mean, var

    def write_evicted(self, b_old: Tensor, written: Tensor, evicted: Tensor, counts: Tensor,
                      sticky: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """B_s and `written` after the STM evicted counts[b] states in row b: the last counts[b] of
        evicted [B, L, d] (oldest first). A row that evicted nothing keeps B_{s-1}."""
        b_new = b_old
        for e in sorted(set(counts.tolist()) - {0}):  # rows evict different counts only at edges
            b_e = self.write(b_old, written, evicted[:, evicted.shape[1] - e :], sticky)  # [B, N, d]
            b_new = torch.where((counts == e)[:, None, None], b_e, b_new)
        return b_new, written | (counts > 0)

    # -- one segment, and S of them --

    def long_term(self, q: Tensor, x_new: Tensor, counts: Optional[Tensor], project_kv: ProjectKV,
                  state: State) -> tuple[Tensor, State, Tensor, Tensor]:
        """Read from B_{s-1}, then write B_s. q [B, H, n, D], x_new [B, L, d] (policy dtype): the states
        entering the LTM, all of them (counts None) or the last counts [B] of each row.

        Returns (z [B, H, n, D], LTM state_s, KL sum, number of reads that count).
        """
        b_old, written = state["B"], state["written"]
        z, mean, var = self.read(q, b_old, project_kv)
        z = torch.where(written[:, None, None, None], z, torch.zeros_like(z))  # empty memory reads 0
        kl_sum, kl_count = zero_loss(q), q.new_zeros(())
        if self.cfg.kl_weight > 0:
            kl = kl_to_prior(mean, var, self.cfg.kl_sigma_0, self.cfg.kl_mu_0)  # [B, H, n]
            kl_sum = (kl * written[:, None, None]).sum()
            kl_count = written.sum() * kl[0].numel()
        sticky = None
        if self.cfg.sticky_memories:
            flat = lambda t: t.detach().double().flatten(1)  # noqa: E731  [B, H * n]
            sticky = sticky_positions(flat(mean), flat(var), self.cfg.n_samples, self.cfg.sticky_bins)
        with torch.no_grad():  # the state is carried detached, so the write needs no graph
            if counts is None:
                b_new, written_new = self.write(b_old, written, x_new, sticky), torch.ones_like(written)
            else:
                b_new, written_new = self.write_evicted(b_old, written, x_new, counts, sticky)
        new_state = {"B": b_new.detach(), "written": written_new}  # gradient stops at the state
        return z, new_state, kl_sum, kl_count

    def short_term(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor, Tensor]:
        """Attention over [STM; segment], then push the segment into the STM.

        Returns (heads [B, H, N, D], STM state_s, evicted h [B, N, d], evicted counts [B]).
        """
        stm = self._stm(state)  # h [B, C, d] (k, v [B, C, H, D] with cache=kv), valid [B, C]
        delay = self.delay(self.cfg, self.model_cfg)  # the newest W - 1 are the window's: not attended
        attended = delayed(stm, self.cfg.mem_len, delay)
        kv = self.cfg.cache == "kv"
        prefix = kv_prefix(attended) if kv else hidden_prefix(attended, x.project_kv, x.h.dtype)
        out = x.attend(x.q, x.k, x.v, prefix=shifted(prefix, delay))  # [B, H, N, D]; slot i at i − F − delay
        new = {"h": x.h.detach()} | (kv_slots(x.k, x.v) if kv else {})  # [B, N, d] (and [B, N, H, D] each)
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            kept, evicted = fifo_push(stm, new)  # cast to the STM's dtype
        # valid slots are a time-ordered suffix, so each row's evicted states are the last count of `evicted`
        kept = {STM_KEYS[name]: t for name, t in kept.items()}
        return out, kept, evicted["h"], evicted["valid"].sum(dim=1)

    def step(self, x: SegmentInputs, state: State, a_dot: Optional[Tensor] = None) -> tuple[Tensor, State, Tensor, Tensor]:
        """One segment: [STM; segment] attention (or the given local attention when mem_len = 0) plus
        the read from B_{s-1}; then the STM push and the LTM write. Returns (heads, state_s, KL sum, count)."""
        if self.cfg.mem_len > 0:
            a_dot, stm, x_new, counts = self.short_term(x, state)
        else:
            a_dot = x.attend(x.q, x.k, x.v) if a_dot is None else a_dot  # [B, H, N, D]
            stm, x_new, counts = {}, x.h, None  # every segment enters the LTM
        dtype = self.working_dtype(x.q)  # the precision policy: float32 under autocast, float64 stays
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            z, ltm, kl_sum, kl_count = self.long_term(x.q.to(dtype), x_new.to(dtype), counts, x.project_kv, state)
        return a_dot + z.to(a_dot.dtype), {**ltm, **stm}, kl_sum, kl_count

    def _aux(self, kl_sum: Tensor, kl_count: Tensor) -> Tensor:
        """kl_weight × mean KL over the reads that had a memory (0 if none, or if the KL is off)."""
        if self.cfg.kl_weight <= 0:
            return kl_sum
        return self.cfg.kl_weight * kl_sum / kl_count.clamp(min=1)

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """One segment: attention over [STM; segment] + read from B_{s-1}; then write."""
        out, state, kl_sum, kl_count = self.step(x, state)
        return out, state, self._aux(kl_sum, kl_count)

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        s = x.q.shape[1]
        # without an STM the segments' own attention does not depend on the state: all S at once
        a_dot = x.local_attention() if self.cfg.mem_len == 0 else None  # [B, S, H, N, D]
        outs, kl_sum, kl_count = [], zero_loss(x.q), x.q.new_zeros(())
        for i in range(s):
            state = self.reset_rows(state, x.reset[:, i])
            out, state, seg_sum, seg_count = self.step(x.segment(i), state, None if a_dot is None else a_dot[:, i])
            outs.append(out)
            kl_sum, kl_count = kl_sum + seg_sum, kl_count + seg_count
        return torch.stack(outs, dim=1), state, self._aux(kl_sum, kl_count)  # [B, S, H, N, D]
