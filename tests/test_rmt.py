"""Recurrent Memory Transformer: the next memory against a manual forward, the attention mask among
the memory slots (the authors' bidirectional blocks, or plain causal), the learned initial memory
(fresh rows, per-row reset, gradient), the truncated-BPTT horizon, float32 state."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from memzoo.core.config import ModelConfig
from memzoo.core.memory import state_numbers
from memzoo.core.model import MemoryModel
from memzoo.data.corpus import Batch
from memzoo.memories.rmt import RMTConfig, RecurrentMemory
from memzoo.training.train import train_window
from memzoo.conformance.catalog import card_footprint, get_card

B, N, V, P = 2, 8, 256, 3


def rmt_model(write_slots: str = "memory", seed: int = 0, memory_mask: str = "bidirectional") -> MemoryModel:
    """Tiny model (d 32, 2 layers, N 8) with P memory tokens."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, segment_len=N, mlp_ratio=2.0)
    model = MemoryModel(cfg, "rmt", RMTConfig(n_mem_tokens=P, write_slots=write_slots, memory_mask=memory_mask))
    model.eval()
    return model


def allowed(p: int, n: int, memory_mask: str) -> torch.Tensor:
    """[read p; tokens n; write p], True = position i may attend to j, entry by entry: j <= i, and with
    "bidirectional" also any j in the same memory block (read or write) as i."""
    length = p + n + p
    block = lambda i: "read" if i < p else ("write" if i >= p + n else "token")  # noqa: E731
    return torch.tensor([[j <= i or (memory_mask == "bidirectional" and block(i) == block(j) != "token")
                          for j in range(length)] for i in range(length)])


def tokens(s: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, s, N), generator=torch.Generator().manual_seed(seed))


