"""Compressive Transformer: the reconstruction loss trains the compressor and nothing else, the LM
loss's gradient on W_K/W_V is untouched by it, and eviction, compression, the compressed memory's
capacity, pending states and resets match a hand computation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from conftest import tiny_model_config
from memzoo.core.attention import LocalAttention
from memzoo.core.memory import LayerInputs, state_numbers
from memzoo.core.model import MemoryModel
from memzoo.memories.compressive import CompressiveConfig, CompressiveTransformer

B, V = 2, 256


def model_with(seed: int = 0, **options) -> MemoryModel:
    """A tiny 2-layer model (d_model 32, N 8) whose memories evict from the second segment on."""
    torch.manual_seed(seed)
    opts = {"mem_len": 8, "cmem_len": 4, "compression_rate": 2, **options}
    model = MemoryModel(tiny_model_config(), "compressive", CompressiveConfig(**opts))
    return model.train()


def tokens(s: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, s, 8), generator=torch.Generator().manual_seed(seed))


def lm_loss(model: MemoryModel, x: torch.Tensor):
    out = model(x)
    logits = out.logits[:, :, :-1].reshape(-1, V)
    return F.cross_entropy(logits.float(), x[:, :, 1:].reshape(-1)), out.aux_loss


def is_zero(g: torch.Tensor | None) -> bool:
    return g is None or float(g.abs().max()) == 0.0


@pytest.mark.parametrize("checkpoint, cache", [(False, "hidden"), (True, "hidden"), (False, "kv")])
def test_reconstruction_loss_reaches_the_compressor_and_nothing_else(checkpoint: bool, cache: str) -> None:
    model = model_with(cache=cache)
    model.cfg.checkpoint_activations = checkpoint
    _, aux = lm_loss(model, tokens(4))
    assert float(aux.detach()) > 0, "no reconstruction loss although states were evicted and compressed"
    aux.backward()
    compressor = {n: p for n, p in model.named_parameters() if ".compressor." in n}
    assert len(compressor) == 2 * model.cfg.n_layers  # conv weight and bias per layer
    for name, p in compressor.items():
        assert not is_zero(p.grad), f"the reconstruction loss does not reach {name}"
    for name, p in model.named_parameters():
        if name not in compressor:
            assert is_zero(p.grad), f"the reconstruction loss leaked into {name}"


def test_lm_gradient_on_wk_wv_is_the_same_with_or_without_the_reconstruction_loss() -> None:
    model = model_with()
    assert all(p.requires_grad for p in model.parameters()), "a parameter was frozen"
    lm, aux = lm_loss(model, tokens(4))
    assert float(aux.detach()) > 0
    qkv = [b.attn.qkv.weight for b in model.blocks]
    comp = [p for n, p in model.named_parameters() if ".compressor." in n]
    g_lm = torch.autograd.grad(lm, qkv + comp, retain_graph=True, allow_unused=True)
    g_all = torch.autograd.grad(lm + 3.0 * aux, qkv, retain_graph=True)
    d = model.cfg.d_model
    for g, h in zip(g_lm[: len(qkv)], g_all):
        assert float(g[d:].abs().max()) > 0, "the LM loss does not train W_K/W_V (frozen or detached?)"
        assert torch.allclose(g, h, rtol=0, atol=1e-7), "the reconstruction loss changed the gradient on W_Q/W_K/W_V"
    assert all(is_zero(g) for g in g_lm[len(qkv) :]), "the LM loss reached the compressor"


def test_memory_keys_and_values_use_the_current_weights_with_gradient() -> None:
    """Both memories' keys/values come from project_kv with the live W_K/W_V: the read trains them."""
    mem = plugin(2, 4, 2)
    w = torch.randn(2 * H * D, H * D, requires_grad=True)  # W_K; W_V, independent of the segment's q/k/v

    def project_kv(t: torch.Tensor):
        k, v = rearrange(F.linear(t, w), "b m (two h d) -> two b h m d", two=2, h=H)
        return k, v

    def run(h: torch.Tensor, state):
        qkv = rearrange(h, "b n (h d) -> b h n d", h=H)[:, None]
        x = LayerInputs(h[:, None], qkv, qkv, qkv, torch.zeros(B, 1, dtype=torch.bool), LocalAttention(10000.0), project_kv)
        return mem(x, state)

    g = torch.Generator().manual_seed(0)
    state = mem.initial_state(B, torch.device("cpu"))
    _, state, _ = run(torch.randn(B, 6, H * D, generator=g), state)  # fills m (2) and cm (2)
    out, _, _ = run(torch.randn(B, 3, H * D, generator=g), state)
    (grad,) = torch.autograd.grad(out.square().sum(), w)
    assert float(grad.abs().max()) > 0, "memory keys/values carry no gradient to W_K/W_V"


