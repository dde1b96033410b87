"""Where one forward and backward pass amplifies a tiny weight change: the quick run's model (at
initialisation or from a run folder's checkpoint) and a copy with every weight multiplied by
(1 + rel * noise), both in float64 (so rounding does not blur the measurement), on the same training
window; prints the relative difference of the logits, the loss, the gradient and of each traced
intermediate (ARMT: features, denominators, reads; Titans: q, k, v, gates, reads, states), divided by rel.

    PYTHONPATH=$PWD python experiments/precision/forward_gain.py titans-mag [--checkpoint RUN_DIR] [--step 6]
"""
from __future__ import annotations

import argparse
import copy
from collections import defaultdict

import torch

from experiments.precision.sensitivity import perturb_weights, quick_config

CAPTURED: dict[str, list[torch.Tensor]] = defaultdict(list)


def capture(name: str, t: torch.Tensor) -> None:
    CAPTURED[name].append(t.detach().clone())


def install(method: str) -> None:
    """Wrap the memory's functions so that their inputs and outputs are kept in CAPTURED."""
    if method == "armt":
        import memzoo.memories.armt as armt
        den0, read0 = armt.denominator, armt.associative_read

        def denominator(phi, z, *a):
            out = den0(phi, z, *a)
            capture("armt phi", phi), capture("armt z", z), capture("armt denominator", out)
            return out

        def associative_read(phi, A, z, *a):
            out = read0(phi, A, z, *a)
            capture("armt A", A), capture("armt read", out)
            return out
        armt.denominator, armt.associative_read = denominator, associative_read
    elif method.startswith("titans"):
        import memzoo.memories.titans as titans
        scan0, l2n0 = titans.scan_memory, titans.l2n

        def scan_memory(weights, momentum, keys, values, queries, log_keep, log_eta, lr, *a):
            reads, w, s = scan0(weights, momentum, keys, values, queries, log_keep, log_eta, lr, *a)
            for name, t in (("keys", keys), ("values", values), ("queries", queries), ("theta", lr),
                            ("log_keep", log_keep), ("log_eta", log_eta), ("reads", reads), ("W0 after", w[0]),
                            ("S0 after", s[0])):
                capture(f"titans {name}", t)
            return reads, w, s

        def l2n(x):
            capture("titans |x| before l2 norm", x.norm(dim=-1))
            return l2n0(x)
        titans.scan_memory, titans.l2n = scan_memory, l2n


def run(model, batch, cfg) -> tuple[dict[str, list[torch.Tensor]], float, torch.Tensor]:
    from memzoo.training.windows import train_window

    CAPTURED.clear()
    model.zero_grad()
    res = train_window(model, batch, cfg.train.bptt_segments, state=model.initial_state(batch.tokens.shape[0], torch.device("cpu")))
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {k: list(v) for k, v in CAPTURED.items()}, res.nll_sum, grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("method")
    ap.add_argument("--checkpoint", help="a run folder whose checkpoint.pt gives the weights (default: initialisation)")
    ap.add_argument("--step", type=int, default=0, help="the training window of this step")
    ap.add_argument("--rel", type=float, default=1e-7)
    ap.add_argument("--per-call", action="store_true", help="every call's gain, in call order")
    ap.add_argument("--options", nargs="*", default=[], help="quick-suite overrides")
    args = ap.parse_args()
    import memzoo.training.train as train_mod

    torch.set_num_threads(1)
    cfg = quick_config(args.method, 0, "/tmp/forward-gain", args.options)
    torch.manual_seed(cfg.seed)
    model = train_mod.build_model(cfg)
    if args.checkpoint:
        model.load_state_dict(torch.load(f"{args.checkpoint}/checkpoint.pt", weights_only=True)["model"])
    model = model.double()
    other = copy.deepcopy(model)
    perturb_weights(other, args.rel)
    install(args.method)
    batch = train_mod.batch_source(cfg)(args.step)
    base, loss_a, grad_a = run(model, batch, cfg)
    nudged, loss_b, grad_b = run(other, batch, cfg)
    print(f"{args.method} step {args.step} weights {'init' if not args.checkpoint else args.checkpoint}: gain = "
          f"relative difference / {args.rel:g}")
    print(f"  loss {abs(loss_a - loss_b) / abs(loss_a) / args.rel:10.3g}   gradient {rel(grad_b, grad_a) / args.rel:10.3g}")
    for name in base:
        gains = [rel(b, a) / args.rel for a, b in zip(base[name], nudged[name])]
        worst = max(range(len(gains)), key=gains.__getitem__)
        print(f"  {name:28s} median {sorted(gains)[len(gains) // 2]:10.3g}  max {gains[worst]:10.3g} (call {worst} of {len(gains)})")
        if args.per_call:
            print(f"  {'':28s} per call: {' '.join(f'{g:.2g}' for g in gains)}")
        if "before l2" in name:  # the smallest norms normalised
            print(f"  {'':28s} smallest |x| {min(float(t.min()) for t in base[name]):.3g}")


if __name__ == "__main__":
    main()
