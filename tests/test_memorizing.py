"""Memorizing Transformer: exact top-k against a brute-force sort, the FIFO store's order and
write-after-read, masking of empty slots, per-row reset, stop-gradient, the gate, faiss == exact."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model, tiny_model_config
from memzoo.core.attention import LocalAttention
from memzoo.memories.memorizing import (
    MemorizingConfig,
    MemorizingKNN,
    MemorizingXL,
    knn_exact,
    knn_faiss,
    knn_layer_index,
)
from memzoo.core.memory import LayerInputs, state_numbers

B, H, N, D = 2, 2, 8, 8


def knn_module(store_size: int = 32, top_k: int = 4, mem_len: int = 8, backend: str = "exact") -> MemorizingKNN:
    cfg = MemorizingConfig(store_size=store_size, top_k=top_k, mem_len=mem_len, knn_backend=backend)
    mem = MemorizingXL.for_layer(cfg, tiny_model_config(d_model=H * D, n_heads=H, n_layers=2), 1)
    assert isinstance(mem, MemorizingKNN)
    return mem


def qkv(s: int, seed: int = 0, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, s, H, N, D, generator=g, requires_grad=grad) for _ in range(3))  # type: ignore[return-value]


def run(mem: MemorizingKNN, q, k, v, reset=None, state=None):
    """Run the layer memory on S segments [B, S, H, N, D]; returns (out, state)."""
    s = q.shape[1]
    reset = torch.zeros(B, s, dtype=torch.bool) if reset is None else reset
    x = LayerInputs(torch.zeros(B, s, N, H * D), q, k, v, reset, LocalAttention(10000.0), lambda t: (t, t))
    out, state, _ = mem(x, mem.initial_state(B, q.device) if state is None else state)
    return out, state


def reference_topk(q_hat: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, k: int) -> list:
    """Brute force: for each (row, head, query), sort all valid slots' similarities, keep the first k."""
    out = []
    for b in range(q_hat.shape[0]):
        slots = valid[b].nonzero().squeeze(-1).tolist()
        for h in range(q_hat.shape[1]):
            for n in range(q_hat.shape[2]):
                sims = [(float(q_hat[b, h, n] @ keys[b, c, h]), c) for c in slots]
                sims.sort(key=lambda t: -t[0])
                out.append([c for _, c in sims[:k]])
    return out


def reference_read(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, k: int,
                   scale: torch.Tensor) -> torch.Tensor:
    """A_mem from the paper: softmax(τ q̂·k̂) V over the k nearest valid slots; 0 when none. q [B, H, N, D]."""
    q_hat = F.normalize(q, dim=-1)
    chosen = iter(reference_topk(q_hat, keys, valid, k))
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for n in range(q.shape[2]):
                idx = next(chosen)
                if not idx:
                    continue
                logits = torch.stack([scale[h] * (q_hat[b, h, n] @ keys[b, c, h]) for c in idx])
                w = torch.softmax(logits, dim=0)
                out[b, h, n] = sum(w[i] * values[b, c, h] for i, c in enumerate(idx))
    return out


def random_store(c: int, n_valid: list[int], seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys = F.normalize(torch.randn(B, c, H, D, generator=g), dim=-1)
    values = torch.randn(B, c, H, D, generator=g)
    valid = torch.zeros(B, c, dtype=torch.bool)
    for b, m in enumerate(n_valid):  # valid slots scattered, not just a suffix
        valid[b, torch.randperm(c, generator=g)[:m]] = True
    return {"k": keys, "v": values, "valid": valid}


def test_exact_topk_equals_brute_force_sort() -> None:
    store = random_store(40, [40, 13])
    q_hat = F.normalize(torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(2)), dim=-1)
    for k in (1, 5, 20):
        idx, ok = knn_exact(q_hat, store["k"], store["valid"], k)
        got = [[c for c, o in zip(i, m) if o] for i, m in zip(idx.reshape(-1, idx.shape[-1]).tolist(),
                                                            ok.reshape(-1, ok.shape[-1]).tolist())]
        assert got == reference_topk(q_hat, store["k"], store["valid"], k)  # same slots, best first


