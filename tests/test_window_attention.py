"""The backbone's sliding window (model.attention_span = W, memzoo.core.window).

Windowed segment attention, one call or streamed, equals full causal attention over the whole
sequence cut to the last W positions (an explicit [L, L] band, absolute RoPE, plain softmax), in
values and gradients; W = 0 is today's model bit for bit; every memory composes with it; XL's cache
holds what has left the window; the window is backbone state with its own footprint.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.core.attention import LocalAttention, rope
from memzoo.core.config import ConfigError, ModelConfig
from memzoo.core.memory import state_numbers
from memzoo.core.model import MemoryModel, ModelState
from memzoo.core.plugins import registered
from memzoo.core.window import slide, window_init
from memzoo.memories.xl import XLConfig
from memzoo.runs.checkpoints import carried_state, save_checkpoint
from memzoo.conformance.tiny import tiny_memory_config

B, H, N, D, W, BASE = 2, 2, 6, 4, 4, 10000.0
FULL_SEGMENTS, LAST = 3, 4  # three whole segments, then a partial one of LAST positions


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int, doc: torch.Tensor) -> torch.Tensor:
    """Causal attention over the whole sequence, each query seeing the last `span` positions of its own
    document: q, k, v [B, H, L, D] (no positional encoding), doc [B, L] document ids. [B, H, L, D]"""
    length = q.shape[2]
    pos = torch.arange(length)
    q_r, k_r = rope(q, pos, BASE), rope(k, pos, BASE)  # absolute positions
    band = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < span)  # [L, L]
    mask = band[None] & (doc[:, :, None] == doc[:, None, :])  # [B, L, L]
    scores = torch.einsum("bhid,bhjd->bhij", q_r, k_r) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", scores.softmax(-1), v)


def qkv(seed: int = 0) -> list[torch.Tensor]:
    """Leaf q, k, v [B, H, L, D] in float64 with gradient (L = 3 whole segments + a partial one)."""
    g = torch.Generator().manual_seed(seed)
    length = FULL_SEGMENTS * N + LAST
    return [torch.randn(B, H, length, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def resets() -> torch.Tensor:
    """[B, 4] document starts: row 0 starts a new document at segment 2, row 1 never."""
    r = torch.zeros(B, FULL_SEGMENTS + 1, dtype=torch.bool)
    r[0, 2] = True
    return r


def docs(reset: torch.Tensor) -> torch.Tensor:
    """Document id of every position: [B, L]."""
    per_segment = torch.cumsum(reset.long(), 1)  # [B, 4]
    sizes = torch.tensor([N] * FULL_SEGMENTS + [LAST])
    return per_segment.repeat_interleave(sizes, dim=1)


def windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reset: torch.Tensor, one_shot: bool) -> torch.Tensor:
    """The backbone's path: the whole segments in one call (or one at a time), then the partial one,
    through the carried window. [B, H, L, D]"""
    attend = LocalAttention(BASE, "sdpa")
    state = window_init(B, W, H, D, q.device, q.dtype)
    split = lambda t, a, b: t[:, :, a * N : a * N + (b - a) * N]  # noqa: E731  [B, H, (b - a) N, D]
    calls = [(0, FULL_SEGMENTS)] if one_shot else [(s, s + 1) for s in range(FULL_SEGMENTS)]
    outs = []
    for a, b in calls:
        segs = [split(t, a, b).unflatten(2, (b - a, N)).transpose(1, 2) for t in (q, k, v)]  # [B, S, H, N, D]
        window, state = slide(state, segs[1], segs[2], reset[:, a:b], W)
        flat = [t.flatten(0, 1) for t in segs]  # [B S, H, N, D] batch-major, as LayerInputs.local_attention
        out = attend.with_window(window)(*flat).unflatten(0, (B, b - a))  # [B, S, H, N, D]
        outs.append(out.transpose(1, 2).flatten(2, 3))
    last = [t[:, :, FULL_SEGMENTS * N :][:, None] for t in (q, k, v)]  # [B, 1, H, LAST, D]
    window, state = slide(state, last[1], last[2], reset[:, FULL_SEGMENTS:], W)
    outs.append(attend.with_window(window)(*(t[:, 0] for t in last)))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("one_shot", [True, False], ids=["one-shot", "streamed"])
def test_windowed_attention_equals_banded_full_attention(one_shot: bool) -> None:
    """Values and gradients w.r.t. q, k, v, with a partial last segment and a row reset at segment 2."""
    q, k, v = qkv()
    reset = resets()
    weights = torch.randn(B, H, q.shape[2], D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = reference(q, k, v, W, docs(reset))
    ref_grads = torch.autograd.grad((ref * weights).sum(), (q, k, v))
    got = windowed(q, k, v, reset, one_shot)
    grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    assert (got - ref).abs().max() < 1e-12
    for g, r in zip(grads, ref_grads):
        assert (g - r).abs().max() < 1e-12


def test_window_of_span_one_and_a_whole_segment() -> None:
    """W = 1 (each query only itself) and W = N (the previous segment's N - 1 last positions) match too."""
    global W
    q, k, v = qkv(1)
    reset = resets()
    saved = W
    try:
        for span in (1, N):
            W = span
            ref = reference(q, k, v, span, docs(reset))
            assert (windowed(q, k, v, reset, True) - ref).abs().max() < 1e-12, f"W={span}"
    finally:
        W = saved


def model(method: str = "local", span: int = W, seed: int = 0, layers: int = 2, options=None, **kw) -> MemoryModel:
    """A float64 tiny model with the window (segments of N)."""
    return tiny_model(method, seed=seed, options=options, attention_span=span, segment_len=N, n_layers=layers,
                      **kw).double()


def byte_tokens(seed: int = 1, s: int = FULL_SEGMENTS) -> torch.Tensor:
    return torch.randint(0, 256, (B, s, N), generator=torch.Generator().manual_seed(seed))


def test_local_model_equals_one_long_segment() -> None:
    """`local` with W over segments (one call, and streamed through the state) equals the same weights
    run as one segment of the whole sequence (where the band alone is the sliding window): logits and
    parameter gradients; row 0 reset at segment 2 equals a fresh run of its document."""
    x = byte_tokens(s=4)
    reset = torch.zeros(B, 4, dtype=torch.bool)
    reset[0, 2] = True
    seg = model()
    long = tiny_model("local", attention_span=W, segment_len=4 * N, n_layers=2).double()
    long.load_state_dict(seg.state_dict())

    def param_grads(m: MemoryModel, logits: torch.Tensor) -> list[torch.Tensor]:
        m.zero_grad()
        logits[..., ::16].pow(2).sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    one = seg(x, reset=reset).logits  # [B, 4, N, V]
    g_one = param_grads(seg, one)
    state, parts = seg.initial_state(B), []
    for s in range(4):
        out = seg(x[:, s : s + 1], state, reset[:, s : s + 1])
        state = out.state
        parts.append(out.logits)
    streamed = torch.cat(parts, 1)
    g_streamed = param_grads(seg, streamed)
    assert (one - streamed).abs().max() < 1e-12
    assert all((a - b).abs().max() < 1e-12 for a, b in zip(g_one, g_streamed))

    # row 1: one document of 4 segments; row 0: segments 2, 3 are a document of their own
    ref1 = long(x[1:2].reshape(1, 1, 4 * N)).logits.view(1, 4, N, -1)
    ref0 = tiny_model("local", attention_span=W, segment_len=2 * N, n_layers=2).double()
    ref0.load_state_dict(seg.state_dict())
    ref0 = ref0(x[0:1, 2:].reshape(1, 1, 2 * N)).logits.view(1, 2, N, -1)
    assert (one[1:2] - ref1).abs().max() < 1e-12
    assert (one[0:1, 2:] - ref0).abs().max() < 1e-12
    # gradients of row 1 against the long segment's
    g_long = param_grads(long, torch.cat([long(x[1:2].reshape(1, 1, 4 * N)).logits.view(1, 4, N, -1)]))
    g_row1 = param_grads(seg, seg(x[1:2]).logits)
    assert all((a - b).abs().max() < 1e-11 for a, b in zip(g_row1, g_long))


def test_window_sees_exactly_w_positions_back() -> None:
    """1-layer `local`: the output at t changes with the byte at t - W + 1 (previous segment) and not t - W."""
    m = model(layers=1)
    x = byte_tokens()
    t = 2 * N  # segment 2's first position
    with torch.no_grad():
        base = m(x).logits.flatten(1, 2)[:, t]
        for back, moves in ((W - 1, True), (W, False)):
            y = x.clone().flatten(1)
            y[:, t - back] = (y[:, t - back] + 1) % 256
            diff = (m(y.view_as(x)).logits.flatten(1, 2)[:, t] - base).abs().max()
            assert (diff > 1e-9) == moves, f"byte {back} back: diff {diff:.1e}"


def test_span_zero_is_todays_model_bit_for_bit() -> None:
    """attention_span=0 and a config without the key give the same logits and no window state; the
    golden logits of tests/test_hook_pin.py hold at W = 0 (checked there)."""
    cfg = tiny_model_config()
    assert cfg.attention_span == 0
    fields = {k: getattr(cfg, k) for k in ("d_model", "n_layers", "n_heads", "segment_len", "mlp_ratio")}
    x = byte_tokens()
    for method in ("local", "xl", "titans-mag", "rmt"):
        torch.manual_seed(0)
        a = MemoryModel(ModelConfig(**fields), method, tiny_memory_config(method))
        torch.manual_seed(0)
        b = MemoryModel(ModelConfig(**fields, attention_span=0), method, tiny_memory_config(method))
        with torch.no_grad():
            oa, ob = a(x), b(x)
        assert torch.equal(oa.logits, ob.logits), method
        assert oa.state.window == [] and ob.state.window == []
        assert not torch.equal(oa.logits, MemoryModel(ModelConfig(**fields, attention_span=3), method,
                                                      tiny_memory_config(method))(x).logits), method


@pytest.mark.parametrize("method", sorted(registered()))
def test_every_memory_composes_streaming_equals_one_call(method: str) -> None:
    """Every registered memory runs with W > 0; streamed segment by segment equals one call (a reset row)."""
    m = model(method, options=None)
    x = byte_tokens(s=4)
    reset = torch.zeros(B, 4, dtype=torch.bool)
    reset[0, 2] = True
    with torch.no_grad():
        one = m(x, reset=reset).logits
        state, parts = m.initial_state(B), []
        for s in range(4):
            out = m(x[:, s : s + 1], state, reset[:, s : s + 1])
            state = out.state
            parts.append(out.logits)
    assert (one - torch.cat(parts, 1)).abs().max() < 1e-10
    uses = m.spec.cls.uses_window
    assert [bool(w) for w in state.window] == [uses] * 2


def test_full_opts_out() -> None:
    """`full` sets uses_window False: no window state and the same logits as at W = 0."""
    x = byte_tokens()
    with torch.no_grad():
        a, b = model("full", span=W)(x), model("full", span=0)(x)
    assert torch.equal(a.logits, b.logits)
    assert a.state.window == [{}, {}] and model("full").window_footprint()["total"] == 0


def reach_positions(m: MemoryModel, t: int, x: torch.Tensor) -> set[int]:
    """Positions whose byte changes the output at position t (a 1-layer model)."""
    flat = x.flatten(1)
    with torch.no_grad():
        base = m(x).logits.flatten(1, 2)[0, t]
        out = set()
        for p in range(t + 1):
            y = flat.clone()
            y[0, p] = (y[0, p] + 1) % 256
            if (m(y.view_as(x)).logits.flatten(1, 2)[0, t] - base).abs().max() > 1e-9:
                out.add(p)
    return out


@pytest.mark.parametrize("cache", ["hidden", "kv"])
def test_xl_cache_holds_what_left_the_window(cache: str) -> None:
    """1-layer XL, mem_len M, window W: the segment's first query sees t-(W+M-1) .. t exactly with
    beyond_window; with beyond_window=False the cache repeats the window and it sees t-M .. t."""
    mem_len, t = 6, 3 * N
    x = byte_tokens(s=4)
    beyond = model("xl", layers=1, options={"mem_len": mem_len, "cache": cache})
    assert reach_positions(beyond, t, x) == set(range(t - (W + mem_len - 1), t + 1))
    plain = model("xl", layers=1, options={"mem_len": mem_len, "cache": cache, "beyond_window": False})
    assert reach_positions(plain, t, x) == set(range(t - mem_len, t + 1))
    assert XLConfig().beyond_window is True


@pytest.mark.parametrize("cache", ["hidden", "kv"])
@pytest.mark.parametrize("cmem_len, rate, beyond, plain", [
    (0, 1, range(3 * N - (W + 6 - 1), 3 * N + 1), range(3 * N - 6, 3 * N + 1)),  # the FIFO alone: XL's reach
    # M = 4, two compressed slots of c = 2 (mean), worked by hand for t = 18 (N = 6, W = 4): with the window
    # the FIFO of 4 + 3 holds 11..17 (11..14 attended), 10 waits in the pending buffer, cm holds (6,7), (8,9);
    # without it the FIFO holds 14..17, cm (10,11), (12,13)
    (2, 2, range(6, 3 * N + 1), range(10, 3 * N + 1)),
])
def test_compressive_memories_hold_what_left_the_window(cmem_len: int, rate: int, beyond: range, plain: range,
                                                       cache: str) -> None:
    """1-layer Compressive on the window: every part (FIFO, pending, compressed) sits behind the window
    with beyond_window, so the segment's first query reaches W - 1 positions further; without it the
    FIFO repeats the window. The same whether a slot holds the hidden state or the key and value."""
    mem_len = 6 if cmem_len == 0 else 4
    x = byte_tokens(s=4)
    opts = {"mem_len": mem_len, "cmem_len": cmem_len, "compression_rate": rate, "compression": "mean", "cache": cache}
    assert reach_positions(model("compressive", layers=1, options=opts), 3 * N, x) == set(beyond)
    assert reach_positions(model("compressive", layers=1, options={**opts, "beyond_window": False}), 3 * N, x) == set(plain)


def attended_positions(m: MemoryModel, read, state) -> list[float]:
    """The positions of the cache a memory's attention gets as its prefix, row 0 (`read(x, state)` calls x.attend)."""
    from types import SimpleNamespace

    seen = {}
    z = torch.zeros(B, m.cfg.n_heads, N, m.cfg.d_head, dtype=torch.float64)

    def attend(q, k, v, prefix=None):
        seen["pos"] = prefix.pos
        return z

    x = SimpleNamespace(q=z, k=z, v=z, h=torch.zeros(B, N, m.cfg.d_model, dtype=torch.float64), attend=attend,
                        project_kv=lambda h: (h[:, None], h[:, None]))
    read(x, state)
    pos = seen["pos"]
    return (pos if pos.dim() == 1 else pos[0]).tolist()


def shut_knn_read(m: MemoryModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memorizing's kNN gate shut (b = -1e4: sigmoid is 0 in float64): what is left is its XL cache."""
    with torch.no_grad():
        m.memories[0].gate.beta.fill_(-1e4)


def zero_ltm_read(m: MemoryModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ∞-former's long-term read zeroed (it reaches further than the STM): what is left is the STM."""
    from memzoo.memories.infty_former import InftyFormer

    real = InftyFormer.long_term

    def no_read(self, q, *args, **kw):
        z, *rest = real(self, q, *args, **kw)
        return (z * 0, *rest)

    monkeypatch.setattr(InftyFormer, "long_term", no_read)


@pytest.mark.parametrize("method, options, read, isolate, slot", [
    ("memorizing", {"store_size": 4, "top_k": 2}, "local", shut_knn_read, lambda c: 2 * c.n_heads * c.d_head),
    ("infty-former", {"n_basis": 8, "n_samples": 8}, "short_term", zero_ltm_read, lambda c: c.d_model),
    ("infty-former", {"n_basis": 8, "n_samples": 8, "cache": "kv"}, "short_term", zero_ltm_read,
     lambda c: c.d_model + 2 * c.n_heads * c.d_head),  # an STM slot keeps its hidden state, key and value
])
def test_caches_of_the_previous_positions_hold_what_left_the_window(method, options, read, isolate, slot,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Memorizing's XL cache and the ∞-former's STM (M = 6) on the window, 1 layer, the other read off:
    the first query of segment 3 reaches t-(W+M-1) .. t with beyond_window and t-M .. t without; the
    measured state (cache with its delay line) is the footprint; the cache of 6 + 3 holds 9..17 and the
    attention gets 9..14 at -9 .. -4 (the delay line, the window's, is not attended)."""
    mem_len, t = 6, 3 * N
    x = byte_tokens(s=4)
    for beyond, expected in ((True, range(t - (W + mem_len - 1), t + 1)), (False, range(t - mem_len, t + 1))):
        m = model(method, layers=1, options={**options, "mem_len": mem_len, "beyond_window": beyond})
        isolate(m, monkeypatch)
        assert reach_positions(m, t, x) == set(expected)
    monkeypatch.undo()
    m = model(method, options={**options, "mem_len": mem_len})
    parts = m.spec.cls.footprint(m.memory_cfg, m.cfg, 3 * N)
    with torch.no_grad():
        state = m(byte_tokens()).state
        assert state_numbers(state.all(), B) == parts["total"]
        assert attended_positions(m, getattr(m.memories[0], read), state.layers[0]) == [-9, -8, -7, -6, -5, -4]
    assert parts["window_delay"] == slot(m.cfg) * (W - 1) * 2


def test_compressive_footprint_and_lookback_with_the_window() -> None:
    """Compressive's measured state (FIFO with its delay line, pending, compressed) equals its footprint."""
    opts = {"mem_len": 4, "cmem_len": 2, "compression_rate": 2, "compression": "mean"}
    m = model("compressive", options=opts)
    with torch.no_grad():
        state = m(byte_tokens()).state
    parts = m.spec.cls.footprint(m.memory_cfg, m.cfg, 3 * N)
    assert state_numbers(state.all(), B) == parts["total"] and parts["window_delay"] == m.cfg.d_model * (W - 1) * 2
    assert m.spec.cls.lookback(m.memory_cfg, m.cfg) == [4 + W - 1 + 2 * 2] * 2
    # the positions attended after three segments (hand-worked above): FIFO -(W-1)-4 .. -W, pending
    # -(W-1)-5, compressed slots at their pairs' centres behind it
    from types import SimpleNamespace

    layer = m.memories[0]
    x = SimpleNamespace(q=torch.zeros(1, dtype=torch.float64), h=torch.zeros(1, dtype=torch.float64),
                        project_kv=lambda h: (h[:, None], h[:, None]))
    prefix = layer.memory_prefix(x, {k: v for k, v in state.layers[0].items()})
    assert prefix.pos[0].tolist() == [-11.5, -9.5, -8.0, -7.0, -6.0, -5.0, -4.0]


def test_xl_footprint_and_lookback_with_the_window() -> None:
    """XL's measured state (cache + delay line) equals its analytic footprint; its lookback is M + W - 1."""
    opts = {"mem_len": 6, "cache": "hidden"}
    m = model("xl", options=opts)
    with torch.no_grad():
        state = m(byte_tokens()).state
    parts = m.spec.cls.footprint(m.memory_cfg, m.cfg, 3 * N)
    assert state_numbers(state.all(), B) == parts["total"]
    assert parts["window_delay"] == m.cfg.d_model * (W - 1) * 2
    assert m.spec.cls.lookback(m.memory_cfg, m.cfg) == [6 + W - 1] * 2


def test_window_state_footprint_reset_and_checkpoint(tmp_path: Path) -> None:
    """The window is backbone state: 2 x H x D x (W - 1) x layers numbers, apart from the memory's;
    a reset row's window is masked; it survives a checkpoint and is cut by detach."""
    m = model("local")
    x = byte_tokens()
    out = m(x)
    assert state_numbers(out.state.window, B) == m.window_footprint()["total"] == 2 * 2 * 16 * (W - 1) * 2
    assert state_numbers(out.state.all(), B) == 0  # the memory (none) holds nothing
    assert all(bool(w["valid"].all()) for w in out.state.window)
    assert out.state.window[0]["k"].requires_grad and not out.state.detach().window[0]["k"].requires_grad

    reset = torch.tensor([[True], [False]])
    nxt = byte_tokens(seed=5, s=1)
    with torch.no_grad():
        after = m(nxt, out.state, reset)
        fresh = m(nxt)
        kept = m(nxt, out.state)
    assert (after.logits[0] - fresh.logits[0]).abs().max() < 1e-12  # the reset row lost its window
    assert (after.logits[1] - kept.logits[1]).abs().max() < 1e-12
    assert (after.logits[1] - fresh.logits[1]).abs().max() > 1e-6  # the other kept it

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_checkpoint(tmp_path, m, opt, 1, carried=out.state.detach())
    back = carried_state(torch.load(tmp_path / "checkpoint.pt", weights_only=True), "cpu")
    assert len(back.window) == 2 and torch.equal(back.window[1]["v"], out.state.window[1]["v"].detach())


@pytest.mark.parametrize("bad", [-1, N + 1, 2.5])
def test_bad_span_is_an_error_naming_it(bad) -> None:
    with pytest.raises(ConfigError, match=f"attention_span={bad!r}"):
        model(span=bad)
    assert issubclass(ConfigError, ValueError)


def test_gradient_reaches_the_previous_segment_through_the_window() -> None:
    """Within one call the window carries gradient to segment s-1's inputs; detach cuts it across calls."""
    m = model("local", layers=1)
    x = byte_tokens(s=2)
    emb = m.embed(x).detach().requires_grad_(True)  # [B, 2, N, d]
    hook = m.embed.register_forward_hook(lambda *_: emb)
    try:
        m(x).logits[:, 1, 0].sum().backward()
    finally:
        hook.remove()
    g = emb.grad.norm(dim=-1)[0, 0]  # [N] gradient at segment 0's positions from segment 1's first query
    assert (g[N - (W - 1) :] > 0).all() and (g[: N - (W - 1)] == 0).all()


def test_xl_kv_cache_beyond_the_window_equals_its_reference() -> None:
    """The XL plugin (cache=kv, mem_len M) on the window: query t of a segment starting at s0 sees its
    band t-W+1 .. t and the cache s0-(W-1)-M .. s0-W, at their absolute RoPE positions (a reset row: its
    own document only); values and gradients, one call of three segments."""
    from memzoo.core.memory import LayerInputs
    from memzoo.memories.xl import TransformerXL

    mem_len, segments = 5, FULL_SEGMENTS
    cfg = ModelConfig(d_model=H * D, n_heads=H, segment_len=N, attention_span=W)
    xl = TransformerXL(XLConfig(mem_len=mem_len, cache="kv"), cfg, 0).double()
    q, k, v = (t[:, :, : segments * N] for t in qkv(2))
    reset = resets()[:, :segments]
    split = lambda t: t.unflatten(2, (segments, N)).transpose(1, 2)  # noqa: E731  [B, S, H, N, D]
    window, _ = slide(window_init(B, W, H, D, q.device, q.dtype), split(k), split(v), reset, W)
    h = torch.zeros(B, segments, N, H * D, dtype=torch.float64)
    x = LayerInputs(h, split(q), split(k), split(v), reset, LocalAttention(BASE, "sdpa").with_window(window), None)
    got = xl(x, xl.initial_state(B, q.device))[0].transpose(1, 2).flatten(2, 3)  # [B, H, L, D]

    length = segments * N
    pos = torch.arange(length)
    start = (pos // N) * N  # each query's segment start
    band = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < W)
    cache = (pos[None, :] >= start[:, None] - (W - 1) - mem_len) & (pos[None, :] <= start[:, None] - W)
    doc = torch.cumsum(reset.long(), 1).repeat_interleave(N, dim=1)  # [B, L]
    mask = (band | cache)[None] & (doc[:, :, None] == doc[:, None, :])
    q_r, k_r = rope(q, pos, BASE), rope(k, pos, BASE)
    scores = torch.einsum("bhid,bhjd->bhij", q_r, k_r) / math.sqrt(D)
    ref = torch.einsum("bhij,bhjd->bhid", scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1), v)
    weights = torch.randn(ref.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert (got - ref).abs().max() < 1e-12
    assert bool((mask & ~band[None]).any())  # the cache is read
    g_got = torch.autograd.grad((got * weights).sum(), q)[0]
    g_ref = torch.autograd.grad((ref * weights).sum(), q)[0]
    assert (g_got - g_ref).abs().max() < 1e-12  # the queries' gradients (the cache's keys are stop-gradient by design)


@pytest.mark.parametrize("method", ["rmt", "armt"])
def test_memory_tokens_neither_see_nor_enter_the_window(method: str) -> None:
    """Model-level memories on the window: the previous segment's real tokens are in the window, its
    memory tokens are not, and a memory token does not read it. So (one layer: above it the memory
    tokens read real tokens that read the window), from the same carried memory, a window filled with
    other keys changes the real tokens' outputs but not the memory the segment writes; and the window
    carried on is the segment's own (the same whatever the window before)."""
    m = model(method, layers=1, options={"w_v_init_std": 0.2} if method == "armt" else None)
    with torch.no_grad():
        state = m(byte_tokens(seed=3, s=2)).state
        other = ModelState(state.layers, state.model,
                           [{k: (torch.randn_like(t) if t.is_floating_point() else t) for k, t in w.items()} for w in state.window])
        x = byte_tokens(seed=4, s=1)
        a, b = m(x, state), m(x, other)
    assert (a.logits - b.logits).abs().max() > 1e-6  # the real tokens read the window
    for sa, sb in zip(a.state.all(), b.state.all()):  # the memory written is the same
        for key in sa:
            if sa[key].is_floating_point():
                assert (sa[key] - sb[key]).abs().max() < 1e-12, key
    for wa, wb in zip(a.state.window, b.state.window):  # the new window: this segment's real tokens only
        assert torch.equal(wa["k"], wb["k"]) and torch.equal(wa["v"], wb["v"])
