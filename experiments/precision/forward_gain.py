"""Where one forward and backward pass amplifies a tiny weight change: the quick run's model (at
initialisation or from a run folder's checkpoint) and a copy with every weight multiplied by
(1 + rel * noise), both in float64 (so rounding does not blur the measurement), on the same training
window; prints the relative difference of the logits, the loss, the gradient and of each traced
intermediate (ARMT: features, z, A, reads; Titans: q, k, v, gates, reads, states, the norms normalised),
divided by rel. The intermediates come from the memories' probes (memzoo.core.probe); nothing is patched.

    PYTHONPATH=$PWD python experiments/precision/forward_gain.py titans-mag [--checkpoint RUN_DIR] [--step 6]
"""
from __future__ import annotations

import argparse
import copy
from collections import defaultdict

import torch

from experiments.precision.sensitivity import perturb_weights, quick_config

# what each probe (memzoo.core.probe) shows, under the name printed: probe -> {printed name: value's key}
TRACED = {
    "armt.read": {"armt phi": "phi", "armt z": "z", "armt A": "A", "armt read": "read"},
    "titans.scan": {f"titans {k}": v for k, v in (("keys", "keys"), ("values", "values"), ("queries", "queries"),
                                                   ("theta", "lr"), ("log_keep", "log_keep"), ("log_eta", "log_eta"),
                                                   ("reads", "reads"))},
}


def captured(seen: list[tuple[str, dict]]) -> dict[str, list[torch.Tensor]]:
    """The probes' values in call order, by printed name (Titans' first memory layer's W and S after each write)."""
    out: dict[str, list[torch.Tensor]] = defaultdict(list)
    for name, values in seen:
        for label, key in TRACED.get(name, {}).items():
            out[label].append(values[key].detach().clone())
        if name == "titans.scan":
            out["titans W0 after"].append(values["weights"][0].detach().clone())
            out["titans S0 after"].append(values["momentum"][0].detach().clone())
        elif name == "titans.l2n":
            out["titans |x| before l2 norm"].append(values["x"].detach().norm(dim=-1))
    return dict(out)


def run(model, batch, cfg) -> tuple[dict[str, list[torch.Tensor]], float, torch.Tensor]:
    from memzoo.core.probe import recording
    from memzoo.training.windows import train_window

    model.zero_grad()
    with recording(names={*TRACED, "titans.l2n"}) as seen:
        res = train_window(model, batch, cfg.train.bptt_segments, state=model.initial_state(batch.tokens.shape[0], torch.device("cpu")))
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return captured(seen), res.nll_sum, grad


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