def test_read_equals_reference_attention_over_neighbours() -> None:
    mem = knn_module(store_size=40, top_k=6)
    with torch.no_grad():
        mem.log_scale.copy_(torch.tensor([math.log(3.0), math.log(7.0)]))
    store = random_store(40, [40, 4])  # row 1 has fewer valid slots than top_k
    q = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(3))
    got = mem.read(q, store)
    ref = reference_read(q, store["k"], store["v"], store["valid"], 6, mem.log_scale.exp().detach())
    assert torch.allclose(got, ref, atol=1e-5)


def test_fifo_store_keeps_the_newest_store_size_entries() -> None:
    mem = knn_module(store_size=12)
    q, k, v = qkv(3)
    with torch.no_grad():
        _, state = run(mem, q, k, v)
    keys = k.transpose(2, 3).reshape(B, 3 * N, H, D)  # [B, S*N, H, D] in time order
    vals = v.transpose(2, 3).reshape(B, 3 * N, H, D)
    assert torch.allclose(state["store_k"], F.normalize(keys[:, -12:], dim=-1), atol=1e-6)
    assert torch.allclose(state["store_v"], vals[:, -12:])
    assert bool(state["store_valid"].all())
    assert state["store_k"].dtype == torch.float32 and state["store_valid"].dtype == torch.bool


def test_write_after_read_a_segment_cannot_retrieve_its_own_keys() -> None:
    """Queries equal to their own keys would retrieve themselves if the segment were written first."""
    mem = knn_module(store_size=64, top_k=3)
    with torch.no_grad():
        mem.gate.beta.fill_(30.0)  # sigmoid ≈ 1: output = memory read
    q, k, v = qkv(2, seed=4)
    q = k.clone()
    with torch.no_grad():
        out, _ = run(mem, q, k, v)
        scale = mem.log_scale.exp()
        seg0 = {"k": F.normalize(k[:, 0].transpose(1, 2), dim=-1), "v": v[:, 0].transpose(1, 2)}  # [B, N, H, D]
        valid0 = torch.ones(B, N, dtype=torch.bool)
        expected = reference_read(q[:, 1], seg0["k"], seg0["v"], valid0, 3, scale)
        both_k = torch.cat((seg0["k"], F.normalize(k[:, 1].transpose(1, 2), dim=-1)), dim=1)
        both_v = torch.cat((seg0["v"], v[:, 1].transpose(1, 2)), dim=1)
        leaked = reference_read(q[:, 1], both_k, both_v, torch.ones(B, 2 * N, dtype=torch.bool), 3, scale)
    assert torch.allclose(out[:, 1], expected, atol=1e-5)
    assert not torch.allclose(out[:, 1], leaked, atol=1e-2), "control: a leaked read would differ"
    assert torch.allclose(out[:, 0], torch.zeros_like(out[:, 0]), atol=1e-6), "first segment: empty store reads 0"


def test_empty_slots_are_never_retrieved() -> None:
    """Invalid slots holding the queries' own directions and huge values change nothing."""
    mem = knn_module(store_size=24, top_k=8)
    store = random_store(24, [5, 0])  # row 0: 5 valid < top_k; row 1: empty
    q = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(5))
    poisoned = {k: t.clone() for k, t in store.items()}
    bad = ~store["valid"]  # [B, C]
    target = F.normalize(q.mean(dim=2), dim=-1)  # [B, H, D]: close to every query of the row/head
    poisoned["k"][bad] = target[:, None].expand(-1, 24, -1, -1)[bad]
    poisoned["v"][bad] = 1e6
    idx, ok = knn_exact(F.normalize(q, dim=-1), poisoned["k"], poisoned["valid"], 8)
    assert ok.sum(dim=-1)[0].eq(5).all() and not bool(ok[1].any())
    assert bool(store["valid"][0][idx[0][ok[0]]].all()), "an invalid slot was retrieved"
    with torch.no_grad():
        clean, dirty = mem.read(q, store), mem.read(q, poisoned)
    assert torch.equal(clean, dirty)
    assert torch.equal(dirty[1], torch.zeros_like(dirty[1]))


