"""ARMT against Eqs. 1–3 written out token by token (memzoo.memories.reference), in float64 on values
and gradients; γ clipped and detached, z not weighted by β, W_V zero at initialisation (a silent
memory), the read skipped while empty; the whole model against a naive loop around the backbone's
blocks (where the hooks sit), with and without activation checkpointing; the footprint."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.core.config import ModelConfig
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory
from memzoo.memories.armt import ARMTConfig, AssociativeRecurrentMemory, associative_write, dpfp
from memzoo.memories.reference import armt_read_reference, armt_write_reference, dpfp_reference
from memzoo.conformance.catalog import card_footprint, get_card

B, M, D, D_MEM, NU, EPS = 2, 3, 12, 4, 3, 1e-5
D_KEY = 2 * NU * D_MEM


def plugin(**options) -> AssociativeRecurrentMemory:
    """An ARMT memory for a 2-layer d=12 model, float64, nonzero W_V (the write has something to write)."""
    torch.manual_seed(0)
    cfg = ARMTConfig(**{"n_mem_tokens": M, "d_mem": D_MEM, "nu": NU, "w_v_init_std": 0.3, **options})
    return AssociativeRecurrentMemory(cfg, tiny_model_config(d_model=D, n_heads=2)).double()


def random_state(mem: AssociativeRecurrentMemory, seed: int, z_scale: float = 0.05, written=(True, False)):
    """A, z of layer 0 drawn at random (z >= 0, as a sum of γ φ(k) is), rows written as given."""
    g = torch.Generator().manual_seed(seed)
    state = mem.initial_state(B, torch.device("cpu"))
    state = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    state["A.0"] = torch.randn(B, D_KEY, D, generator=g, dtype=torch.float64).requires_grad_()
    state["z.0"] = (z_scale * torch.rand(B, D_KEY, generator=g, dtype=torch.float64)).requires_grad_()
    state["written"] = torch.tensor(written)
    return state


def outputs(seed: int, t: int = M) -> torch.Tensor:
    return torch.randn(B, t, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64, requires_grad=True)


def write_ref(mem, state, x):
    layer = mem.layers[0]
    return armt_write_reference(state["A.0"], state["z.0"], x[:, -mem.m :], layer.W_K.weight, layer.W_V.weight,
                                layer.W_beta.weight[0], layer.W_beta.bias[0], NU, EPS, ~state["written"], mem.floor,
                                write_norm=mem.write_norm, cos_floor=mem.cos_floor)


def gammas(mem, state, x) -> torch.Tensor:
    """The unclipped γ of every memory token of layer 0: [B, m]."""
    with torch.no_grad():
        k = dpfp(mem.layers[0].W_K(x[:, -mem.m :]), NU)
        zk = torch.einsum("bmk,bk->bm", k, state["z.0"])
        return 1 - (zk + EPS) / (k.square().sum(-1) + EPS)


def test_dpfp_is_the_reference_feature_map() -> None:
    x = torch.randn(5, 7, dtype=torch.float64)
    for nu in (1, 2, 3):
        phi = dpfp(x, nu)
        assert phi.shape == (5, 2 * nu * 7) and bool((phi >= 0).all())
        assert torch.equal(phi, torch.stack([dpfp_reference(row, nu) for row in x]))


@pytest.mark.parametrize("write_norm", ["none", "rms", "rms-kv"])
@pytest.mark.parametrize("floor", [0.0, 1.0], ids=["paper", "floored"])
@pytest.mark.parametrize("z_scale", [0.05, 0.2, 3.0], ids=["small-z", "gamma-mixed", "gamma-all-clipped"])
def test_write_matches_equations_values_and_gradients(z_scale: float, floor: float, write_norm: str) -> None:
    """after_layer == Eqs. 1–3 token by token (one written row, one empty row); gradients to the
    memory tokens' outputs, A, z and W_K, W_V, W_β agree, with the paper's bare denominators and floored,
    from the raw outputs (the paper), from unit-RMS outputs (write_norm rms) and with β alone from the
    raw ones (rms-kv)."""
    mem = plugin(norm_floor=floor, write_norm=write_norm)
    x = outputs(1, t=5)  # 2 segment positions, then the m = 3 memory tokens
    state = random_state(mem, 2, z_scale)
    new = mem.after_layer(0, x, state)
    ref_a, ref_z = write_ref(mem, state, x)
    assert torch.allclose(new["A.0"], ref_a, rtol=1e-12, atol=1e-12)
    assert torch.allclose(new["z.0"], ref_z, rtol=1e-12, atol=1e-12)
    assert set(new) == set(state) and new["A.1"] is state["A.1"]  # the other layer untouched

    layer = mem.layers[0]
    wa, wz = torch.randn_like(ref_a), torch.randn_like(ref_z)
    wrt = (x, state["A.0"], state["z.0"], layer.W_K.weight, layer.W_V.weight, layer.W_beta.weight, layer.W_beta.bias)
    got = torch.autograd.grad((new["A.0"] * wa).sum() + (new["z.0"] * wz).sum(), wrt)
    want = torch.autograd.grad((ref_a * wa).sum() + (ref_z * wz).sum(), wrt)
    for name, g, r in zip("x A z W_K W_V W_beta b_beta".split(), got, want):
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12), f"gradient to {name} differs from the equations'"


def test_rms_write_does_not_grow_with_the_residual_stream() -> None:
    """write_norm rms: memory-token outputs 1,000 times larger (a read that grew the residual stream)
    write exactly what they wrote before; the paper's write grows (k with the square, v linearly).
    rms-kv: the keys (so z) do not grow either; only β, which stays in [0, 1], sees the scale."""
    x = outputs(3, t=5)
    mem = plugin(write_norm="rms-kv")
    state = random_state(mem, 4)
    assert torch.allclose(mem.after_layer(0, x, state)["z.0"], mem.after_layer(0, 1000 * x, state)["z.0"], rtol=1e-4, atol=1e-4)
    for write_norm, same in (("rms", True), ("none", False)):
        mem = plugin(write_norm=write_norm)
        state = random_state(mem, 4)
        small, large = mem.after_layer(0, x, state), mem.after_layer(0, 1000 * x, state)
        assert torch.allclose(small["A.0"], large["A.0"], rtol=1e-4, atol=1e-4) is same, write_norm
        assert torch.allclose(small["z.0"], large["z.0"], rtol=1e-4, atol=1e-4) is same, write_norm


def test_norm_floor_never_binds_at_a_written_key() -> None:
    """Writes keep zᵀk ≥ ‖k‖² for every key written (γ tops z up to it, entries are ≥ 0): after two
    writes, reading at the written keys gives the paper's ratio exactly with the floor on."""
    from memzoo.memories.armt import associative_read
    g = torch.Generator().manual_seed(5)
    A, z = torch.zeros(B, D_KEY, D, dtype=torch.float64), torch.zeros(B, D_KEY, dtype=torch.float64)
    keys = []
    for first in (True, False):
        k = dpfp(torch.randn(B, M, D_MEM, generator=g, dtype=torch.float64), NU)  # [B, m, d_key]
        v, beta = torch.randn(B, M, D, generator=g, dtype=torch.float64), torch.full((B, M, 1), 0.7, dtype=torch.float64)
        A, z = associative_write(A, z, k, v, beta, torch.full((B,), first), EPS, floor=1.0)
        keys.append(k)
    k = torch.cat(keys, dim=1)  # [B, 2m, d_key]
    assert bool((torch.einsum("bmk,bk->bm", k, z) + EPS >= k.square().sum(-1) * (1 - 1e-12)).all())
    assert torch.allclose(associative_read(k, A, z, EPS, 1.0), associative_read(k, A, z, EPS, 0.0), rtol=1e-12, atol=0)