def manual_segment(model: MemoryModel, tok: torch.Tensor, mem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One segment written out by hand: [mem; embed(tok); write] -> blocks -> norm -> (logits, next mem)."""
    n = tok.shape[1]
    mm = model.model_memory
    write = mem if mm.write_embed is None else mm.write_embed.expand(tok.shape[0], -1, -1)
    x = torch.cat((mem, model.embed(tok), write), dim=1)[:, None]  # [B, 1, P+n+P, d]
    no_reset = torch.zeros(tok.shape[0], 1, dtype=torch.bool)
    mask = allowed(P, n, mm.cfg.memory_mask)
    for block in model.blocks:
        x, _, _, _ = block(x, no_reset, {}, mask)  # (x, state, aux, window)
    h = model.norm_out(x[:, 0])  # [B, P+n+P, d]
    return model.head(h[:, P : P + n]), h[:, P + n :]


@pytest.mark.parametrize("write_slots", ["memory", "learned"])
@pytest.mark.parametrize("memory_mask", ["bidirectional", "causal"])
def test_next_memory_is_final_layer_output_at_write_positions(write_slots: str, memory_mask: str) -> None:
    model = rmt_model(write_slots, memory_mask=memory_mask)
    x = tokens(3)
    with torch.no_grad():
        out = model(x)
        mem = model.model_memory.mem_init.expand(B, -1, -1)
        for s in range(3):
            logits, mem = manual_segment(model, x[:, s], mem)
            assert out.logits.shape == (B, 3, N, V), "logits must cover exactly the token positions"
            assert torch.allclose(out.logits[:, s], logits, atol=1e-5)
    assert torch.allclose(out.state.model["mem"], mem, atol=1e-5)
    assert out.state.model["mem"].shape == (B, P, 32)


def test_enter_places_memory_at_both_ends_and_masks_tokens() -> None:
    mm = rmt_model("memory").model_memory
    x = torch.randn(B, 5, 32)
    mem = torch.randn(B, P, 32)
    xin, mask = mm.enter(x, {"mem": mem})
    assert xin.shape == (B, P + 5 + P, 32)
    assert mask.tolist() == [False] * P + [True] * 5 + [False] * P
    assert torch.equal(xin[:, :P], mem) and torch.equal(xin[:, -P:], mem) and torch.equal(xin[:, mask], x)
    learned = rmt_model("learned").model_memory
    xin, _ = learned.enter(x, {"mem": mem})
    assert torch.equal(xin[:, :P], mem)
    assert torch.equal(xin[:, -P:], learned.write_embed.detach().expand(B, -1, -1))


def test_attention_mask_is_the_authors_or_causal() -> None:
    """bidirectional: LM-RMT's `dec_attn_mask` (1 = masked) = triu(ones, 1) with the read block
    [:p, :p] and the write block [-p:, -p:] zeroed; written out for p = 2, n = 3. causal: None (the
    backbone's own causal mask)."""
    mm = rmt_model().model_memory
    p = P
    expected = torch.tensor([
        # r  r  t  t  t  w  w
        [1, 1, 0, 0, 0, 0, 0],  # read 0: both read slots, no token
        [1, 1, 0, 0, 0, 0, 0],  # read 1
        [1, 1, 1, 0, 0, 0, 0],  # token 0: read slots and itself
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],  # token 2
        [1, 1, 1, 1, 1, 1, 1],  # write 0: everything, write 1 included
        [1, 1, 1, 1, 1, 1, 1],
    ], dtype=torch.bool)
    two = RecurrentMemory(RMTConfig(n_mem_tokens=2), mm.model_cfg)
    assert torch.equal(two.attention_mask(7, torch.device("cpu")), expected)
    length = p + 5 + p
    masked = torch.ones(length, length).triu(1)  # the authors' form: 1 = may not attend
    masked[:p, :p] = 0
    masked[-p:, -p:] = 0
    assert torch.equal(mm.attention_mask(length, torch.device("cpu")), masked == 0)
    assert torch.equal(mm.attention_mask(length, torch.device("cpu")), allowed(p, 5, "bidirectional"))
    causal = RecurrentMemory(RMTConfig(n_mem_tokens=p, memory_mask="causal"), mm.model_cfg)
    assert causal.attention_mask(length, torch.device("cpu")) is None


@pytest.mark.parametrize("memory_mask", ["bidirectional", "causal"])
def test_memory_blocks_see_each_other_only_when_bidirectional(memory_mask: str) -> None:
    """Through the whole model: read slot 0's output depends on read slot p-1, and the next memory's
    slot 0 on write slot p-1, exactly when the mask is bidirectional; no token output ever depends on
    the write slots (they come after every token). A masked position gets attention weight exactly 0,
    so "does not depend" is exact equality; the tiny model's dependences are small (~1e-7) but nonzero."""
    model = rmt_model("learned", memory_mask=memory_mask)
    x = tokens(1)
    tops: list[torch.Tensor] = []
    handle = model.norm_out.register_forward_hook(lambda _m, _i, out: tops.append(out))  # [B, P+N+P, d]
    state = model.initial_state(B)
    read = state.model["mem"].clone()
    read_changed = read.clone()
    read_changed[:, -1] += 1.0  # the last read slot
    with torch.no_grad():
        base = model(x, type(state)(state.layers, {"mem": read}))
        other_read = model(x, type(state)(state.layers, {"mem": read_changed}))
        model.model_memory.write_embed[-1] += 1.0  # the last write slot
        other_write = model(x, type(state)(state.layers, {"mem": read}))
    handle.remove()
    bidirectional = memory_mask == "bidirectional"
    read0_moved = float((tops[0][:, 0] - tops[1][:, 0]).abs().max())
    assert (read0_moved > 0) == bidirectional, f"read slot 0 moved by {read0_moved:.2e}"
    mem0_moved = float((base.state.model["mem"][:, 0] - other_write.state.model["mem"][:, 0]).abs().max())
    assert (mem0_moved > 0) == bidirectional, f"next memory slot 0 moved by {mem0_moved:.2e}"
    assert torch.equal(base.logits, other_write.logits), "a token saw a write slot"
    assert float((base.logits - other_read.logits).abs().max()) > 0, "tokens must see the read slots"


def test_partial_final_segment() -> None:
    """A segment of 5 < N tokens: logits for 5 positions, equal to the full segment's first 5."""
    model = rmt_model()
    x = tokens(2)
    with torch.no_grad():
        full = model(x).logits
        part = model(x[:, 1:, :5], model(x[:, :1]).state)
    assert part.logits.shape == (B, 1, 5, V)
    assert torch.allclose(part.logits[:, 0], full[:, 1, :5], atol=1e-5)
    assert part.state.model["mem"].shape == (B, P, 32)


def test_fresh_row_starts_from_learned_init() -> None:
    model = rmt_model()
    mm = model.model_memory
    state = model.initial_state(B).model
    assert torch.equal(state["mem"], mm.mem_init.detach().expand(B, -1, -1))
    with torch.no_grad():
        mm.mem_init.add_(1.0)  # the init is read from the parameter, not a copy made at build time
    assert torch.equal(model.initial_state(B).model["mem"][1], mm.mem_init.detach())


def test_reset_restores_init_row_wise_with_gradient() -> None:
    model = rmt_model()
    mm = model.model_memory
    old = torch.randn(B, P, 32)
    reset = mm.reset_rows({"mem": old}, torch.tensor([True, False]))
    assert torch.equal(reset["mem"][0], mm.mem_init.detach())
    assert torch.equal(reset["mem"][1], old[1]), "a row without a boundary was touched"
    reset["mem"][0].sum().backward()
    assert mm.mem_init.grad is not None and float(mm.mem_init.grad.abs().sum()) > 0


def test_gradient_reaches_init_through_model_and_reset() -> None:
    """A detached, non-fresh state: init gets gradient only where a document starts inside the call."""
    model = rmt_model()
    model.train()
    x = tokens(2)
    with torch.no_grad():
        carried = model(x[:, :1]).state.detach()
    for reset_row0, expect in ((False, False), (True, True)):
        model.zero_grad(set_to_none=True)
        reset = torch.zeros(B, 2, dtype=torch.bool)
        reset[0, 1] = reset_row0
        out = model(x, carried, reset)
        out.logits[:, 1].square().mean().backward()
        g = model.model_memory.mem_init.grad
        got = g is not None and float(g.abs().sum()) > 0
        assert got == expect, f"reset={reset_row0}: gradient to the initial memory {got}, expected {expect}"
    model.zero_grad(set_to_none=True)
    model(x[:, :1]).logits.square().mean().backward()  # fresh state from initial_state()
    assert float(model.model_memory.mem_init.grad.abs().sum()) > 0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gradient_horizon_truncated_bptt(k: int) -> None:
    """Loss only at the last segment s of a window trained with BPTT k: gradient reaches the token
    embeddings of segments s-k+1..s and the memories written by s-k+1..s-1, and nothing earlier."""
    model = rmt_model()
    model.train()
    s_total = 2 * k  # two whole blocks; the loss sits at the end of the second
    s_loss = s_total - 1
    embeds: list[torch.Tensor] = []
    written: list[torch.Tensor] = []

    def keep_embed(_module, _inp, out):
        out.retain_grad()
        embeds.append(out)

    mm = model.model_memory
    leave = mm.leave

    def keep_written(h, state):
        new = leave(h, state)
        new["mem"].retain_grad()
        written.append(new["mem"])
        return new

    handle = model.embed.register_forward_hook(keep_embed)
    mm.leave = keep_written
    try:
        x = tokens(s_total)
        mask = torch.zeros(B, s_total, N, dtype=torch.bool)
        mask[:, s_loss] = True
        reset = torch.zeros(B, s_total, dtype=torch.bool)
        batch = Batch(x, torch.roll(x, -1, dims=-1), mask, reset, torch.arange(s_total).expand(B, s_total))
        train_window(model, batch, bptt_segments=k)
    finally:
        handle.remove()
        del mm.leave
    assert len(embeds) == len(written) == s_total
    norm = lambda t: 0.0 if t.grad is None else float(t.grad.norm())  # noqa: E731
    embed_norms = [norm(e) for e in embeds]
    mem_norms = [norm(m) for m in written]
    first = s_loss - k + 1
    for s in range(s_total):
        if first <= s <= s_loss:
            assert embed_norms[s] > 0, f"segment {s} is inside the horizon but got no gradient: {embed_norms}"
        else:
            assert embed_norms[s] == 0.0, f"gradient crossed the horizon to segment {s}: {embed_norms}"
        if first <= s < s_loss:
            assert mem_norms[s] > 0, f"memory written at {s} (within the horizon) got no gradient: {mem_norms}"
        else:
            assert mem_norms[s] == 0.0, f"memory written at {s} got gradient: {mem_norms}"
    g = mm.mem_init.grad  # the window's initial memory is k or more segments back
    assert g is None or float(g.abs().sum()) == 0.0


def test_gradient_horizon_by_direct_calls() -> None:
    """k segments in one call keep the graph; a detach between calls is the horizon."""
    k = 2
    model = rmt_model()
    model.train()
    embeds: list[torch.Tensor] = []
    handle = model.embed.register_forward_hook(lambda _m, _i, out: (out.retain_grad(), embeds.append(out))[-1])
    x = tokens(2 * k)
    first = model(x[:, :k])
    second = model(x[:, k:], first.state.detach())
    second.logits[:, -1].square().mean().backward()
    handle.remove()
    norms = [0.0 if e.grad is None else float(e.grad.norm()) for e in embeds]
    assert all(n > 0 for n in norms[k:]) and all(n == 0 for n in norms[:k]), norms

    embeds.clear()  # without the detach the gradient reaches the first call: the test can fail
    handle = model.embed.register_forward_hook(lambda _m, _i, out: (out.retain_grad(), embeds.append(out))[-1])
    first = model(x[:, :k])
    model(x[:, k:], first.state).logits[:, -1].square().mean().backward()
    handle.remove()
    assert all(e.grad is not None and float(e.grad.norm()) > 0 for e in embeds)


def test_state_is_float32_under_autocast() -> None:
    model = rmt_model()
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = model(tokens(2))
    assert out.state.model["mem"].dtype == torch.float32
    h = torch.randn(B, P + N + P, 32, dtype=torch.bfloat16)  # a half-precision top layer
    assert model.model_memory.leave(h, out.state.model)["mem"].dtype == torch.float32


def test_footprint_total_is_carried_state_and_table1_matches_card() -> None:
    model = rmt_model()
    with torch.no_grad():
        state = model(tokens(2)).state
    parts = RecurrentMemory.footprint(model.memory_cfg, model.cfg, 2 * N)
    assert state_numbers(state.all(), B) == parts["total"] == P * 32
    assert parts["table1"] == 32 * P * 2 * 2
    paper = ModelConfig(d_model=1024, n_layers=12, n_heads=8, segment_len=2048)
    cfg = RMTConfig(n_mem_tokens=100)
    assert RecurrentMemory.footprint(cfg, paper, 32768)["table1"] == 2_457_600  # Table 1: 2.5M
    assert card_footprint(get_card("rmt"), paper, cfg, 32768) == 2_457_600


def test_memory_carries_information_in_both_write_modes() -> None:
    """Segment 0 reaches segment 2 only through the memory (the layers themselves are local)."""
    for write_slots in ("memory", "learned"):
        model = rmt_model(write_slots)
        x = tokens(3)
        y = x.clone()
        y[:, 0, 2] = (y[:, 0, 2] + 50) % V
        with torch.no_grad():
            a, b = model(x), model(y)
        assert float((a.logits[:, 2] - b.logits[:, 2]).abs().max()) > 1e-5
        assert float((a.logits[:, 0, :2] - b.logits[:, 0, :2]).abs().max()) < 1e-6


def test_bad_options_are_errors() -> None:
    cfg = tiny_model(method="local").cfg
    with pytest.raises(ValueError, match="n_mem_tokens"):
        RecurrentMemory(RMTConfig(n_mem_tokens=0), cfg)
    with pytest.raises(ValueError, match="write_slots"):
        RecurrentMemory(RMTConfig(write_slots="both"), cfg)
    with pytest.raises(ValueError, match="memory_mask='full'"):
        RecurrentMemory(RMTConfig(memory_mask="full"), cfg)
    from memzoo.core.attention import LocalAttention

    with pytest.raises(ValueError, match=r"square bool \[N, N\].*\[3, 4\]"):
        LocalAttention(10000.0).with_segment_mask(torch.ones(3, 4, dtype=torch.bool))
    q = torch.zeros(1, 1, 5, 4)
    with pytest.raises(ValueError, match=r"segment_mask is \[3, 3\] for a segment of 5 positions"):
        LocalAttention(10000.0).with_segment_mask(torch.ones(3, 3, dtype=torch.bool))(q, q, q)