def test_reset_clears_the_row_and_keeps_the_other() -> None:
    mem = knn_module(store_size=64)
    q, k, v = qkv(3, seed=6)
    reset = torch.zeros(B, 3, dtype=torch.bool)
    reset[0, 2] = True
    with torch.no_grad():
        out, state = run(mem, q, k, v, reset)
        fresh, _ = run(mem, q[:, 2:], k[:, 2:], v[:, 2:])
    assert state["store_valid"].sum(dim=1).tolist() == [N, 3 * N]
    assert state["cache_valid"].sum(dim=1).tolist() == [8, 8]
    assert torch.allclose(out[0, 2], fresh[0, 0], atol=1e-6)
    assert not torch.allclose(out[1, 2], fresh[1, 0], atol=1e-3), "row 1 kept its memory"


def test_no_gradient_into_the_store_or_across_segments() -> None:
    mem = knn_module()
    q, k, v = qkv(2, seed=7, grad=True)
    out, state = run(mem, q, k, v)
    assert not any(t.requires_grad for t in state.values())
    gq, gk, gv, gb, gs = torch.autograd.grad(out[:, 1].square().sum(), (q, k, v, mem.gate.beta, mem.log_scale))
    assert float(gk[:, 0].abs().sum()) == 0.0 and float(gv[:, 0].abs().sum()) == 0.0
    assert float(gq[:, 0].abs().sum()) == 0.0
    assert float(gq[:, 1].abs().sum()) > 0 and float(gb.abs().sum()) > 0 and float(gs.abs().sum()) > 0


def test_gate_per_head_starts_at_half_and_only_the_knn_layer_has_it() -> None:
    model = tiny_model("memorizing", n_layers=4)
    kinds = [type(m).__name__ for m in model.memories]
    assert kinds == ["MemorizingXL", "MemorizingXL", "MemorizingKNN", "MemorizingXL"]
    knn = model.memories[2]
    assert knn.gate_values().shape == (model.cfg.n_heads,)
    assert torch.allclose(knn.gate_values(), torch.full((model.cfg.n_heads,), 0.5))
    assert sum(1 for n, _ in model.named_parameters() if n.endswith("memory.gate.beta")) == 1


def test_temperature_and_gate_have_their_own_learning_rates() -> None:
    """scale_lr_mult scales log τ's learning rate (no decay); gate_lr_mult the gate's; nothing else moves."""
    from memzoo.core.model import MemoryModel

    cfg = MemorizingConfig(store_size=32, top_k=4, mem_len=8, gate_lr_mult=20.0, scale_lr_mult=50.0)
    model = MemoryModel(tiny_model_config(n_layers=4), "memorizing", cfg)
    knn = model.memories[2]
    lrs = {id(p): (g["lr"], g["weight_decay"]) for g in model.optim_groups(weight_decay=0.1, lr=1e-3)
           for p in g["params"]}
    assert lrs[id(knn.log_scale)] == (pytest.approx(5e-2), 0.0)
    assert lrs[id(knn.gate.beta)] == (pytest.approx(2e-2), 0.0)
    others = {lr for pid, (lr, _) in lrs.items() if pid not in (id(knn.log_scale), id(knn.gate.beta))}
    assert others == {1e-3}


def test_knn_layer_rule() -> None:
    index = lambda n, k=None: knn_layer_index(MemorizingConfig(knn_layer=k), tiny_model_config(n_layers=n))  # noqa: E731
    assert [index(n) for n in (1, 2, 4, 6, 12)] == [0, 1, 2, 4, 8]  # 12 layers: the 9th
    assert index(12, 3) == 3 and index(12, -1) == 11
    with pytest.raises(ValueError, match="knn_layer=12"):
        index(12, 12)


def test_footprint_counts_store_and_caches() -> None:
    from memzoo.core.config import ModelConfig

    paper = ModelConfig(d_model=1024, n_layers=12, n_heads=8, segment_len=2048)
    parts = MemorizingXL.footprint(MemorizingConfig(store_size=65536, mem_len=2048), paper, 32768)
    assert parts["total"] == 65536 * 256 * 8 + 50_331_648 == 184_549_376  # Table 2: 183M
    model = tiny_model("memorizing")
    with torch.no_grad():
        state = model(torch.randint(0, 256, (B, 2, 8))).state
    assert state_numbers(state.all(), B) == MemorizingXL.footprint(model.memory_cfg, model.cfg, 16)["total"]


