"""ARMT: Associative Recurrent Memory Transformer (Rodkin, Kuratov, Bulatov, Burtsev 2024, arXiv 2407.04841).

Per layer l and batch row an associative matrix A [d_key, d_model] and a normaliser z [d_key]; the
carried state is {A, z} of every layer. m learned memory tokens M [m, d_model], the same for every
segment (not recurrent), are appended at the END of each segment:

    X̃_s = [X_s ; M]                                         [N + m, d_model]   (causal mask)

so the memory tokens see the whole segment and no segment token sees them; logits only at the N
token positions. With φ = DPFP-ν (x ← [relu(x), relu(−x)]; φ(x) = concat_{j=1..ν} x ⊙ roll(x, j);
d_key = 2ν·d_mem), at every layer l, on the layer's input h (all N + m positions):

    read:   h ← h + A φ(W_Q h) / (zᵀ φ(W_Q h) + ε)                     (skipped while empty)

and from the same layer's output at the m memory-token positions m_1..m_m (Eqs. 1–3), all m
tokens written at once from the same A, z (the paper's batched sum, as the authors' code):

    k_i = φ(W_K m_i),   v_i = W_V m_i,   β_i = sigmoid(W_β m_i)        (β_i: one scalar per token)
    v̄_i = A k_i / (zᵀ k_i + ε)                                         (what A returns for k_i)
    γ_i = clip(1 − (zᵀ k_i + ε) / (‖k_i‖² + ε), 0, 1), detached         (the normaliser's correction)
    A  ← A + Σ_i β_i (v_i − v̄_i) ⊗ k_i
    z  ← z + Σ_i γ_i k_i                                                (z is NOT weighted by β)

Not in the paper (`write_norm`, default none): `rms` takes k, v and β from the memory tokens' outputs
scaled to unit RMS, m̂ = m / sqrt(mean(m²) + 1e-6), bounding the read -> write loop (the `distance`
suite's diagnosis); `rms-kv` takes k and v from m̂ and β from m.
ε = 1e-5 (`eps`) where the authors' single-head code has it (the paper writes the ratios bare).
Not in the paper (`norm_floor`, 0 restores it): the read's and v̄'s denominators are at least
‖φ‖² (a written key has zᵀk >= ‖k‖², so this never binds at one); without it a query whose DPFP
features z does not cover reads A φ / ε, and training diverged (README, "ARMT's denominator").
Empty memory (a row's first segment, and after a reset): the read is skipped (h unchanged) and
the write takes v̄_i = 0 and γ_i = 1, exactly the authors' first-segment branch. W_V starts at
zero, so A stays 0 and the memory is silent until W_V learns (`w_v_init_std` > 0 only for tests and
ablations). Gradient flows through A and z across the segments of a BPTT block (only γ is
detached). A and z are float32 under autocast (float64 if the model is). The backbone calls
`before_layer` (the read) and `after_layer` (the write) around each block; `leave` marks the rows
written. Probes (memzoo.core.probe, for measures that look inside): `armt.read` (φ(q), A, z, the read)
and `armt.write` (A, z, k, v, β before the write).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import einsum, repeat
from torch import Tensor, nn

from memzoo.core.config import ModelConfig
from memzoo.core.memory import ModelMemory, State
from memzoo.core.plugins import register_memory
from memzoo.core.probe import probe


@dataclass
class ARMTConfig:
    n_mem_tokens: int = 10  # m: learned memory tokens appended to every segment
    d_mem: int = 64  # width of W_Q h and W_K m before φ; d_key = 2 ν d_mem
    nu: int = 3  # ν of DPFP-ν
    init_std: float = 0.02  # std of the memory tokens (the backbone's embedding std, as the authors scale them)
    eps: float = 1e-5  # ε in the read's and v̄'s denominators and in γ (the authors' code)
    w_v_init_std: float = 0.0  # 0: W_V starts at zero (the paper's silent start); > 0: normal(0, std), tests/ablations
    # Not in the paper: every ratio's denominator is at least norm_floor x ‖φ‖² (0 = the paper's and the
    # authors' bare zᵀφ + ε). A written key always has zᵀk >= ‖k‖², so 1 never binds at a written key;
    # it stops the 1/ε blow-up of a query whose features z does not cover (zᵀφ = 0 exactly under DPFP).
    norm_floor: float = 1.0
    # Not in the paper: every ratio's denominator is also at least cos_floor x ‖z‖ ‖φ‖ (0 = off), i.e. a
    # query is read as if at least cos_floor-aligned with z. A read whose features z does not cover is
    # otherwise A φ / ‖φ‖², loud as 1/‖φ‖ for small features; this caps it at |A| / (cos_floor ‖z‖) whatever
    # the features' scale. It binds at a written key only where cos(z, k) < cos_floor.
    cos_floor: float = 0.0
    # Not in the paper: "rms" writes from the memory tokens' outputs scaled to unit RMS per token (no
    # learned gain), so k and v no longer grow with what the read added to the residual stream: the
    # read -> write loop through the memory tokens has no gain in scale. "rms-kv": k and v from the
    # scaled outputs, β from the raw ones (β is in [0, 1] whatever the scale, and a large output
    # can still shut it exactly). "none" is the paper.
    write_norm: str = "none"


WRITE_NORMS = ("none", "rms", "rms-kv")


def unit_rms(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x²) + eps) over the last dim: the memory tokens' outputs at a fixed scale."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def dpfp(x: Tensor, nu: int) -> Tensor:
    """DPFP-ν features: [..., d] -> [..., 2 ν d], every entry >= 0: φ[(j−1)·2d + p] = r_p r_{(p−j) mod 2d},
    r = [relu(x), relu(−x)], j = 1..ν (the ν rolls of r as one gather: two kernels, not 2ν + 1)."""
    r = torch.cat((F.relu(x), F.relu(-x)), dim=-1)  # [..., 2d]
    n = r.shape[-1]
    rolled = r[..., _roll_index(nu, n, r.device)].unflatten(-1, (nu, n))  # [..., ν, 2d]: r_{(p−j) mod 2d}
    return (r[..., None, :] * rolled).flatten(-2)  # [..., 2νd]


_ROLLS: dict[tuple[int, int, str], Tensor] = {}


def _roll_index(nu: int, n: int, device: torch.device) -> Tensor:
    """(p − j) mod n for j = 1..ν, p = 0..n−1, flattened j-major ([ν n], cached per device)."""
    key = (nu, n, str(device))
    if key not in _ROLLS:
        j, p = torch.arange(1, nu + 1)[:, None], torch.arange(n)[None, :]
        _ROLLS[key] = ((p - j) % n).flatten().to(device)
    return _ROLLS[key]


class AssociativeLayer(nn.Module):
    """One layer's ARMT projections: W_Q, W_K (d_model -> d_mem), W_V (d_model -> d_model), W_β (d_model -> 1)."""

    def __init__(self, d_model: int, d_mem: int, w_v_init_std: float):
        super().__init__()
        self.W_Q = nn.Linear(d_model, d_mem, bias=False)
        self.W_K = nn.Linear(d_model, d_mem, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_beta = nn.Linear(d_model, 1)
        with torch.no_grad():
            if w_v_init_std > 0:
                self.W_V.weight.normal_(0.0, w_v_init_std)
            else:
                self.W_V.weight.zero_()  # the memory starts silent


def denominator(phi: Tensor, z: Tensor, eps: float, floor: float, cos_floor: float = 0.0) -> Tensor:
    """max(zᵀ φ + ε, floor · ‖φ‖², cos_floor · ‖z‖ ‖φ‖) per position. phi: [B, T, d_key], z: [B, d_key] -> [B, T, 1]."""
    den = einsum(phi, z, "b t k, b k -> b t")[..., None] + eps  # one scalar per position
    if floor > 0:
        den = torch.maximum(den, floor * phi.square().sum(-1, keepdim=True))
    if cos_floor > 0:
        den = torch.maximum(den, cos_floor * z.norm(dim=-1)[:, None, None] * phi.norm(dim=-1, keepdim=True))
    return den


def associative_read(phi_q: Tensor, A: Tensor, z: Tensor, eps: float, floor: float = 0.0, cos_floor: float = 0.0) -> Tensor:
    """A φ(q) / `denominator`. phi_q: [B, T, d_key], A: [B, d_key, d_model], z: [B, d_key] -> [B, T, d_model]."""
    num = einsum(phi_q, A, "b t k, b k d -> b t d")
    return num / denominator(phi_q, z, eps, floor, cos_floor)


def associative_write(A: Tensor, z: Tensor, k: Tensor, v: Tensor, beta: Tensor, empty: Tensor,
                      eps: float, floor: float = 0.0, cos_floor: float = 0.0) -> tuple[Tensor, Tensor]:
    """Eqs. 1–3 for all m tokens at once from the same A, z.

    A: [B, d_key, d_model], z: [B, d_key], k = φ(W_K m): [B, m, d_key], v = W_V m: [B, m, d_model],
    beta: [B, m, 1], empty: [B] bool (v̄ = 0, γ = 1 there). v̄'s denominator is floored as the read's
    (`denominator`); γ keeps the paper's bare zᵀk + ε. Returns (A', z').
    """
    zk = einsum(k, z, "b m k, b k -> b m")[..., None]  # [B, m, 1] zᵀ k_i
    v_bar = einsum(k, A, "b m k, b k d -> b m d") / denominator(k, z, eps, floor, cos_floor)  # [B, m, d_model]
    gamma = (1 - (zk + eps) / (k.square().sum(-1, keepdim=True) + eps)).clamp(0.0, 1.0).detach()  # [B, m, 1]
    rows = empty[:, None, None]  # [B, 1, 1]
    v_bar = torch.where(rows, torch.zeros_like(v_bar), v_bar)
    gamma = torch.where(rows, torch.ones_like(gamma), gamma)
    A = A + einsum(beta * (v - v_bar), k, "b m d, b m k -> b k d")
    z = z + (gamma * k).sum(dim=1)
    return A, z


@register_memory("armt", config=ARMTConfig)
class AssociativeRecurrentMemory(ModelMemory):
    """[tokens; memory tokens] through the decoder; each layer reads A, z at its input and writes them from its output."""

    gradient_through_state = True
    legacy_options = {"write_norm": "none", "cos_floor": 0.0}  # folders saved before the options: the paper's write, no cos floor

    def __init__(self, cfg: ARMTConfig, model: ModelConfig):
        super().__init__(cfg, model)
        for name in ("n_mem_tokens", "d_mem", "nu"):
            if int(getattr(cfg, name)) < 1:
                raise ValueError(f"armt {name}={getattr(cfg, name)}; expected a positive int")
        if not cfg.eps > 0:
            raise ValueError(f"armt eps={cfg.eps}; expected > 0 (it keeps the empty and zero-key ratios finite)")
        if not cfg.norm_floor >= 0:
            raise ValueError(f"armt norm_floor={cfg.norm_floor}; expected >= 0 (0 = the paper's bare denominator)")
        if not cfg.cos_floor >= 0:
            raise ValueError(f"armt cos_floor={cfg.cos_floor}; expected >= 0 (0 = off, the paper)")
        if cfg.write_norm not in WRITE_NORMS:
            raise ValueError(f"armt write_norm={cfg.write_norm!r}; expected one of {WRITE_NORMS} ('none' = the paper)")
        self.write_norm = cfg.write_norm
        self.m, self.nu, self.eps, self.floor = int(cfg.n_mem_tokens), int(cfg.nu), float(cfg.eps), float(cfg.norm_floor)
        self.cos_floor = float(cfg.cos_floor)
        self.d_key = 2 * self.nu * int(cfg.d_mem)
        d = model.d_model
        self.mem_tokens = nn.Parameter(torch.randn(self.m, d) * cfg.init_std)  # M [m, d_model]
        self.layers = nn.ModuleList(AssociativeLayer(d, int(cfg.d_mem), float(cfg.w_v_init_std))
                                    for _ in range(model.n_layers))

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """A = 0, z = 0 in every layer, and no row written yet."""
        state: State = {"written": torch.zeros(batch_size, dtype=torch.bool, device=device)}  # [B]
        dtype = self.state_dtype()  # the precision policy: float32 under autocast, float64 in a float64 model
        for i in range(self.model_cfg.n_layers):
            state[f"A.{i}"] = torch.zeros(batch_size, self.d_key, self.model_cfg.d_model, device=device, dtype=dtype)  # [B, d_key, d]
            state[f"z.{i}"] = torch.zeros(batch_size, self.d_key, device=device, dtype=dtype)  # [B, d_key]
        return state

    @classmethod
    def footprint(cls, cfg: ARMTConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Per layer d_key × d_model + d_key = 2ν·d_mem·(d_model + 1), independent of length."""
        return {"total": 2 * int(cfg.nu) * int(cfg.d_mem) * (model.d_model + 1) * model.n_layers}

    def enter(self, x: Tensor, state: State) -> tuple[Tensor, Tensor]:
        """x [B, N, d] -> ([x; M] [B, N + m, d], token_mask [N + m])."""
        b, n, _ = x.shape
        mem = repeat(self.mem_tokens.to(x.dtype), "m d -> b m d", b=b)  # [B, m, d]
        token_mask = torch.zeros(n + self.m, dtype=torch.bool, device=x.device)
        token_mask[:n] = True
        return torch.cat((x, mem), dim=1), token_mask

    def before_layer(self, index: int, x: Tensor, state: State) -> Tensor:
        """The read at layer `index`'s input, every position: x + A φ(W_Q x) / (zᵀ φ(W_Q x) + ε); rows never written unchanged."""
        written = state["written"]  # [B]
        if not bool(written.any()):
            return x  # every row empty: skip the read
        layer = self.layers[index]
        with torch.autocast(device_type=x.device.type, enabled=False):
            h = x.to(self.working_dtype(x))
            phi_q = dpfp(F.linear(h, layer.W_Q.weight.to(h.dtype)), self.nu)  # [B, N', d_key]
            A, z = state[f"A.{index}"].to(h.dtype), state[f"z.{index}"].to(h.dtype)
            read = associative_read(phi_q, A, z, self.eps, self.floor, self.cos_floor)  # [B, N', d]
            read = torch.where(written[:, None, None], read, torch.zeros_like(read))
            # the read's inputs and output, for a measure of what the denominator does (experiments/precision)
            probe("armt.read", layer=index, phi=phi_q, A=A, z=z, eps=self.eps, floor=self.floor, read=read)
        return x + read.to(x.dtype)

    def after_layer(self, index: int, x: Tensor, state: State) -> State:
        """The write from layer `index`'s output at the m memory-token positions (Eqs. 1–3)."""
        layer = self.layers[index]
        with torch.autocast(device_type=x.device.type, enabled=False):
            mem = x[:, -self.m :].to(self.working_dtype(x))  # [B, m, d] the memory tokens' outputs
            kv_in = mem if self.write_norm == "none" else unit_rms(mem)  # [B, m, d] (unit RMS: not in the paper)
            beta_in = kv_in if self.write_norm == "rms" else mem  # [B, m, d]
            w = lambda lin: lin.weight.to(mem.dtype)  # noqa: E731
            k = dpfp(F.linear(kv_in, w(layer.W_K)), self.nu)  # [B, m, d_key]
            v = F.linear(kv_in, w(layer.W_V))  # [B, m, d]
            beta = torch.sigmoid(F.linear(beta_in, w(layer.W_beta), layer.W_beta.bias.to(mem.dtype)))  # [B, m, 1]
            A, z = state[f"A.{index}"].to(mem.dtype), state[f"z.{index}"].to(mem.dtype)
            empty = ~state["written"]  # [B]
            probe("armt.write", layer=index, A=A, z=z, k=k, v=v, beta=beta, empty=empty, eps=self.eps, floor=self.floor,
                  cos_floor=self.cos_floor)
            A, z = associative_write(A, z, k, v, beta, empty, self.eps, self.floor, self.cos_floor)
        return {**state, f"A.{index}": A, f"z.{index}": z}

    def leave(self, h: Tensor, state: State) -> State:
        """Every layer has written: no row is empty any more."""
        return {**state, "written": torch.ones_like(state["written"])}
