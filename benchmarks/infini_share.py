"""How much of Infini-attention's memory read can one key get? (the long-range recipe's diagnosis of Infini)

The read is σ(q) M / (σ(q) z) with z = Σ_j σ(k_j) over every token written so far. Under the
linear rule M = Σ_j σ(k_j)ᵀ v_j, so the read is an average of the values with weights
w_j = σ(q)·σ(k_j) / Σ_i σ(q)·σ(k_i): the share one key can get is its similarity over the sum of
all similarities, and with σ > 0 everywhere that sum grows with every token written. For passkey
prompts of several lengths, at each teacher-forced answer position, this prints per layer the
best head's weight on the key sentence's matching digit, and that key's similarity over the
mean similarity (its selectivity; a share of 1/2 needs a selectivity near the number of tokens),
and the norm of the memory read the model actually makes (either rule) over the values' mean norm
(a read that averages many values is shorter than any one of them; one that retrieves a value is
not).

    python benchmarks/infini_share.py RUN_DIR [--lengths 668,4096,32768] [--trials 2]
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

import memzoo.memories.infini as infini
from memzoo.data.tasks import bytes_to_tensor, passkey_prompt, random_key
from memzoo.running.checkpoints import load_trained
from memzoo.running.generate import StreamingDecoder


@torch.no_grad()
def key_share(run_dir: str, length: int, trials: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """[L, H] each, means over answer digits and trials: the weight on the key's digit, its
    selectivity, and the read's norm over the values' mean norm."""
    _, model = load_trained(run_dir)
    layers = [m for m in model.modules() if isinstance(m, infini.InfiniAttention)]
    if not layers:
        raise ValueError(f"{run_dir} is not an Infini-attention run")
    seen: dict[int, list[tuple[torch.Tensor, ...]]] = {i: [] for i in range(len(layers))}
    reads: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}
    current = [0]
    plain_retrieve = infini.retrieve

    def recording_retrieve(sq, mem, z):
        out = plain_retrieve(sq, mem, z)  # [B, H, N, Dv]
        reads[current[0]].append(out[0])
        return out

    for i, layer in enumerate(layers):
        # the per-segment loop calls `retrieve`; the linear rule's vectorised path (same values) does not
        layer.cfg = dataclasses.replace(layer.cfg, vectorized=False)
        plain = layer.forward

        def recording(x, state, i=i, plain=plain):
            current[0] = i
            seen[i].append((infini.sigma(x.q.float())[0], infini.sigma(x.k.float())[0], x.v.float()[0]))
            return plain(x, state)  # [S, H, N, D] each, recorded

        layer.forward = recording  # this instance only
    infini.retrieve = recording_retrieve  # module-wide, until the end
    n = model.cfg.segment_len
    gen = torch.Generator().manual_seed(seed)
    shares, selectivity, read_norms = [], [], []
    try:
        for _ in range(trials):
            key = random_key(gen, 5)
            prompt = passkey_prompt(length, 0.0, key)  # the key at the start: every filler byte after it
            text = prompt.prompt + b" " + key.encode()
            first = prompt.prompt.find(key.encode())
            for calls in (*seen.values(), *reads.values()):
                calls.clear()
            StreamingDecoder(model, 1, segments_per_call=8).feed(bytes_to_tensor(text)[None])
            # per layer, every position in order (whole segments, then the partial one): [H, T, D] each
            flat = [[torch.cat([t[j].permute(1, 0, 2, 3).flatten(1, 2) for t in seen[i]], dim=1) for j in range(3)]
                    for i in range(len(layers))]
            read_all = [torch.cat(reads[i], dim=1) for i in range(len(layers))]  # [H, T, D]
            for d in range(len(key)):
                query, target = len(prompt.prompt) + d, first + d
                written = query // n * n  # the memory holds the segments before the query's own
                per_layer_share, per_layer_sel, per_layer_read = [], [], []
                for (qs, ks, vs), read in zip(flat, read_all):
                    per_layer_read.append(read[:, query].norm(dim=-1) / vs[:, :written].norm(dim=-1).mean(1))
                    sims = torch.einsum("hd,htd->ht", qs[:, query], ks[:, :written])  # [H, written]
                    per_layer_share.append(sims[:, target] / sims.sum(1))
                    per_layer_sel.append(sims[:, target] / sims.mean(1))
                shares.append(torch.stack(per_layer_share))
                selectivity.append(torch.stack(per_layer_sel))
                read_norms.append(torch.stack(per_layer_read))
    finally:
        infini.retrieve = plain_retrieve
    return tuple(torch.stack(x).mean(0) for x in (shares, selectivity, read_norms))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--lengths", default="668,4096,32768")
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.run}: key at depth 0; per layer, the head giving the key's digit the largest share")
    print(f"{'length':>8} {'layer':>5} {'share':>8} {'selectivity':>11} {'read/value (mean over heads)':>29}")
    for length in (int(x) for x in args.lengths.split(",")):
        share, sel, read = key_share(args.run, length, args.trials)
        for layer in range(share.shape[0]):
            h = int(share[layer].argmax())
            print(f"{length:8d} {layer:5d} {float(share[layer, h]):8.4f} {float(sel[layer, h]):11.1f} "
                  f"{float(read[layer].mean()):29.3f}")


if __name__ == "__main__":
    main()
