"""Transformer-XL against an explicit reference (softmax over [memory; segment] with plain matmuls),
and the properties that define it: the cache is exactly the last mem_len keys/values, gradient
stops at the cache, an empty memory is masked (not zeros), and context grows by mem_len per layer."""
from __future__ import annotations

import math

import pytest
import torch
from einops import rearrange

from conftest import tiny_model_config
from memzoo.core.attention import LocalAttention, rope
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, state_numbers
from memzoo.core.model import MemoryModel
from memzoo.memories.xl import TransformerXL, XLConfig
from memzoo.conformance.catalog import card_footprint, get_card

B, S, H, N, D = 2, 3, 2, 8, 8
BASE = 10000.0


def inputs(seed: int = 0, s: int = S, n: int = N):
    """Random q, k, v [B, S, H, N, D] (leaf tensors) and a reset in row 1 at segment 2."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, s, H, n, D, generator=g, requires_grad=True) for _ in range(3))
    reset = torch.zeros(B, s, dtype=torch.bool)
    if s > 2:
        reset[1, 2] = True
    return q, k, v, reset


def plugin(mem_len: int) -> TransformerXL:
    """The layer plugin fed keys and values directly (cache=kv; cache=hidden recomputes them, tested below)."""
    return TransformerXL(XLConfig(mem_len=mem_len, cache="kv"), tiny_model_config(d_model=H * D, n_heads=H, segment_len=N), 0)


def run(mem: TransformerXL, q, k, v, reset, state=None):
    """The plugin on S segments given as q, k, v directly (no backbone)."""
    b, s, _, n, _ = q.shape
    x = LayerInputs(torch.zeros(b, s, n, H * D), q, k, v, reset, LocalAttention(BASE), project_kv=None)
    return mem(x, state if state is not None else mem.initial_state(b, q.device))


def xl_reference(q, k, v, reset, mem_len: int):
    """Per row, segment and head: softmax(QKᵀ/√d + mask) V over [SG(last mem_len keys of the document); segment]."""
    b_, s_, h_, n, d = q.shape
    out = torch.zeros_like(q)
    for b in range(b_):
        past_k, past_v = [], []  # this row's document so far, one [N, D] per head and segment
        for s in range(s_):
            if reset[b, s]:
                past_k, past_v = [], []
            for h in range(h_):
                mem_k = torch.cat([pk[h] for pk in past_k], dim=0)[-mem_len:] if past_k else k.new_zeros(0, d)
                mem_v = torch.cat([pv[h] for pv in past_v], dim=0)[-mem_len:] if past_v else v.new_zeros(0, d)
                m = mem_k.shape[0]
                keys = torch.cat((mem_k.detach(), k[b, s, h]), dim=0)  # [m + N, D], stop-gradient on memory
                values = torch.cat((mem_v.detach(), v[b, s, h]), dim=0)
                k_pos = torch.arange(-m, n)  # memory at negative positions
                qr = rope(q[b, s, h], torch.arange(n), BASE)  # [N, D]
                kr = rope(keys, k_pos, BASE)  # [m + N, D]
                scores = qr @ kr.T / math.sqrt(d)  # [N, m + N]
                allowed = k_pos[None, :] <= torch.arange(n)[:, None]  # memory always, segment causally
                scores = scores.masked_fill(~allowed, float("-inf"))
                out[b, s, h] = torch.softmax(scores, dim=-1) @ values
            past_k.append(k[b, s])
            past_v.append(v[b, s])
    return out


@pytest.mark.parametrize("mem_len", [5, N, 12])  # shorter than, equal to, 1.5 x the segment
def test_matches_explicit_reference_values_and_gradients(mem_len: int) -> None:
    q, k, v, reset = inputs()
    out, _, _ = run(plugin(mem_len), q, k, v, reset)
    ref = xl_reference(q, k, v, reset, mem_len)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for name, g, r in zip("qkv", grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5, rtol=1e-4), f"gradient of {name} differs from the reference"


def test_cache_holds_exactly_the_last_mem_len_keys_and_values() -> None:
    """mem_len = 1.5 N: after 2 full segments and a partial one, the last 12 of 21 positions, oldest first."""
    mem_len = 12
    q, k, v, _ = inputs(s=2)
    reset = torch.zeros(B, 2, dtype=torch.bool)
    mem = plugin(mem_len)
    _, state, _ = run(mem, q, k, v, reset)
    flat = lambda t: rearrange(t.detach(), "b s h n d -> b (s n) h d")  # noqa: E731  [B, S*N, H, D]
    assert torch.equal(state["k"], flat(k)[:, -mem_len:]) and torch.equal(state["v"], flat(v)[:, -mem_len:])
    assert bool(state["valid"].all())

    q2, k2, v2, _ = inputs(seed=5, s=1, n=5)  # a final partial segment of 5 tokens
    _, state, _ = run(mem, q2, k2, v2, torch.zeros(B, 1, dtype=torch.bool), state)
    seen_k = torch.cat((flat(k), flat(k2)), dim=1)  # [B, 21, H, D]
    assert torch.equal(state["k"], seen_k[:, -mem_len:])
    assert state["k"].dtype == torch.float32 and not state["k"].requires_grad


def test_first_segment_of_short_history_masks_unfilled_slots() -> None:
    """After one segment with mem_len = 1.5 N, only N of 12 slots are valid, and the output matches the reference."""
    q, k, v, reset = inputs(s=2)
    mem = plugin(12)
    _, state, _ = run(mem, q[:, :1], k[:, :1], v[:, :1], reset[:, :1])
    assert state["valid"].sum(dim=1).tolist() == [N, N]
    assert not bool(state["valid"][:, : 12 - N].any())  # the oldest slots are the empty ones


def test_no_gradient_through_the_cache() -> None:
    """Segment 1's output depends on segment 0's keys/values (value), yet none of its gradient reaches them."""
    q, k, v, reset = inputs(s=2)
    reset[:] = False
    mem = plugin(N)
    out, _, _ = run(mem, q, k, v, reset)
    gq, gk, gv = torch.autograd.grad(out[:, 1].sum(), (q, k, v))
    for name, g in zip("qkv", (gq, gk, gv)):
        assert float(g[:, 0].abs().max()) == 0.0, f"gradient reached segment 0's {name} through the cache"
    assert float(gk[:, 1].abs().max()) > 0 and float(gv[:, 1].abs().max()) > 0
    with torch.no_grad():
        k_changed = k.clone()
        k_changed[:, 0] += 1.0
        out_changed, _, _ = run(mem, q, k_changed, v, reset)
    assert float((out_changed[:, 1] - out[:, 1].detach()).abs().max()) > 1e-4, "segment 0 does not reach segment 1 (vacuous)"


def test_document_start_masks_empty_memory_instead_of_attending_zeros() -> None:
    """With an empty memory (fresh state, or a reset row) the output is plain local attention over
    the segment; attending zero vectors instead would pull it towards 0 and differ."""
    q, k, v, reset = inputs()
    out, _, _ = run(plugin(N), q, k, v, reset)
    attend = LocalAttention(BASE)
    with torch.no_grad():
        local = lambda s: attend(q[:, s], k[:, s], v[:, s])  # noqa: E731  [B, H, N, D]
        assert torch.allclose(out[:, 0], local(0), atol=1e-6)  # fresh state
        assert torch.allclose(out[1, 2], local(2)[1], atol=1e-6)  # row 1 starts a document at segment 2
        assert not torch.allclose(out[0, 2], local(2)[0], atol=1e-4)  # row 0 keeps its memory
        # ... and equals a fresh run of the same segments for the reset row.
        fresh, _, _ = run(plugin(N), q[:, 2:], k[:, 2:], v[:, 2:], torch.zeros(B, 1, dtype=torch.bool))
        assert torch.allclose(out[1, 2], fresh[1, 0], atol=1e-6)


def tiny_xl(n_layers: int, mem_len: int = N, cache: str = "kv", seed: int = 0) -> MemoryModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=n_layers, n_heads=2, segment_len=N, mlp_ratio=2.0)
    return MemoryModel(cfg, "xl", XLConfig(mem_len=mem_len, cache=cache)).eval()


@pytest.mark.parametrize("n_layers", [1, 2])
def test_effective_context_is_mem_len_times_layers(n_layers: int) -> None:
    """mem_len = N: a token in segment 0 reaches segment n_layers and not segment n_layers + 1."""
    model = tiny_xl(n_layers)
    x = torch.randint(0, 256, (B, 4, N), generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[:, 0, 0] = (y[:, 0, 0] + 77) % 256  # the first token: only the deepest layer's memory can carry it
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    diff = (a - b).abs().amax(dim=(0, 2, 3))  # per segment
    assert float(diff[n_layers]) > 1e-4, f"segment 0 does not reach segment {n_layers}: {diff.tolist()}"
    assert float(diff[n_layers + 1 :].max()) < 1e-6, f"segment 0 reaches beyond {n_layers} segments: {diff.tolist()}"


def test_streaming_equals_one_shot_with_uneven_mem_len_and_partial_segment() -> None:
    """mem_len = 1.5 N (slots straddle segments) and a final segment of 5 tokens: streamed == one call."""
    model = tiny_xl(2, mem_len=12)
    x = torch.randint(0, 256, (B, 3, N), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(x).logits  # [B, 3, N, V]
        state, parts = model.initial_state(B), []
        for s in range(3):
            out = model(x[:, s : s + 1], state)
            state = out.state
            parts.append(out.logits)
        part = model(x[:, 2:, :5], model(x[:, :2]).state).logits
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)
    assert torch.allclose(part[:, 0], full[:, 2, :5], atol=1e-5)


def test_hidden_cache_same_values_but_weights_learn_from_memory() -> None:
    """cache=hidden recomputes memory keys/values with the current weights: same logits as cache=kv,
    still no gradient into segment 0's inputs, but W_K/W_V get gradient from the memory slots."""
    x = torch.randint(0, 256, (B, 2, N), generator=torch.Generator().manual_seed(4))
    grads, logits = {}, {}
    for cache in ("kv", "hidden"):
        model = tiny_xl(2, cache=cache)
        embeds: list[torch.Tensor] = []

        def keep(_module, _inp, out: torch.Tensor) -> None:
            out.retain_grad()
            embeds.append(out)

        handle = model.embed.register_forward_hook(keep)
        out = model(x).logits
        out[:, 1].sum().backward()
        handle.remove()
        assert float(embeds[0].grad[:, 0].abs().max()) == 0.0, f"{cache}: gradient reached segment 0's inputs"
        grads[cache] = model.blocks[0].attn.qkv.weight.grad.clone()
        logits[cache] = out.detach()
    assert torch.allclose(logits["kv"], logits["hidden"], atol=1e-5)
    d = 32
    assert torch.allclose(grads["kv"][:d], grads["hidden"][:d], atol=1e-6)  # W_Q: same in both
    assert not torch.allclose(grads["kv"][d:], grads["hidden"][d:], atol=1e-6)  # W_K, W_V: memory adds to them