def test_state_stays_float32_under_bf16_autocast() -> None:
    model = tiny_model("memorizing")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randint(0, 256, (B, 2, 8)))
    for st in out.state.layers:
        assert all(t.dtype == torch.float32 for name, t in st.items() if not name.endswith("valid"))
    assert torch.isfinite(out.logits).all()


def test_attention_never_runs_on_cudnn_sdpa(monkeypatch) -> None:
    """cuDNN's sdpa backward gave Memorizing wrong bf16 gradients on an H100 (its two layer kinds hand the
    attention output gradients of different layouts): every sdpa call of a bf16 training step, causal or
    masked, runs with that backend off, and the flag is restored after, also when the call raises."""
    import memzoo.core.attention as attention

    real, seen = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        seen.append((attn_mask is not None, torch.backends.cuda.cudnn_sdp_enabled()))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    torch.backends.cuda.enable_cudnn_sdp(True)
    model = tiny_model("memorizing").train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randint(0, 256, (B, 3, 8)))
    out.logits.float().sum().backward()
    assert [masked for masked, _ in seen] == [False, True, True] * 2  # 2 layers x 3 segments (no cache in segment 0)
    assert not any(on for _, on in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(RuntimeError):
        attention.sdpa(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 3, 5), torch.ones(1, 1, 3, 4), torch.ones(2, 3, dtype=torch.bool))
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="knn_backend='annoy'"):
        knn_module(backend="annoy")
    with pytest.raises(ValueError, match="store_size=0"):
        knn_module(store_size=0)


def test_faiss_backend_equals_exact() -> None:
    pytest.importorskip("faiss")
    store = random_store(48, [48, 10])
    q = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(8))
    q_hat = F.normalize(q, dim=-1)
    idx_e, ok_e = knn_exact(q_hat, store["k"], store["valid"], 16)
    idx_f, ok_f = knn_faiss(q_hat, store["k"], store["valid"], 16)
    assert torch.equal(ok_e, ok_f)
    assert torch.equal(torch.where(ok_e, idx_e, -1).sort(-1).values, torch.where(ok_f, idx_f, -1).sort(-1).values)
    exact, faiss_mem = knn_module(48, 16), knn_module(48, 16, backend="faiss")
    faiss_mem.load_state_dict(exact.state_dict())
    with torch.no_grad():
        assert torch.allclose(exact.read(q, store), faiss_mem.read(q, store), atol=1e-5)
        q5, k5, v5 = qkv(3, seed=9)
        assert torch.allclose(run(exact, q5, k5, v5)[0], run(faiss_mem, q5, k5, v5)[0], atol=1e-5)


def stream_grads(model, x: torch.Tensor, reset: torch.Tensor, plant=None) -> tuple[torch.Tensor, list]:
    """Logits of x [B, S, N] fed one segment at a time, and the gradients of their sum of squares.
    plant(state, s) may rewrite the state before segment s."""
    model.zero_grad(set_to_none=True)
    state, parts = model.initial_state(x.shape[0]), []
    for s in range(x.shape[1]):
        if plant is not None:
            state = plant(state, s)
        out = model(x[:, s : s + 1], state, reset[:, s : s + 1])
        state, parts = out.state, parts + [out.logits]
    logits = torch.cat(parts, dim=1)
    logits.square().sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_big_store_with_few_keys_equals_a_store_of_that_size_and_searches_only_them(monkeypatch) -> None:
    """Store 4,096 / XL cache 1,024 against both sized to the 32 keys pushed: identical logits and
    gradients; the search sees only the filled slots (up to the fullest row; row 1 restarts)."""
    x = torch.randint(0, 256, (B, 4, 8), generator=torch.Generator().manual_seed(9))
    reset = torch.zeros(B, 4, dtype=torch.bool)
    reset[1, 2] = True  # rows hold different numbers of keys from segment 2 on
    import memzoo.memories.memorizing as memorizing

    searched = []
    real = memorizing.knn_exact
    monkeypatch.setattr(memorizing, "knn_exact", lambda q, keys, *a: searched.append(keys.shape[1]) or real(q, keys, *a))
    big = tiny_model("memorizing", options={"store_size": 4096, "mem_len": 1024, "top_k": 4}).train()
    small = tiny_model("memorizing", options={"store_size": 32, "mem_len": 32, "top_k": 4}).train()
    logits_big, grads_big = stream_grads(big, x, reset)
    assert searched == [0, 8, 16, 24], "the search covers the filled slots, never the empty capacity"
    logits_small, grads_small = stream_grads(small, x, reset)
    assert torch.equal(logits_big, logits_small)
    assert len(grads_big) == len(grads_small) and all(torch.equal(a, b) for a, b in zip(grads_big, grads_small))


