"""Where does Memorizing's kNN layer look for a passkey? (the long-range recipe's diagnosis of the kNN path)

For prompts with the key a given number of segments before the question, the answer is teacher-
forced and, at each answer position, every head's query is compared with every key in the store
(what the layer's search does). For the store slot holding the matching digit of the key sentence
(the slot an induction lookup must find) it prints the rank among all filled slots (0 = first) and
the weight the read's softmax over the top-k gives it. A head that ranks the slot first but gives
it a few percent of the read is diluted by its temperature; one that ranks it in the hundreds
never finds it.

    python benchmarks/knn_rank.py RUN_DIR --length 668 --back 3 [--trials 4]
"""
from __future__ import annotations

import argparse

import torch

import memzoo.memories.memorizing as memorizing
from memzoo.data.tasks import bytes_to_tensor, passkey_prompt_back, random_key
from memzoo.running.checkpoints import load_trained
from memzoo.running.generate import StreamingDecoder


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
    plain_read = knn.read

    def recording_read(q: torch.Tensor, store):
        seen.append((memorizing.l2_normalise(q.float())[0], memorizing.filled(store)["k"][0].clone()))
        return plain_read(q, store)

    knn.read = recording_read  # this instance only, until the end
    tau = knn.log_scale.exp()  # [H]
    n = model.cfg.segment_len
    gen = torch.Generator().manual_seed(seed)
    ranks, weights = [], []
    try:
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
                ranks.append((sims > sims[:, target:target + 1]).sum(1).tolist())
                top = sims.topk(min(knn.cfg.top_k, sims.shape[1]), dim=1)
                read = torch.softmax(top.values * tau[:, None], dim=1)  # [H, k]
                weights.append((read * (top.indices == target)).sum(1).tolist())
    finally:
        knn.read = plain_read
    return ranks, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--length", type=int, default=668)
    parser.add_argument("--back", type=int, default=3, help="segments between the key and the question")
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, model = load_trained(args.run)
    ranks, weights = slot_ranks(model, args.length, args.back, args.trials)
    knn = knn_layer_of(model)
    r, w = torch.tensor(ranks, dtype=torch.float), torch.tensor(weights)
    print(f"{args.run}: length {args.length}, key {args.back} segments back, {len(ranks)} answer digits")
    print("gate sigmoid(b):", [round(g, 2) for g in knn.gate_values().tolist()])
    print("temperature τ:  ", [round(t, 1) for t in knn.log_scale.exp().tolist()])
    print("median rank:    ", [int(v) for v in r.median(0).values.tolist()])
    print("top-1 share:    ", [round(v, 2) for v in (r == 0).float().mean(0).tolist()])
    print("mean weight:    ", [round(v, 3) for v in w.mean(0).tolist()])


if __name__ == "__main__":
    main()
