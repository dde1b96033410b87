"""Why Infini-attention recovers so little beyond the window: for each trained Infini run of
an `lm-window` suite folder, its gates (sigmoid(beta) per head and layer) and its read contrast
(memzoo.diagnose.read_contrast: the mean cosine between two queries' reads, and between a read and
the mean value written before it; a memory collapsed to a document average reads near 1 on both),
over validation documents read from their start; and with --step0, what step 0 differs by: the window
floor and each Infini start (gate 0.5 and local-preserving) evaluated before any training (one step at
learning rate 0), with their read contrast.

    python experiments/window/infini_probe.py results/lm-window [--step0] [--out experiments/window/DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from memzoo.data.corpus import load_documents, split_documents
from memzoo.diagnose.read_contrast import infini_read_contrast
from memzoo.runs.checkpoints import load_run
from memzoo.suites.compare import expand, load_suite
from memzoo.training.train import train


def validation_tokens(cfg, segments: int, docs: int) -> torch.Tensor:
    """[docs, segments, N]: the first `segments` segments of the first validation documents that long."""
    n = int(cfg.model.segment_len)
    need = segments * n
    chosen = [d for d in split_documents(load_documents(cfg.data), cfg.data)["valid"] if len(d.data) >= need][:docs]
    return torch.stack([torch.frombuffer(bytearray(d.data[:need]), dtype=torch.uint8).long().view(segments, n)
                        for d in chosen])


def probe_run(run_dir: Path, segments: int, docs: int) -> dict:
    """Gates and read contrast per layer of one trained Infini run."""
    cfg, model = load_run(run_dir)
    model.eval()
    with torch.no_grad():
        contrast = infini_read_contrast(model, validation_tokens(cfg, segments, docs))
    gates = {str(i): [round(float(g), 3) for g in m.gate_values()] for i, m in enumerate(model.memories)}
    return {"run": run_dir.name, "gates": gates,
            "between_reads": {str(i): round(c.mean_between_reads, 3) for i, c in contrast.items()},
            "to_mean_value": {str(i): round(c.mean_to_mean_value, 3) for i, c in contrast.items()}}


def step0(suite_name: str, out: Path) -> list[dict]:
    """valid bits per byte of the window floor and each Infini variant at step 0 (seed 0): the backbone
    as loaded, the memory's parameters at their initialisation, evaluated without training."""
    suite = load_suite(suite_name, ["seeds=[0]", "methods=[local,infini-delta]"])
    rows = []
    for spec in expand(suite):
        cfg = spec.cfg.copy()  # one step at learning rate 0: the starting weights, kept in a loadable run folder
        cfg.train.steps, cfg.train.lr, cfg.train.eval_every, cfg.out_dir = 1, 0.0, 0, str(out / "step0")
        run_dir = train(cfg, progress=False)
        res = json.loads((Path(run_dir) / "result.json").read_text())
        rows.append({"run": spec.name, "valid_bpb": res["valid_bpb"], "seg0": res["bpb_by_segment"][0],
                     "after": sum(b * t for b, t in zip(res["bpb_by_segment"][1:], res["tokens_by_segment"][1:]))
                     / sum(res["tokens_by_segment"][1:])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the lm-window suite's folder (runs/ inside)")
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--step0", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    report = {"probe": [probe_run(d, args.segments, args.docs) for d in sorted((args.folder / "runs").glob("infini-*"))
                        if (d / "result.json").is_file()]}
    if args.step0:
        out = args.out or Path("/tmp/infini-probe")
        report["step0"] = step0("lm-window", out)
        report["probe_step0"] = [probe_run(d, args.segments, args.docs) for d in sorted((out / "step0").glob("infini-*"))]
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "infini_probe.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
