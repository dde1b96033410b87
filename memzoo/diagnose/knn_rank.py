"""Where does Memorizing's kNN layer look for a passkey?

For prompts with the key a given number of segments before the question, the answer is teacher-
forced and, at each answer position, every head's query is compared with every key in the store
(what the layer's search does). For the store slot holding the matching digit of the key sentence
(the slot an induction lookup must find) it prints the rank among all filled slots (0 = first) and
the weight the read's softmax over the top-k gives it. A head that ranks the slot first but gives
it a few percent of the read is diluted by its temperature; one that ranks it in the hundreds
never finds it.

    python experiments/longrange/knn_rank.py RUN_DIR --length 668 --back 3 [--trials 4]
"""
from __future__ import annotations


from typing import Any

import torch

import memzoo.memories.memorizing as memorizing
from memzoo.core.probe import recording
from memzoo.data.passkey import passkey_prompt_back, random_key
from memzoo.data.tasks import bytes_to_tensor
from memzoo.evaluations.generate import StreamingDecoder


def knn_layer_of(model: torch.nn.Module) -> memorizing.MemorizingKNN:
    layers = [m for m in model.modules() if isinstance(m, memorizing.MemorizingKNN)]
    if len(layers) != 1:
        raise ValueError(f"expected a memorizing run with one kNN layer; found {len(layers)}")
    return layers[0]


@torch.no_grad()
def slot_ranks(model: torch.nn.Module, length: int, back: int, trials: int, seed: int = 0) -> tuple[list, list]:
    """Per answer digit of every trial: ([H] rank of the key's slot, [H] its weight in the read)."""
    knn = knn_layer_of(model)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # per model call: (q̂ [H, N, D], store keys [F, H, D])

    def record(name: str, r: dict[str, Any]) -> None:  # the plugin's "memorizing.read" probe
        if r["layer"] == knn.layer_index:
            seen.append((r["q_hat"][0], r["keys"][0].clone()))

    tau = knn.log_scale.exp()  # [H]
    n = model.cfg.segment_len
    gen = torch.Generator().manual_seed(seed)
    ranks, weights = [], []
    with recording(record, {"memorizing.read"}):
        for _ in range(trials):
            key = random_key(gen, 5)
            prompt = passkey_prompt_back(length, back, key, n, gen)
            text = prompt.prompt + b" " + key.encode()  # teacher-forced answer: " " then the digits
            first = prompt.prompt.find(key.encode())  # the key sentence's first digit (byte = store slot)
            seen.clear()
            StreamingDecoder(model, 1, segments_per_call=1).feed(bytes_to_tensor(text)[None])
            for i in range(len(key)):
                query, target = len(prompt.prompt) + i, first + i  # at " " (or digit i) the next is digit i
                q_hat, keys = seen[query // n]
                if target >= keys.shape[0]:
                    raise ValueError(f"the key's slot {target} is not in the store yet ({keys.shape[0]} filled)")
                sims = torch.einsum("hd,chd->hc", q_hat[:, query % n], keys)  # [H, F]
                rank, weight = rank_and_weight(sims, target, knn.cfg.top_k, tau)
                ranks.append(rank.tolist())
                weights.append(weight.tolist())
    return ranks, weights


def rank_and_weight(sims: torch.Tensor, target: int, top_k: int, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the target slot's rank among the slots (how many are strictly more similar) and its
    weight in the read's softmax over the top k at temperature τ (0 outside the top k).
    sims [H, F], tau [H] -> [H] each."""
    rank = (sims > sims[:, target:target + 1]).sum(1)
    top = sims.topk(min(top_k, sims.shape[1]), dim=1)
    read = torch.softmax(top.values * tau[:, None], dim=1)  # [H, k]
    return rank, (read * (top.indices == target)).sum(1)