def test_nan_in_empty_store_slots_changes_nothing() -> None:
    """NaN planted in every empty store slot (inside the searched part too, in the row that restarted,
    which has fewer keys than top_k) reaches neither the logits nor the gradients."""
    x = torch.randint(0, 256, (B, 4, 8), generator=torch.Generator().manual_seed(10))
    reset = torch.zeros(B, 4, dtype=torch.bool)
    reset[1, 3] = True

    def plant(state, s: int):
        for st in state.layers:
            if "store_valid" in st:
                st["store_valid"] = st["store_valid"] & ~reset[:, s, None]  # the reset segment s will do
                empty = ~st["store_valid"][:, :, None, None]  # [B, C, 1, 1]
                st["store_k"] = st["store_k"].masked_fill(empty, float("nan"))
                st["store_v"] = st["store_v"].masked_fill(empty, float("nan"))
        return state

    model = tiny_model("memorizing", options={"store_size": 64, "mem_len": 8, "top_k": 4}).train()
    clean, clean_grads = stream_grads(model, x, reset)
    dirty, dirty_grads = stream_grads(model, x, reset, plant)
    assert torch.equal(clean, dirty)
    assert all(torch.equal(a, b) for a, b in zip(clean_grads, dirty_grads))


def test_push_filled_writes_what_fifo_push_writes_from_the_oldest_key_on() -> None:
    """Pushes of 3 into 10 slots with row resets: same valid mask as fifo_push, same contents on every
    slot a read can see (the filled part), whatever the untouched slots hold (NaN here)."""
    from memzoo.core.fifo import fifo_init, fifo_push, fifo_push_filled, fifo_reset, filled

    g = torch.Generator().manual_seed(11)
    ref = fifo_init(B, 10, {"k": (H, D)}, torch.device("cpu"))
    lazy = fifo_init(B, 10, {"k": (H, D)}, torch.device("cpu"), lazy=True)
    lazy["k"].fill_(float("nan"))  # what an uninitialised buffer may hold
    fills = []
    for s, reset_row in enumerate([None, None, 0, None, None, 1, None]):
        if reset_row is not None:
            rows = torch.arange(B) == reset_row
            ref, lazy = fifo_reset(ref, rows), fifo_reset(lazy, rows)
        new = {"k": torch.randn(B, 3, H, D, generator=g)}
        ref, lazy = fifo_push(ref, new)[0], fifo_push_filled(lazy, new)
        assert torch.equal(ref["valid"], lazy["valid"])
        seen_ref, seen_lazy = filled(ref), filled(lazy)
        assert torch.equal(seen_ref["k"], seen_lazy["k"]), f"push {s}"
        fills.append(seen_lazy["k"].shape[1])
        lazy["k"][:, : 10 - fills[-1]] = float("nan")  # slots before the filled part may hold anything
    assert fills == [3, 6, 9, 10, 10, 10, 10], "the stream reaches the full (shifting) case"


def test_faiss_search_runs_no_float32_torch_op_in_a_float64_model() -> None:
    """The faiss index is float32 only: its inputs are cast in numpy, so a float64 model with the faiss
    backend still executes no narrower torch op (the `precision` invariant, on that backend)."""
    pytest.importorskip("faiss")
    from memzoo.conformance.precision import check_precision
    from memzoo.conformance.tiny import TINY_OPTIONS

    check_precision("memorizing", {**TINY_OPTIONS["memorizing"], "knn_backend": "faiss"})