def test_norm_floor_bounds_a_query_z_does_not_cover() -> None:
    """A query whose DPFP features miss z's support (zᵀφ = 0, possible since φ ≥ 0 is sparse) while A
    holds them: the paper's ratio reads A φ / ε; the floor reads A φ / ‖φ‖². This is what made the
    quick suite's ARMT diverge (README)."""
    from memzoo.memories.armt import associative_read
    half = D_KEY // 2
    z = torch.zeros(1, D_KEY, dtype=torch.float64)
    z[:, :half] = 1.0
    A = torch.randn(1, D_KEY, D, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    phi = torch.zeros(1, 1, D_KEY, dtype=torch.float64)
    phi[..., half:] = 0.5
    num = torch.einsum("btk,bkd->btd", phi, A)
    assert torch.allclose(associative_read(phi, A, z, EPS, 0.0), num / EPS, rtol=1e-12)
    assert torch.allclose(associative_read(phi, A, z, EPS, 1.0), num / phi.square().sum(), rtol=1e-12)
    with pytest.raises(ValueError, match="norm_floor"):
        plugin(norm_floor=-1.0)


@pytest.mark.parametrize("floor", [0.0, 1.0], ids=["bare", "norm-floored"])
def test_cos_floor_matches_the_reference_and_reads_at_any_feature_scale(floor: float) -> None:
    """With cos_floor the denominators are max(zᵀφ + ε, floor ‖φ‖², cos_floor ‖z‖ ‖φ‖): the read and the
    write agree with the token-by-token reference in float64 (values and gradients); a query z does not
    cover reads the same at any scale of its features (at most |A| / (cos_floor ‖z‖)), where the norm
    floor alone reads louder as the features shrink (A φ / ‖φ‖²: 10 times at 1/10 the scale)."""
    from memzoo.memories.armt import associative_read
    mem = plugin(norm_floor=floor, cos_floor=0.3)
    state, x = random_state(mem, 11, z_scale=0.5), outputs(12)
    layer = mem.layers[0]
    got = mem.after_layer(0, x, state)
    ref_a, ref_z = write_ref(mem, state, x)
    assert torch.allclose(got["A.0"], ref_a, rtol=1e-10, atol=1e-12) and torch.allclose(got["z.0"], ref_z, rtol=1e-10)
    h = outputs(13, t=5)
    read = mem.before_layer(0, h, state)
    ref = armt_read_reference(h, state["A.0"], state["z.0"], layer.W_Q.weight, NU, EPS, ~state["written"], floor, 0.3)
    assert torch.allclose(read, ref, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad((read * ref.detach().sin()).sum() + (got["A.0"] * ref_a.detach().cos()).sum(),
                                [state["A.0"], state["z.0"], x, h])
    grads_ref = torch.autograd.grad((ref * ref.detach().sin()).sum() + (ref_a * ref_a.detach().cos()).sum(),
                                    [state["A.0"], state["z.0"], x, h])
    for g, r in zip(grads, grads_ref):
        assert torch.allclose(g, r, rtol=1e-8, atol=1e-10)
    half = D_KEY // 2  # a query on the features z does not hold
    z = torch.zeros(1, D_KEY, dtype=torch.float64)
    z[:, :half] = 1.0
    A = torch.randn(1, D_KEY, D, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    phi = torch.zeros(1, 1, D_KEY, dtype=torch.float64)
    phi[..., half:] = 0.5
    big, small = associative_read(phi * 1e-1, A, z, EPS, floor, 0.3), associative_read(phi * 1e-3, A, z, EPS, floor, 0.3)
    assert torch.allclose(big, small, rtol=1e-9)
    assert float(big.norm()) <= float(torch.linalg.matrix_norm(A[0], 2)) / (0.3 * float(z.norm())) * (1 + 1e-12)
    if floor:
        loud = associative_read(phi * 1e-2, A, z, EPS, floor) / associative_read(phi * 1e-1, A, z, EPS, floor)
        assert torch.allclose(loud, torch.full_like(loud, 10.0), rtol=1e-9)
    with pytest.raises(ValueError, match="cos_floor=-0.1"):
        plugin(cos_floor=-0.1)


def test_gamma_is_clipped_to_zero_and_one() -> None:
    """With z large against the keys, 1 − zᵀk/‖k‖² < 0: clipped to 0, so z never decreases."""
    mem = plugin()
    x, state = outputs(3), random_state(mem, 4, z_scale=0.2, written=(True, True))
    raw = gammas(mem, state, x)
    assert bool((raw < 0).any()) and bool((raw > 0).any()), f"the test needs both signs of γ: {raw}"
    new = mem.after_layer(0, x, state)
    assert bool((new["z.0"] >= state["z.0"]).all()), "z decreased: γ was not clipped at 0"
    k = dpfp(mem.layers[0].W_K(x[:, -M:]), NU)
    expected = state["z.0"] + (raw.clamp(0, 1)[..., None] * k).sum(1)
    assert torch.allclose(new["z.0"], expected, rtol=1e-12, atol=1e-12)


def test_gamma_is_detached() -> None:
    """z' = z + Σ γ_i k_i with γ a constant: ∂z'/∂z = I, and ∂z'/∂m reaches m only through k_i."""
    mem = plugin()
    x, state = outputs(3), random_state(mem, 4, z_scale=0.05, written=(True, True))
    raw = gammas(mem, state, x)
    assert bool(((raw > 0) & (raw < 1)).all()), f"the test needs γ inside (0, 1), where the clip is inactive: {raw}"
    new = mem.after_layer(0, x, state)
    w = torch.randn(B, D_KEY, dtype=torch.float64)
    (g_z,) = torch.autograd.grad((new["z.0"] * w).sum(), state["z.0"], retain_graph=True)
    assert torch.equal(g_z, w), "gradient flows through γ into z"
    (g_x,) = torch.autograd.grad((new["z.0"] * w).sum(), x)
    x2 = x.detach().clone().requires_grad_()
    k = dpfp(mem.layers[0].W_K(x2[:, -M:]), NU)
    (g_const,) = torch.autograd.grad(((state["z.0"].detach() + (raw[..., None] * k).sum(1)) * w).sum(), x2)
    assert torch.allclose(g_x, g_const, rtol=1e-12, atol=1e-12), "gradient flows through γ into the memory tokens"


def test_z_is_not_weighted_by_beta() -> None:
    """Moving W_β's bias changes A' (β weights the value write) and leaves z' exactly as it was."""
    mem = plugin()
    x, state = outputs(7), random_state(mem, 8)
    with torch.no_grad():
        before = mem.after_layer(0, x, state)
        mem.layers[0].W_beta.bias.add_(2.0)
        after = mem.after_layer(0, x, state)
    assert not torch.allclose(before["A.0"], after["A.0"])
    assert torch.equal(before["z.0"], after["z.0"])


@pytest.mark.parametrize("floor", [0.0, 1.0], ids=["paper", "floored"])
def test_empty_memory_read_is_skipped_and_first_write_is_plain(floor: float) -> None:
    """An unwritten row reads nothing (its input is returned bit for bit, whatever A and z hold); its
    first write is v̄ = 0, γ = 1: A' = A + Σ β v kᵀ, z' = z + Σ k exactly."""
    mem = plugin(norm_floor=floor)
    state = random_state(mem, 9, z_scale=0.05 if floor == 0 else 0.5, written=(False, True))
    h = outputs(10, t=6)
    read = mem.before_layer(0, h, state)
    assert torch.equal(read[0], h[0]), "an empty row read its memory"
    assert not torch.allclose(read[1], h[1]), "a written row read nothing (vacuous)"
    layer = mem.layers[0]
    ref = armt_read_reference(h, state["A.0"], state["z.0"], layer.W_Q.weight, NU, EPS, ~state["written"], mem.floor)
    assert torch.allclose(read, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((read * w).sum(), (h, state["A.0"], state["z.0"], layer.W_Q.weight))
    want = torch.autograd.grad((ref * w).sum(), (h, state["A.0"], state["z.0"], layer.W_Q.weight))
    for g, r in zip(got, want):
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12)

    all_empty = {**state, "written": torch.tensor([False, False])}
    assert mem.before_layer(0, h, all_empty) is h  # nothing written anywhere: no read at all

    x = outputs(11)
    with torch.no_grad():
        new = mem.after_layer(0, x, state)
        k = dpfp(layer.W_K(x), NU)
        v = layer.W_V(x)
        beta = torch.sigmoid(layer.W_beta(x))
        assert torch.allclose(new["z.0"][0], state["z.0"][0] + k[0].sum(0), rtol=1e-14, atol=0)
        plain_a = state["A.0"][0] + torch.einsum("mk,md->kd", k[0], beta[0] * v[0])
        assert torch.allclose(new["A.0"][0], plain_a, rtol=1e-13, atol=1e-14)


def test_w_v_starts_at_zero_and_the_memory_is_silent() -> None:
    """At the paper's initialisation W_V = 0 in every layer, A stays 0 and every segment's logits are
    those of a fresh state (nothing reaches across segments); a nonzero W_V does reach (control)."""
    model = tiny_model("armt", options={"n_mem_tokens": 2, "d_mem": 4})
    assert all(bool((layer.W_V.weight == 0).all()) for layer in model.model_memory.layers)
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
        assert all(bool((out.state.model[f"A.{i}"] == 0).all()) for i in range(2))
        assert all(bool((out.state.model[f"z.{i}"] > 0).any()) for i in range(2))  # z does count the keys
        assert torch.equal(out.logits[:, 2], model(x[:, 2:]).logits[:, 0])
        loud = tiny_model("armt", options={"n_mem_tokens": 2, "d_mem": 4, "w_v_init_std": 0.2})
        assert not torch.allclose(loud(x).logits[:, 2], loud(x[:, 2:]).logits[:, 0])


def naive_model(model: MemoryModel, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The model written as a loop around its own blocks with the reference read and write: per
    segment [tokens; memory tokens], each layer reads at its input and writes from its output."""
    mem = model.model_memory
    b, s, _ = tokens.shape
    state = {k: v.double() if v.is_floating_point() else v for k, v in mem.initial_state(b, tokens.device).items()}
    empty = torch.ones(b, dtype=torch.bool)
    logits = []
    for seg in range(s):
        x = torch.cat((model.embed(tokens[:, seg]), mem.mem_tokens.expand(b, -1, -1)), dim=1)  # [B, N + m, d]
        for i, block in enumerate(model.blocks):
            p = mem.layers[i]
            x = armt_read_reference(x, state[f"A.{i}"], state[f"z.{i}"], p.W_Q.weight, mem.nu, mem.eps, empty, mem.floor)
            x = block(x[:, None], torch.zeros(b, 1, dtype=torch.bool), {}, None)[0][:, 0]
            state[f"A.{i}"], state[f"z.{i}"] = armt_write_reference(
                state[f"A.{i}"], state[f"z.{i}"], x[:, -mem.m :], p.W_K.weight, p.W_V.weight, p.W_beta.weight[0],
                p.W_beta.bias[0], mem.nu, mem.eps, empty, mem.floor)
        empty = torch.zeros(b, dtype=torch.bool)
        logits.append(model.head(model.norm_out(x))[:, : tokens.shape[2]])
    return torch.stack(logits, dim=1), state


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_model_matches_a_naive_loop_values_and_gradients(checkpointed: bool) -> None:
    """The backbone's hooks put the read at each block's input and the write at its output, in every
    layer, with or without activation checkpointing (train mode, no dropout)."""
    torch.manual_seed(0)
    cfg = tiny_model_config(checkpoint_activations=checkpointed)
    model = MemoryModel(cfg, "armt", get_memory("armt").config(n_mem_tokens=2, d_mem=3, w_v_init_std=0.3)).double()
    model.train()
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(2))
    out = model(x)
    ref, ref_state = naive_model(model, x)
    assert torch.allclose(out.logits, ref, rtol=1e-10, atol=1e-10)
    for key, value in ref_state.items():
        if key == "written":
            continue
        assert torch.allclose(out.state.model[key], value, rtol=1e-10, atol=1e-10), key
    w = torch.randn_like(ref)
    params = list(model.model_memory.parameters())
    got = torch.autograd.grad((out.logits * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for (name, _), g, r in zip(model.model_memory.named_parameters(), got, want):
        assert torch.allclose(g, r, rtol=1e-8, atol=1e-10), f"gradient to {name}"
        assert float(g.abs().max()) > 0, f"no gradient reaches {name}"


def test_footprint_gpt2_card_and_analytic() -> None:
    """2ν·d_mem·(d_model + 1) per layer: GPT-2 (12 layers, d 768, d_mem 64) holds 3,543,552 numbers."""
    gpt2 = ModelConfig(d_model=768, n_layers=12, n_heads=12, segment_len=512)
    assert AssociativeRecurrentMemory.footprint(ARMTConfig(), gpt2, 10**6)["total"] == 3_543_552
    assert card_footprint(get_card("armt"), gpt2, ARMTConfig(), 10**6) == 3_543_552
    assert get_card("armt").defaults == dataclasses.asdict(ARMTConfig())


def test_float32_state_under_bf16_autocast() -> None:
    model = tiny_model("armt")
    x = torch.randint(0, 256, (2, 2, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert all(v.dtype == torch.float32 for v in out.state.model.values() if v.is_floating_point())
    assert bool(torch.isfinite(out.logits.float()).all())


def test_bad_options_are_refused() -> None:
    for bad in ({"d_mem": 0}, {"nu": 0}, {"n_mem_tokens": 0}, {"eps": 0.0}, {"write_norm": "layer"}):
        with pytest.raises(ValueError, match=f"armt {next(iter(bad))}"):
            AssociativeRecurrentMemory(ARMTConfig(**bad), tiny_model_config())


def test_quick_suite_options_fit_the_parameter_budget() -> None:
    """The quick suite's armt options keep it within the suite's 10% parameter spread against `local`;
    the paper's d_mem 64 would not (W_V alone is d_model² a layer: 8% of the 0.82M backbone)."""
    from memzoo.suites.compare import check_parameter_spread, expand, load_suite, parameter_counts

    suite = load_suite("quick", ["methods=[local,armt]", "seeds=[0]"])
    counts = parameter_counts(expand(suite))
    assert check_parameter_spread(counts, suite.max_param_spread) <= 0.10
    paper = load_suite("quick", ["methods=[local,armt]", "seeds=[0]", "options.armt.d_mem=64"])
    assert check_parameter_spread(parameter_counts(expand(paper)), 1.0) > 0.10


def test_a_run_folder_from_before_write_norm_matches_the_papers_write(tmp_path) -> None:
    """A config.yaml saved before `write_norm` existed was trained with the paper's write: it matches
    today's config with write_norm none (so a suite does not train it again) and loads as none; it
    does not match write_norm rms. Other memories get no such key."""
    from omegaconf import OmegaConf

    from memzoo.runs.configure import load_config, load_run_config, saved_run_config
    from memzoo.training.curriculum import config_matches
    cfg = load_config("armt", ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16"])
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["memory"]["write_norm"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(old)))
    assert config_matches(tmp_path, cfg)
    assert load_run_config(tmp_path).memory.write_norm == "none"
    assert not config_matches(tmp_path, load_config("armt", ["model.d_model=32", "model.n_layers=2", "model.n_heads=2",
                                                             "model.segment_len=16", "memory.write_norm=rms"]))
    xl = OmegaConf.to_container(load_config("xl", ["model.d_model=32"]), resolve=True)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(xl)))
    assert "write_norm" not in saved_run_config(tmp_path).memory
