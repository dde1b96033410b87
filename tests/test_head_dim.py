"""model.head_dim: a head width D free of the head count (d_inner = H x D may differ from d_model),
for every registered memory; unset, the backbone is exactly the d_model // n_heads one."""
from __future__ import annotations

import pytest
import torch
from einops import rearrange

from conftest import CASES, METHODS, tiny_model
from memzoo.core.config import ConfigError
from memzoo.core.memory import state_numbers
from memzoo.runs.configure import load_config
from memzoo.conformance.catalog import card_footprint, load_cards

B, S, N = 2, 3, 8
WIDE = dict(d_model=32, n_heads=4, head_dim=16)  # d_inner 64 != d_model 32


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (B, S, N), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", METHODS)
def test_unset_head_dim_is_the_tied_width(method: str) -> None:
    """head_dim unset and head_dim = d_model // n_heads build the same parameters and logits."""
    tied, explicit = tiny_model(method, n_heads=4), tiny_model(method, n_heads=4, head_dim=8)
    assert tied.cfg.d_head == 8 and tied.cfg.d_inner == tied.cfg.d_model == 32
    assert {k: v.shape for k, v in tied.state_dict().items()} == {k: v.shape for k, v in explicit.state_dict().items()}
    assert tied.blocks[0].attn.qkv.weight.shape == (3 * 32, 32)
    with torch.no_grad():
        assert torch.equal(tied(tokens()).logits, explicit(tokens()).logits)


def test_backbone_projects_through_d_inner() -> None:
    """W_Q,K,V: d_model -> 3 H D and W_O: H D -> d_model; project_kv(h) gives the layer's own K, V."""
    model = tiny_model("local", **WIDE)
    attn = model.blocks[0].attn
    assert attn.qkv.weight.shape == (3 * 64, 32) and attn.proj.weight.shape == (32, 64)
    h = torch.randn(B, 5, 32, generator=torch.Generator().manual_seed(2))  # [B, M, d_model]
    k, v = attn.project_kv(h)  # [B, H, M, D]
    _, k_ref, v_ref = rearrange(attn.qkv(h), "b m (three h d) -> three b h m d", three=3, h=4)
    assert k.shape == (B, 4, 5, 16)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_footprint_holds_when_d_inner_differs_from_d_model(case: tuple) -> None:
    """Over 3 segments at d_model 32, 4 heads of width 16: measured state == plugin formula == card."""
    _, method, options = case
    model = tiny_model(method, options=options, **WIDE)
    with torch.no_grad():
        out = model(tokens())
    assert torch.isfinite(out.logits).all()
    measured = state_numbers(out.state.all(), B)
    parts = model.spec.cls.footprint(model.memory_cfg, model.cfg, S * N)
    assert measured == parts["total"], f"measured {measured} != analytic {parts['total']}"
    card = load_cards().get(method)
    if card is not None:
        assert card_footprint(card, model.cfg, model.memory_cfg, S * N) == parts.get("table1", parts["total"])


@pytest.mark.parametrize("method", [m for m in METHODS if m.startswith("infini-")])
def test_infini_state_grows_with_head_dim_at_fixed_heads(method: str) -> None:
    """Infini at 4 heads of width 32 (d_model 32): D (D + 1) H l = 32 x 33 x 4 x 2 numbers."""
    model = tiny_model(method, d_model=32, n_heads=4, head_dim=32)
    with torch.no_grad():
        state = model(tokens()).state
    expected = 32 * 33 * 4 * 2
    assert model.spec.cls.footprint(model.memory_cfg, model.cfg, S * N)["total"] == expected
    assert state_numbers(state.all(), B) == expected


@pytest.mark.parametrize("override, message", [
    ("model.head_dim=0", r"model.head_dim=0; expected a positive even integer"),
    ("model.head_dim=-4", r"model.head_dim=-4; expected a positive even integer"),
    ("model.head_dim=7", r"model.head_dim=7; expected a positive even integer"),
    ("model.d_model=30", r"model.d_model=30 must be divisible by model.n_heads=4 .* or set model.head_dim"),
])
def test_bad_head_width_is_a_config_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("local", [override])


def test_head_dim_lifts_the_divisibility_rule() -> None:
    cfg = load_config("local", ["model.d_model=30", "model.n_heads=4", "model.head_dim=8"])
    assert cfg.model.head_dim == 8
    with pytest.raises(ConfigError, match="head_dim"):
        load_config("local", ["model.head_dim=abc"])