@pytest.mark.parametrize("cache", ["kv", "hidden"])
def test_footprint_measured_and_table1(cache: str) -> None:
    """Measured float numbers == footprint()["total"]; the Table-1 count == the card's formula."""
    model = tiny_xl(2, mem_len=12, cache=cache)
    with torch.no_grad():
        state = model(torch.randint(0, 256, (B, 2, N))).state
    parts = TransformerXL.footprint(model.memory_cfg, model.cfg, 2 * N)
    assert state_numbers(state.all(), B) == parts["total"]
    table1 = parts.get("table1", parts["total"])
    assert table1 == (16 + 16) * 2 * 12 * 2
    assert card_footprint(get_card("xl"), model.cfg, model.memory_cfg, 2 * N) == table1
    # The paper's setting: (128 + 128) x 8 x 2048 x 12 = 50,331,648 ("50M" in Table 2).
    paper = ModelConfig(d_model=1024, n_layers=12, n_heads=8, segment_len=2048)
    assert TransformerXL.footprint(XLConfig(mem_len=2048, cache="kv"), paper, 32768)["total"] == 50_331_648
    hidden = TransformerXL.footprint(XLConfig(mem_len=2048), paper, 32768)  # the default: hidden states
    assert hidden["total"] == 1024 * 2048 * 12 and hidden["table1"] == 50_331_648


