"""The backbone's short convolution on queries and keys (model.qk_conv = K, memzoo.core.qk_conv).

`convolve_qk` over segments, with carried history, document starts and memory slots, equals the
formula written position by position over the whole stream, in values and gradients; at the identity
taps every memory is the model without it, bit for bit; with trained-looking taps every memory streams
as one call and a document start forgets the history (the `full-shortconv` pilot plugin is held to
it in test_short_conv_full.py); the history is backbone state with its footprint; the taps train apart; the hash moves only
when the convolution is on.
"""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_memory_config, tiny_model_config
from memzoo.core.config import ConfigError
from memzoo.core.memory import state_numbers
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import registered
from memzoo.core.qk_conv import convolve_qk, tail_init
from memzoo.training.backbones import backbone_hash

B, S, N, H, D, K = 2, 3, 5, 2, 3, 4


def oracle(x: torch.Tensor, taps: torch.Tensor, reset: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """y_t = Σ_j taps[j] · x_{t−K+1+j} over each row's stream of real positions, the history emptied at a
    document start; positions not real pass unchanged. x [B, S, H, N, D] (one of q, k); taps [K, H, 1, D]."""
    out = x.clone()
    for b in range(x.shape[0]):
        past: list[torch.Tensor] = []  # [H, D] rows of this document, oldest first
        for s in range(x.shape[1]):
            if reset[b, s]:
                past = []
            for t in range(x.shape[3]):
                if not real[t]:
                    continue
                past.append(x[b, s, :, t])
                y = torch.zeros_like(x[b, s, :, t])
                for j in range(K):
                    back = K - 1 - j  # tap j reads the row `back` positions before this one
                    if back < len(past):
                        y = y + taps[j, :, 0] * past[-1 - back]
                out[b, s, :, t] = y
    return out


def draws(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, S, H, N, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    taps = torch.randn(K, 2, H, 1, D, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, taps


@pytest.mark.parametrize("masked", [False, True])
def test_convolution_equals_the_formula_position_by_position(masked: bool) -> None:
    """Values and gradients (float64, 1e-12): segments after carried history, a reset row, memory slots."""
    q, k, taps = draws()
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[0, 1] = True  # row 0 starts a new document at segment 1
    real = torch.tensor([False, True, True, True, False]) if masked else torch.ones(N, dtype=torch.bool)
    tail = tail_init(B, K, H, D, q.device, q.dtype)
    cq, ck, last = convolve_qk(q, k, taps, tail, reset, real if masked else None)
    rq, rk = oracle(q, taps[:, 0], reset, real), oracle(k, taps[:, 1], reset, real)
    assert (cq - rq).abs().max() < 1e-12 and (ck - rk).abs().max() < 1e-12
    stream = torch.stack((q, k), 1)[..., real, :].transpose(2, 3).flatten(3, 4)  # [B, 2, H, S x n, D]
    assert torch.equal(last, stream[..., -(K - 1):, :])  # the raw rows carried on
    w = torch.randn_like(cq)
    grads = torch.autograd.grad(((cq - ck) * w).sum(), (q, k, taps))
    want = torch.autograd.grad(((rq - rk) * w).sum(), (q, k, taps))
    for got, ref in zip(grads, want):
        assert (got - ref).abs().max() < 1e-12


def model(method: str, qk_conv: int, span: int = 0) -> MemoryModel:
    torch.manual_seed(0)
    m = MemoryModel(tiny_model_config(qk_conv=qk_conv, attention_span=span), method, tiny_memory_config(method))
    return m.eval()


def random_taps(m: MemoryModel) -> None:
    g = torch.Generator().manual_seed(3)
    for block in m.blocks:
        block.attn.qk_taps.data = torch.randn(block.attn.qk_taps.shape, generator=g)


def byte_tokens(s: int = 4) -> torch.Tensor:
    return torch.randint(0, 256, (2, s, 8), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("method", sorted(registered()))
def test_identity_taps_are_the_model_without_the_convolution(method: str) -> None:
    """At its initial taps the convolution changes nothing, for every memory, with and without the window."""
    x = byte_tokens()
    for span in (0, 4):
        with torch.no_grad():
            want = model(method, 0, span)(x).logits
            assert torch.equal(model(method, K, span)(x).logits, want), (method, span)


@pytest.mark.parametrize("method", sorted(registered()))
def test_streaming_equals_one_call_and_a_document_start_forgets(method: str) -> None:
    """Random taps: segment by segment equals one call, and a row that starts a document at segment 2
    reads it as a fresh state does (the history before is cleared, not only the memory's)."""
    m = model(method, K, span=4)
    random_taps(m)
    x = byte_tokens()
    reset = torch.zeros(2, 4, dtype=torch.bool)
    reset[0, 2] = True
    with torch.no_grad():
        one = m(x, reset=reset).logits
        state, parts = m.initial_state(2), []
        for s in range(4):
            out = m(x[:, s : s + 1], state, reset[:, s : s + 1])
            state, parts = out.state, parts + [out.logits]
        fresh = m(x[:1, 2:]).logits
    assert (one - torch.cat(parts, 1)).abs().max() < 1e-5
    assert (one[:1, 2:] - fresh).abs().max() < 1e-5
    assert state_numbers(state.window, 2) == m.window_footprint()["total"]


def test_the_history_is_backbone_state_with_its_footprint() -> None:
    """2 x H x D x (K - 1) x layers numbers, kept by the memory ablation, outside the memory's footprint."""
    m = model("xl", K)
    state = m(byte_tokens()).state
    assert m.window_footprint()["qk_tail"] == 2 * 2 * 16 * (K - 1) * 2 == state_numbers(state.window, 2)
    assert m.forget_memory(state, 2).window is state.window
    assert model("xl", 0).window_footprint()["total"] == 0


def test_the_taps_train_at_their_own_rate_without_decay() -> None:
    """The taps' group: lr x model.qk_conv_lr_mult, no weight decay (decay would pull them to zero)."""
    m = model("full", K)
    taps = {id(b.attn.qk_taps) for b in m.blocks}
    groups = [g for g in m.optim_groups(0.1, 1e-3) if any(id(p) in taps for p in g["params"])]
    assert len(groups) == 1 and {id(p) for p in groups[0]["params"]} == taps
    assert groups[0]["weight_decay"] == 0.0 and groups[0]["lr"] == pytest.approx(5e-3)


def test_the_hash_moves_only_with_the_convolution_on() -> None:
    """Every backbone shipped before the option keeps its hash; one with the convolution has another."""
    assert backbone_hash(vars(tiny_model_config())) == backbone_hash(vars(tiny_model_config(qk_conv=0)))
    assert backbone_hash(vars(tiny_model_config(qk_conv=K))) != backbone_hash(vars(tiny_model_config()))
    keys = {k: v for k, v in vars(tiny_model_config()).items() if k != "qk_conv"}
    assert backbone_hash(keys) == backbone_hash(vars(tiny_model_config()))  # a config from before the option


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_a_bad_kernel_is_named(bad: object) -> None:
    with pytest.raises(ConfigError, match=f"model.qk_conv={bad!r}"):
        MemoryModel(tiny_model_config(qk_conv=bad), "full", tiny_memory_config("full"))




def test_a_memory_projects_keys_without_the_convolution() -> None:
    """`project_kv` (XL's, the Compressive's caches) gives W_K h, unconvolved: the positions before a cache
    are not kept, so a convolution there would make one call differ from streaming (tested above for xl)."""
    m = model("xl", K)
    random_taps(m)
    attn = m.blocks[0].attn
    h = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(5))
    k, v = attn.project_kv(h)
    raw_k, raw_v = (h @ attn.qkv.weight[attn.d_inner :].T).view(2, 6, 2, 2, 16).permute(2, 0, 3, 1, 4)
    assert torch.equal(k, raw_k) and torch.equal(v, raw_v)


ONE_TO_ONE = {"mem_len": 4, "cmem_len": 64, "compression_rate": 1, "compression": "mean"}  # cm: each evicted slot


@pytest.mark.parametrize("method, options, same", [
    ("xl", {"mem_len": 64, "cache": "kv"}, True), ("xl", {"mem_len": 64, "cache": "hidden"}, False),
    ("compressive", {**ONE_TO_ONE, "cache": "kv"}, True), ("compressive", {**ONE_TO_ONE, "cache": "hidden"}, False),
    ("infty-former", {"mem_len": 64, "cache": "kv"}, True), ("infty-former", {"mem_len": 64, "cache": "hidden"}, False)])
def test_a_key_cache_reads_the_convolved_keys(method: str, options: dict, same: bool) -> None:
    """XL, the Compressive Transformer and the ∞-former's STM with cache=kv keep the keys the layer attended,
    convolved: with a cache as long as the stream (the Compressive's FIFO of 4, then a compressed memory at
    rate 1 holding every evicted slot in order, at its own position; the ∞-former's STM of 64, so its LTM
    stays empty) each reads as `full` does, streamed segment by segment.
    cache=hidden re-projects unconvolved keys and does not (why the convolution suites' rows use cache=kv)."""
    torch.manual_seed(0)
    xl = MemoryModel(tiny_model_config(qk_conv=K), method, tiny_memory_config(method, options)).eval()
    full = model("full", K)
    missing, unexpected = xl.load_state_dict(full.state_dict(), strict=False)  # the memory's own weights stay
    assert not unexpected and all(".memory." in name for name in missing), (missing, unexpected)
    random_taps(xl), random_taps(full)
    x = byte_tokens()
    with torch.no_grad():
        want = full(x).logits
        state, parts = xl.initial_state(2), []
        for s in range(x.shape[1]):
            out = xl(x[:, s : s + 1], state)
            state, parts = out.state, parts + [out.logits]
    gap = float((torch.cat(parts, 1) - want).abs().max())
    assert (gap < 1e-5) == same, gap