# ---- eviction, compression, capacity and reset against a hand computation ------------------------
H, D = 2, 4


def plugin(mem_len: int, cmem_len: int, rate: int, compression: str = "mean", cache: str = "hidden") -> CompressiveTransformer:
    cfg = CompressiveConfig(mem_len=mem_len, cmem_len=cmem_len, compression_rate=rate, compression=compression, cache=cache)
    return CompressiveTransformer(cfg, tiny_model_config(d_model=H * D, n_heads=H), 0)


def split_heads(t: torch.Tensor, fixed_weights: bool = False):
    heads = rearrange(t, "b m (h d) -> b h m d", h=H)
    return heads, heads


def step(mem: CompressiveTransformer, h: torch.Tensor, state, reset: torch.Tensor):
    """One segment h [B, n, d] through the plugin: queries and keys are h itself, values 2 h (so a kv slot is
    [h | 2 h], and keys swapped with values would show)."""
    qk = rearrange(h, "b n (h d) -> b h n d", h=H)[:, None]  # [B, 1, H, n, D]
    x = LayerInputs(h[:, None], qk, qk, 2 * qk, reset[:, None], LocalAttention(10000.0), split_heads)
    _, state, _ = mem(x, state)
    return state


def valid_slots(state, part: str, row: int) -> torch.Tensor:
    return state[part][row][state[f"{part}_valid"][row]]


def hand(stream: torch.Tensor, mem_len: int, cmem_len: int, rate: int, pool) -> dict[str, torch.Tensor]:
    """The paper's memories after a document's states stream [T, d], computed directly."""
    t = stream.shape[0]
    evicted = stream[: max(0, t - mem_len)]
    whole = evicted.shape[0] // rate * rate
    groups = [pool(evicted[i : i + rate]) for i in range(0, whole, rate)]
    cmem = torch.stack(groups[-cmem_len:]) if groups and cmem_len else stream[:0]
    return {"mem": stream[-mem_len:], "cmem": cmem, "pend": evicted[whole:]}


@pytest.mark.parametrize("cache", ["hidden", "kv"])
@pytest.mark.parametrize("compression,pool", [("mean", lambda g: g.mean(0)), ("max", lambda g: g.amax(0))])
def test_eviction_order_compression_capacity_pending_and_reset(compression: str, pool, cache: str) -> None:
    """Segments of 3 (one partial of 1) through mem_len 4, cmem_len 3, c 2; row 1 resets at segment 4.
    With cache=kv a slot is [k | v], here [h | 2 h] (`step` gives the segment h as its keys, 2 h as its values)."""
    mem_len, cmem_len, rate = 4, 3, 2
    mem = plugin(mem_len, cmem_len, rate, compression, cache)
    g = torch.Generator().manual_seed(0)
    lengths = [3, 3, 3, 3, 3, 3, 1, 3]
    resets = {4}
    state = mem.initial_state(B, torch.device("cpu"))
    seen: list[list[torch.Tensor]] = [[], []]
    longest_cmem, most_pending = 0, 0
    for s, n in enumerate(lengths):
        h = torch.randn(B, n, H * D, generator=g)
        reset = torch.tensor([False, s in resets])
        if s in resets:
            seen[1] = []
        state = step(mem, h, state, reset)
        for row in range(B):
            seen[row].append(torch.cat((h[row], 2 * h[row]), -1) if cache == "kv" else h[row])
            want = hand(torch.cat(seen[row]), mem_len, cmem_len, rate, pool)
            for part in ("mem", "cmem", "pend"):
                got = valid_slots(state, part, row)
                assert got.shape == want[part].shape, f"segment {s} row {row} {part}: {got.shape} vs {want[part].shape}"
                assert torch.allclose(got, want[part], atol=1e-6), f"segment {s} row {row}: wrong {part}"
            longest_cmem = max(longest_cmem, len(valid_slots(state, "cmem", row)))
            most_pending = max(most_pending, len(valid_slots(state, "pend", row)))
    assert longest_cmem == cmem_len, "the stream never filled the compressed memory (vacuous)"
    assert most_pending == rate - 1, "the stream never left a pending state (vacuous)"


