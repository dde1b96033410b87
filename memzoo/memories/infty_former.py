"""∞-former (Martins, Marinho, Martins 2021, arXiv 2109.00301): a continuous long-term memory.

Per layer and batch row, the past inputs X (L × d_model; here the layer's normed input h) are a
signal over t ∈ [0, 1] written with N Gaussian radial basis functions ψ_i(t) = N(t; μ_i, σ_i²):

    X(t) ≈ Bᵀ ψ(t),        B = (Ψ Ψᵀ + λ I)⁻¹ Ψ X          (ridge regression; B is [N, d_model])

which is the paper's B = Xᵀ Ψᵀ (Ψ Ψᵀ + λI)⁻¹ stored transposed (one row per basis function).
Centres μ_i are evenly spaced in [0, 1], one set per width in `basis_widths` (N split evenly).

Write (after segment s, of L vectors): sample the old signal at M points s_m = m / M, contract
them to τ s_m ∈ [0, τ], place the new vectors at τ + (1 − τ) j / L ∈ (τ, 1], refit:

    B_s = (Ψ Ψᵀ + λI)⁻¹ Ψ [Ψ(s)ᵀ B_{s-1} ; X_s] = A B_{s-1} + G X_s

A (N × N, the contraction) and G (N × L) depend only on L, so both are precomputed.

Read (segment s, from B_{s-1}), per head h with query q (no positional encoding):

    K_h = B W_K^h,  V_h = B W_V^h                                   ([N, D] each)
    μ = sigmoid(w_μᵀ K_h q / √D),  σ² = softplus(w_σᵀ K_h q / √D)    (w_μ, w_σ ∈ R^N)
    z = E_{t ~ N(μ, σ²)}[V_hᵀ ψ(t)] = V_hᵀ r,   r_i = ∫ N(t; μ, σ²) N(t; μ_i, σ_i²) dt = N(μ; μ_i, σ² + σ_i²)

and z is added to local causal attention, per head, before W_O.

Choices where the paper is silent or where we follow the authors' code (also in the card):
* r is the closed form over the whole real line (as the authors' ContinuousSoftmax), not the
  integral over [0, 1]; the density is not renormalised to [0, 1].
* w_μ, w_σ ∈ R^N are shared by the heads of a layer; σ² is clamped below at `sigma_sq_min`; the
  scores K_h q are scaled by 1/√D (authors' code).
* `kv_weights="own"` (default): W_K, W_V are the memory's own projections (authors' code);
  `"layer"`: the layer's own W_K, W_V through `project_kv(B)` (no extra parameters).
* Empty memory (nothing written since the document started): the read is z = 0 (the output is
  local attention alone) and it adds no KL term. The first write of a document fits B to the L
  new vectors alone, at t_j = (j − ½) / L over the whole [0, 1] (authors' code), not to a zero past.
* Gradient stops at the state (`gradient_through_state = False`): B is carried detached, as the
  authors' code does (`B_past.detach()`), so the read trains W_K, W_V, w_μ, w_σ and the queries,
  and no gradient reaches past segments through the memory.
* Sticky memories (option): the M sample points follow the current segment's read densities
  (summed over heads and queries, histogram of `sticky_bins` bins over [0, 1]); we take them
  deterministically at the quantiles (m − ½) / M of that histogram (the paper samples at random),
  so streaming equals one call. The fit then has per-row positions and is solved per row.
* KL regulariser (option): KL(N(μ, σ²) ‖ N(μ₀, σ₀²)) = ½ (σ²/σ₀² − log(σ²/σ₀²) − 1 + (μ − μ₀)²/σ₀²),
  the μ term only when `kl_mu_0` is set (authors' code); averaged over every non-empty read of the
  call and multiplied by `kl_weight`; returned as the auxiliary loss.
* The ridge solves run in float64 and the state is float32 whatever the autocast dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.config import ModelConfig
from memzoo.memory import LayerInputs, LayerMemory, SegmentInputs, State, zero_loss
from memzoo.plugins import register_memory

KV_WEIGHTS = ("own", "layer")
ProjectKV = Callable[[Tensor], tuple[Tensor, Tensor]]


@dataclass
class InftyFormerConfig:
    n_basis: int = 512  # N Gaussian RBFs (split evenly over basis_widths)
    basis_widths: list[float] = field(default_factory=lambda: [0.01, 0.05])  # σ_i of the RBFs
    tau: float = 0.75  # τ: the old signal is contracted into [0, τ]
    ridge_lambda: float = 0.5  # λ of the ridge regression
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


def ridge_operator(psi: Tensor, lam: float) -> Tensor:
    """G = (Ψ Ψᵀ + λI)⁻¹ Ψ for Ψ [..., N, P] -> [..., N, P], so that B = G X."""
    n = psi.shape[-2]
    gram = psi @ psi.transpose(-1, -2) + lam * torch.eye(n, dtype=psi.dtype, device=psi.device)
    return torch.linalg.solve(gram, psi)


def ridge_fit(x: Tensor, t: Tensor, mu: Tensor, sigma: Tensor, lam: float) -> Tensor:
    """B = argmin ‖Ψᵀ B − X‖² + λ‖B‖² for X [..., P, d] at positions t [..., P] -> [..., N, d]."""
    return ridge_operator(basis_matrix(t, mu, sigma), lam) @ x


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
    """Local attention plus a continuous-attention read over an RBF signal of the whole past."""

    gradient_through_state = False  # B is carried detached (authors' code)

    def __init__(self, cfg: InftyFormerConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.kv_weights not in KV_WEIGHTS:
            raise ValueError(f"infty-former kv_weights={cfg.kv_weights!r}; expected one of {KV_WEIGHTS}")
        if not 0.0 < cfg.tau < 1.0:
            raise ValueError(f"infty-former tau={cfg.tau}; expected 0 < tau < 1")
        if cfg.n_samples < 1 or cfg.ridge_lambda <= 0 or cfg.kl_sigma_0 <= 0 or cfg.sticky_bins < 1:
            raise ValueError("infty-former needs n_samples >= 1, ridge_lambda > 0, kl_sigma_0 > 0, sticky_bins >= 1")
        self.n_heads, self.d_head, self.d_model = model.n_heads, model.d_head, model.d_model
        mu, sigma = rbf_basis(cfg.n_basis, list(cfg.basis_widths))
        self.register_buffer("basis_mu", mu, persistent=False)  # [N] float64
        self.register_buffer("basis_sigma", sigma, persistent=False)  # [N] float64
        bound = 1.0 / math.sqrt(cfg.n_basis)  # as nn.Linear(N, 1) in the authors' code
        self.w_mu = nn.Parameter(torch.empty(cfg.n_basis).uniform_(-bound, bound))  # w_μ [N]
        self.w_sigma = nn.Parameter(torch.empty(cfg.n_basis).uniform_(-bound, bound))  # w_σ [N]
        if cfg.kv_weights == "own":
            self.w_k = nn.Linear(model.d_model, model.d_model, bias=False)  # W_K (all heads)
            self.w_v = nn.Linear(model.d_model, model.d_model, bias=False)  # W_V (all heads)
            for lin in (self.w_k, self.w_v):
                nn.init.normal_(lin.weight, 0.0, 0.02)
        self._operators: dict[tuple[int, str], tuple[Tensor, Tensor, Tensor]] = {}

    # -- state --

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        return {
            "B": torch.zeros(batch_size, self.cfg.n_basis, self.d_model, device=device, dtype=torch.float32),  # [B, N, d]
            "written": torch.zeros(batch_size, dtype=torch.bool, device=device),  # [B] anything stored yet
        }

    @classmethod
    def footprint(cls, cfg: InftyFormerConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        return {"total": cfg.n_basis * model.d_model * model.n_layers}  # B: n_basis × d_model per layer

    # -- write --

    def operators(self, length: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """Precomputed for L new vectors: (G_first [N, L], A [N, N], G_new [N, L]), float32.

        First write: B = G_first X. Later writes: B_s = A B_{s-1} + G_new X, where
        [G_past | G_new] = (ΨΨᵀ + λI)⁻¹ Ψ over positions [τ s_m ; τ + (1 − τ) j / L] and
        A = G_past Ψ(s)ᵀ (sample the old signal at s_m, refit it at τ s_m).
        """
        key = (length, str(device))
        if key not in self._operators:
            with torch.inference_mode(False), torch.no_grad():
                self._operators[key] = self._build_operators(length, device)
        return self._operators[key]

    def _build_operators(self, length: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The three operators of `operators`, solved in float64 on the CPU."""
        cfg, mu, sigma = self.cfg, self.basis_mu.cpu(), self.basis_sigma.cpu()
        g_first = ridge_operator(basis_matrix(first_positions(length), mu, sigma), cfg.ridge_lambda)
        s = sample_positions(cfg.n_samples)
        t = torch.cat((cfg.tau * s, new_positions(length, cfg.tau)))  # [M + L]
        g = ridge_operator(basis_matrix(t, mu, sigma), cfg.ridge_lambda)  # [N, M + L]
        g_past, g_new = g[:, : cfg.n_samples], g[:, cfg.n_samples :]
        contract = g_past @ basis_matrix(s, mu, sigma).T  # [N, N]: old B -> its samples -> refit
        return tuple(o.to(device=device, dtype=torch.float32) for o in (g_first, contract, g_new))

    def write(self, b_old: Tensor, written: Tensor, x: Tensor, sticky: Optional[Tensor]) -> Tensor:
        """B_s from B_{s-1} [B, N, d] and the segment's inputs x [B, L, d]; sticky [B, M] positions or None."""
        g_first, contract, g_new = self.operators(x.shape[1], x.device)
        first = g_first @ x  # [B, N, d]
        if sticky is None:
            later = contract @ b_old + g_new @ x
        else:
            cfg, mu, sigma = self.cfg, self.basis_mu, self.basis_sigma
            s = sticky.double()  # [B, M]
            x_past = signal(b_old.double(), s, mu, sigma)  # [B, M, d]: old signal at s_m
            new = new_positions(x.shape[1], cfg.tau).to(x.device).expand(s.shape[0], -1)
            t = torch.cat((cfg.tau * s, new), dim=1)  # [B, M + L]
            later = ridge_fit(torch.cat((x_past, x.double()), dim=1), t, mu, sigma, cfg.ridge_lambda).float()
        return torch.where(written[:, None, None], later, first)

    # -- read --

    def keys_values(self, b: Tensor, project_kv: ProjectKV) -> tuple[Tensor, Tensor]:
        """K = B W_K, V = B W_V per head: B [B, N, d_model] -> 2 × [B, H, N, D] (float32)."""
        if self.cfg.kv_weights == "layer":
            k, v = project_kv(b)
            return k.float(), v.float()
        split = lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.n_heads)  # noqa: E731
        return split(F.linear(b, self.w_k.weight.float())), split(F.linear(b, self.w_v.weight.float()))

    def read(self, q: Tensor, b: Tensor, project_kv: ProjectKV) -> tuple[Tensor, Tensor, Tensor]:
        """z = E_{N(μ, σ²)}[V(t)] per query: q [B, H, n, D], B [B, N, d] -> (z [B, H, n, D], μ, σ² [B, H, n])."""
        k, v = self.keys_values(b, project_kv)  # [B, H, N, D]
        scores = einsum(q, k, "b h n d, b h i d -> b h n i") / math.sqrt(self.d_head)  # K_h q: [B, H, n, N]
        mean = torch.sigmoid(scores @ self.w_mu.float())  # μ [B, H, n]
        var = F.softplus(scores @ self.w_sigma.float()).clamp(min=self.cfg.sigma_sq_min)  # σ² [B, H, n]
        r = expected_basis(mean, var, self.basis_mu.float(), self.basis_sigma.float())  # [B, H, n, N]
        return einsum(r, v, "b h n i, b h i d -> b h n d"), mean, var

    # -- one segment, and S of them --

    def long_term(self, q: Tensor, h: Tensor, project_kv: ProjectKV, state: State) -> tuple[Tensor, State, Tensor, Tensor]:
        """Read from B_{s-1}, then write B_s. q [B, H, n, D], h [B, n, d] (float32).

        Returns (z [B, H, n, D], state_s, KL sum, number of reads that count).
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
            b_new = self.write(b_old, written, h, sticky)
        new_state = {"B": b_new.detach(), "written": torch.ones_like(written)}  # gradient stops at the state
        return z, new_state, kl_sum, kl_count

    def _aux(self, kl_sum: Tensor, kl_count: Tensor) -> Tensor:
        """kl_weight × mean KL over the reads that had a memory (0 if none, or if the KL is off)."""
        if self.cfg.kl_weight <= 0:
            return kl_sum
        return self.cfg.kl_weight * kl_sum / kl_count.clamp(min=1)

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """One segment: local attention + read from B_{s-1}; then write B_s."""
        a_dot = x.attend(x.q, x.k, x.v)  # [B, H, n, D]
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            z, state, kl_sum, kl_count = self.long_term(x.q.float(), x.h.float(), x.project_kv, state)
        return a_dot + z.to(a_dot.dtype), state, self._aux(kl_sum, kl_count)

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        s = x.q.shape[1]
        a_dot = x.local_attention()  # [B, S, H, N, D]: all segments at once
        reads, kl_sum, kl_count = [], zero_loss(x.q), x.q.new_zeros(())
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            for i in range(s):
                state = self.reset_rows(state, x.reset[:, i])
                z, state, seg_sum, seg_count = self.long_term(x.q[:, i].float(), x.h[:, i].float(), x.project_kv, state)
                reads.append(z)
                kl_sum, kl_count = kl_sum + seg_sum, kl_count + seg_count
        out = a_dot + torch.stack(reads, dim=1).to(a_dot.dtype)  # [B, S, H, N, D]: z added before W_O
        return out, state, self._aux(kl_sum, kl_count)
