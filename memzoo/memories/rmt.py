"""Recurrent Memory Transformer (Bulatov, Kuratov, Burtsev 2022, arXiv 2207.06881).

A model-level memory of p vectors (d_model each) per batch row. For segment s with token
embeddings X_s [N, d_model] the decoder's input is

    X̃_s = [M_{s-1}^read ; X_s ; M_{s-1}^write]                           [p + N + p, d_model]
    H_s = Decoder(X̃_s)                      (the backbone's layers, RoPE over all p + N + p)
    M_s = H_s[p + N :]                       (the final layer's outputs, after the final norm, at
                                              the write positions)
    logits_s = LMHead(H_s[p : p + N])        (outputs only at the token positions)

M^read = M_{s-1}. The write slots are, by `write_slots`:
  * "memory" (default): copies of M_{s-1}, the same vectors at both ends, as the paper's figure
    and both public RMT codebases do (a residual-like recurrence: M_s starts from M_{s-1});
  * "learned": learned write embeddings W [p, d_model], the same for every segment, so M_s is a
    function of M_{s-1} only through attention to the read slots and the tokens.
The attention mask over [read; tokens; write] is, by `memory_mask`:
  * "bidirectional" (default): the authors' decoder (LM-RMT, the code behind the paper's language
    modelling and algorithmic results): causal, except that the p read slots attend to each other
    in both directions, and so do the p write slots. Read slots still see no token (they come
    first); tokens see the read slots and earlier tokens; write slots see everything.
  * "causal": one causal mask over the whole concatenation (read slot i sees read slots <= i, write
    slot i write slots <= i), as the later Hugging-Face-based RMT code gets from its base model.
Causality of the tokens holds either way: a token sees only the read slots (M_{s-1}) and earlier
tokens; the write slots see the whole segment but only shape the next segment's read memory.

M_0 is a learned parameter [p, d_model] (normal, std `init_std`; 0.02 = the backbone's embedding
init, as the Hugging-Face-based RMT code scales its memory to the embeddings' std). A fresh row
and a row reset at a document boundary start from it, with gradient to it. Gradient flows through
M across segments; the backbone detaches the state every train.bptt_segments segments, which is
the BPTT truncation. The state follows the precision policy (float32 under autocast, float64 in a float64 model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from memzoo.core.config import ModelConfig
from memzoo.core.memory import ModelMemory, State
from memzoo.core.plugins import register_memory

WRITE_SLOTS = ("memory", "learned")
MEMORY_MASKS = ("bidirectional", "causal")


@dataclass
class RMTConfig:
    n_mem_tokens: int = 10  # p: memory vectors carried per row (read slots = write slots = p)
    write_slots: str = "memory"  # memory | learned: what fills the write positions (module docstring)
    init_std: float = 0.02  # std of the learned initial memory (and of learned write embeddings)
    memory_mask: str = "bidirectional"  # bidirectional | causal: attention among the slots (module docstring)


@register_memory("rmt", config=RMTConfig)
class RecurrentMemory(ModelMemory):
    """[read memory; tokens; write memory] through the decoder; write outputs become the memory."""

    gradient_through_state = True

    def __init__(self, cfg: RMTConfig, model: ModelConfig):
        super().__init__(cfg, model)
        if int(cfg.n_mem_tokens) < 1:
            raise ValueError(f"rmt n_mem_tokens={cfg.n_mem_tokens}; expected a positive int")
        if cfg.write_slots not in WRITE_SLOTS:
            raise ValueError(f"rmt write_slots={cfg.write_slots!r}; expected one of {WRITE_SLOTS}")
        if cfg.memory_mask not in MEMORY_MASKS:
            raise ValueError(f"rmt memory_mask={cfg.memory_mask!r}; expected one of {MEMORY_MASKS}")
        self.p = int(cfg.n_mem_tokens)
        d = model.d_model
        self.mem_init = nn.Parameter(torch.randn(self.p, d) * cfg.init_std)  # M_0 [p, d_model]
        self.write_embed = (  # W [p, d_model] (write_slots="learned" only)
            nn.Parameter(torch.randn(self.p, d) * cfg.init_std) if cfg.write_slots == "learned" else None
        )

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """M_0 for every row: the learned parameter, expanded (gradient reaches it)."""
        mem = self.mem_init.to(device=device, dtype=self.state_dtype())
        return {"mem": mem.unsqueeze(0).expand(batch_size, -1, -1)}  # [B, p, d_model]

    @classmethod
    def footprint(cls, cfg: RMTConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Carried: p × d_model per row. Table 1: read and write slots' activations in every layer."""
        p, d = int(cfg.n_mem_tokens), model.d_model
        return {"total": p * d, "table1": d * p * model.n_layers * 2}

    def enter(self, x: Tensor, state: State) -> tuple[Tensor, Tensor]:
        """x [B, N, d] -> ([M^read; x; M^write] [B, p + N + p, d], token_mask [p + N + p])."""
        b, n, d = x.shape
        mem = state["mem"]  # [B, p, d]
        if mem.shape[1:] != (self.p, d):
            raise ValueError(f"rmt state has memory {tuple(mem.shape[1:])}, expected {(self.p, d)}")
        read = mem.to(x.dtype)  # M^read = M_{s-1}
        if self.write_embed is None:
            write = read  # the same vectors at both ends
        else:
            write = self.write_embed.to(x.dtype).unsqueeze(0).expand(b, -1, -1)  # [B, p, d]
        token_mask = torch.zeros(self.p + n + self.p, dtype=torch.bool, device=x.device)
        token_mask[self.p : self.p + n] = True
        return torch.cat((read, x, write), dim=1), token_mask

    def attention_mask(self, length: int, device: torch.device) -> Optional[Tensor]:
        """[p + N + p] x [p + N + p], True = may attend: causal, with the read block and the write block
        each all-to-all ("bidirectional"); None ("causal") leaves the backbone's causal mask."""
        if self.cfg.memory_mask == "causal":
            return None
        p = self.p
        if length < 2 * p:
            raise ValueError(f"rmt: a wrapped segment of {length} positions has fewer than 2 x {p} memory slots")
        mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # [N', N'] causal
        mask[:p, :p] = True  # read slots see each other both ways (and no token: those come after)
        mask[-p:, -p:] = True  # write slots see each other both ways (and everything before them)
        return mask

    def leave(self, h: Tensor, state: State) -> State:
        """M_s = the final layer's (normed) outputs at the write positions, in the policy's dtype: [B, p, d]."""
        return {"mem": h[:, -self.p :].to(self.working_dtype(h))}