@pytest.mark.parametrize("cache", ["hidden", "kv"])
def test_mean_pooling_by_hand_and_conv_starts_as_mean(cache: str) -> None:
    """Six states 0..5 (value t + channel / 10 in each channel), mem_len 2, c 2: cm = [0.5, 2.5], m = [4, 5]
    plus the channel's offset, in every channel (a conv mixing channels would not); with cache=kv the values
    (2 h) twice that, apart from the keys."""
    for compression in ("mean", "conv", "depthwise-conv"):
        mem = plugin(2, 4, 2, compression, cache)
        h = torch.arange(6.0)[None, :, None] + torch.arange(H * D)[None, None, :] / 10  # [1, 6, H·D]
        state = step(mem, h.expand(B, -1, -1), mem.initial_state(B, torch.device("cpu")), torch.zeros(B, dtype=torch.bool))
        cm = torch.tensor([[0.5], [2.5]]) + torch.arange(H * D) / 10  # [2, H·D]: the groups' means
        m = torch.tensor([[4.0], [5.0]]) + torch.arange(H * D) / 10
        if cache == "kv":  # [k | v] = [h | 2 h]
            cm, m = torch.cat((cm, 2 * cm), -1), torch.cat((m, 2 * m), -1)
        assert torch.allclose(valid_slots(state, "cmem", 0), cm, atol=1e-6)
        assert torch.allclose(valid_slots(state, "mem", 0), m, atol=1e-6)


def test_reset_clears_both_memories_and_pending() -> None:
    mem = plugin(2, 4, 2)
    h = torch.randn(B, 5, H * D)
    state = step(mem, h, mem.initial_state(B, torch.device("cpu")), torch.zeros(B, dtype=torch.bool))
    assert all(bool(state[f"{p}_valid"].any(dim=1).all()) for p in ("mem", "cmem", "pend"))
    cleared = mem.reset_rows(state, torch.tensor([True, False]))
    for part in ("mem", "cmem", "pend"):
        assert not bool(cleared[f"{part}_valid"][0].any()), f"reset left {part} slots in row 0"
        assert torch.equal(cleared[f"{part}_valid"][1], state[f"{part}_valid"][1]), f"reset touched row 1's {part}"


def test_prefix_positions_memory_then_compressed_spaced_by_rate() -> None:
    """m slot i at i - mem_len; the pending state just before; cm slot j at the centre of its c states,
    further back by c per slot."""
    mem = plugin(4, 3, 2)
    h = torch.randn(B, 11, H * D)  # 7 evicted: 3 groups and 1 pending state
    state = step(mem, h, mem.initial_state(B, torch.device("cpu")), torch.zeros(B, dtype=torch.bool))
    x = LayerInputs(h[:, None], *([rearrange(h, "b n (h d) -> b h n d", h=H)[:, None]] * 3),
                    torch.zeros(B, 1, dtype=torch.bool), LocalAttention(10000.0), split_heads).segment(0)
    pos = mem.memory_prefix(x, state).pos[0]
    # Document positions before the segment: states -11..-1; m = -4..-1, pending -5, groups (-11,-10), (-9,-8), (-7,-6).
    assert torch.equal(pos, torch.tensor([-10.5, -8.5, -6.5, -5.0, -4.0, -3.0, -2.0, -1.0]))