def test_state_is_float32_under_autocast() -> None:
    model = tiny_xl(2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = model(torch.randint(0, 256, (B, 2, N))).state
    for layer in state.layers:
        assert layer["k"].dtype == torch.float32 and layer["v"].dtype == torch.float32
        assert layer["valid"].dtype == torch.bool


def test_card_defaults_match_config() -> None:
    from dataclasses import asdict

    assert get_card("xl").defaults == asdict(XLConfig())


def test_hidden_cache_projects_only_the_states_held(monkeypatch) -> None:
    """cache=hidden with mem_len 1,024 against 24 (what 4 segments of 8 fill): the same logits and
    gradients, and keys/values are recomputed for the filled slots only (row 1 restarts at segment 2)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (B, 4, N), generator=g)
    reset = torch.zeros(B, 4, dtype=torch.bool)
    reset[:, 0] = True
    reset[1, 2] = True
    projected: list[int] = []
    real = TransformerXL.memory_prefix

    def spy(self, inputs, state):
        prefix = real(self, inputs, state)
        projected.append(0 if prefix is None else prefix.k.shape[2])
        return prefix

    monkeypatch.setattr(TransformerXL, "memory_prefix", spy)
    results = []
    for mem_len in (1024, 24):
        torch.manual_seed(0)
        model = MemoryModel(tiny_model_config(n_layers=1, segment_len=N), "xl", XLConfig(mem_len=mem_len, cache="hidden"))
        out = model(x, None, reset)
        out.logits.square().sum().backward()
        results.append((out.logits, [p.grad for p in model.parameters()]))
    (logits_big, grads_big), (logits_small, grads_small) = results
    assert projected[:4] == [0, 8, 16, 24], "per segment: the slots held so far (row 0 never resets)"
    assert torch.equal(logits_big, logits_small)
    assert all(torch.equal(a, b) for a, b in zip(grads_big, grads_small))