@pytest.mark.parametrize("cache, width", [("hidden", 32), ("kv", 2 * 2 * 16)])
def test_state_float32_under_autocast_and_footprint_counts_pending(cache: str, width: int) -> None:
    """The state is what the footprint counts: w (d_model 32, or a key and a value of 2 heads × 16) a slot;
    "table1" stays the paper's count of hidden states."""
    model = model_with(mem_len=8, cmem_len=4, compression_rate=3, cache=cache)
    x = tokens(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lm, aux = lm_loss(model, x)
        out = model(x)
    (lm + aux).backward()
    assert all(v.dtype in (torch.float32, torch.bool) for st in out.state.layers for v in st.values())
    parts = CompressiveTransformer.footprint(model.memory_cfg, model.cfg, 24)
    assert state_numbers(out.state.all(), B) == parts["total"] == width * (8 + 4 + 2) * 2
    assert parts["table1"] == 32 * (8 + 4) * 2  # the paper's count (hidden states), whatever the cache


# ---- empty capacity costs nothing; pending states are attended ---------------------------------------
def test_big_capacity_equals_capacity_sized_to_the_states_held_and_projects_only_them(monkeypatch) -> None:
    """cmem_len 1,024 against 16 (the most slots 5 segments of 8 compress into at c 2), mem_len 8: the
    same logits, loss and gradients; the prefix holds the filled slots only (row 1 restarts)."""
    x = tokens(5, seed=3)
    reset = torch.zeros(B, 5, dtype=torch.bool)
    reset[1, 3] = True
    sizes = []
    real = CompressiveTransformer.memory_prefix

    def spy(self, x, state):
        prefix = real(self, x, state)
        sizes.append(prefix.k.shape[2])
        return prefix

    monkeypatch.setattr(CompressiveTransformer, "memory_prefix", spy)
    results = []
    for cmem_len in (1024, 16):
        model = model_with(mem_len=8, cmem_len=cmem_len)
        out = model(x, None, reset)
        (out.logits.square().sum() + out.aux_loss).backward()
        results.append((out.logits, out.aux_loss, [p.grad for p in model.parameters()]))
    (logits_big, aux_big, grads_big), (logits_small, aux_small, grads_small) = results
    assert sizes[:5] == [0, 8, 12, 16, 20], "per segment: m (8) + the compressed slots so far (4 per segment)"
    assert sizes[5:10] == sizes[:5], "layer 2 sees the same"
    assert torch.equal(logits_big, logits_small) and torch.equal(aux_big, aux_small)
    assert all(torch.equal(a, b) for a, b in zip(grads_big, grads_small))


def test_pending_states_are_attended() -> None:
    """A valid pending state changes the next segment's output; an empty pending slot does not."""
    mem = plugin(4, 3, 3)
    g = torch.Generator().manual_seed(4)
    state = step(mem, torch.randn(B, 9, H * D, generator=g), mem.initial_state(B, torch.device("cpu")),
                 torch.zeros(B, dtype=torch.bool))  # 5 evicted: 1 group of 3, 2 pending
    state = mem.reset_rows(state, torch.tensor([False, True]))  # row 1: nothing pending
    assert state["pend_valid"].tolist() == [[True, True], [False, False]]

    def output(st):
        h = torch.randn(B, 2, H * D, generator=torch.Generator().manual_seed(5))
        qkv = rearrange(h, "b n (h d) -> b h n d", h=H)[:, None]
        x = LayerInputs(h[:, None], qkv, qkv, qkv, torch.zeros(B, 1, dtype=torch.bool), LocalAttention(10000.0),
                        split_heads)
        return mem(x, st)[0]

    base = output(state)
    moved = {k: t.clone() for k, t in state.items()}
    moved["pend"] += 3.0  # both rows: row 0's states are real, row 1's slots are empty
    changed = output(moved)
    assert not torch.allclose(base[0], changed[0], atol=1e-3), "row 0's pending states were not attended"
    assert torch.equal(base[1], changed[1]), "an empty pending slot was attended"


def test_masked_attention_is_the_softmax_formula_with_an_empty_row() -> None:
    """masked_attention == softmax(q kᵀ / √D over the valid keys) v in float64, values and gradients;
    a row with no valid key averages every value, with finite gradients (the loss masks such a row out,
    as the reconstruction loss does)."""
    from memzoo.memories.compressive import masked_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    k, v = k[:, :, :4].detach().requires_grad_(), v[:, :, :4].detach().requires_grad_()  # M = 4 keys
    valid = torch.tensor([[True, False, True, True], [False, False, False, False], [True, True, True, False]])
    out = masked_attention(q, k, v, valid)
    ref = []
    for b in range(3):
        keep = valid[b] if valid[b].any() else torch.ones(4, dtype=torch.bool)  # none valid: all, uniformly
        scores = q[b] @ k[b, :, keep].transpose(-1, -2) / 2.0  # √D = 2
        if not valid[b].any():
            scores = torch.zeros_like(scores)
        ref.append(scores.softmax(-1) @ v[b, :, keep])
    ref = torch.stack(ref)
    assert torch.allclose(out, ref, atol=1e-12)
    rows = valid.any(dim=1)[:, None, None, None]
    grads = torch.autograd.grad((out.square() * rows).sum(), (q, k, v), retain_graph=True)
    ref_grads = torch.autograd.grad((ref.square() * rows).sum(), (q, k, v))
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads, ref_grads))
    assert all(torch.isfinite(gr).all() for gr in torch.autograd.grad(out.square().sum(), (q, k, v)))


def test_a_kv_compressor_compresses_keys_and_values_apart() -> None:
    """With cache=kv the conv has one filter bank for keys and one for values: trained (random) weights
    still give compressed keys that do not move with the values, nor compressed values with the keys."""
    torch.manual_seed(0)
    f = plugin(2, 4, 2, "conv", "kv").compressor  # slots [k | v] of H·D = 8 each
    with torch.no_grad():
        f.conv.weight.normal_()
        x = torch.randn(2, 6, 16)
        moved_values, moved_keys = x.clone(), x.clone()
        moved_values[..., 8:] += 1.0
        moved_keys[..., :8] += 1.0
        base, by_values, by_keys = f(x), f(moved_values), f(moved_keys)
    assert torch.equal(base[..., :8], by_values[..., :8]) and not torch.allclose(base[..., 8:], by_values[..., 8:])
    assert torch.equal(base[..., 8:], by_keys[..., 8:]) and not torch.allclose(base[..., :8], by_keys[..., :8])
