"""`memzoo backbone CONFIG NAME`: one command trains a backbone from a config, ships it with a card that
a suite can load (`task.init_from=backbone:NAME`), and its `full` training reads every distance up to the
read's length, with copy reads mixed in at the share asked."""
from __future__ import annotations

import json

import torch

from memzoo.cli import main
from memzoo.core.model import is_memory_name
from memzoo.runs.checkpoints import load_backbone, load_checkpoint
from memzoo.runs.configure import build_model, load_config
from memzoo.training.backbones import card_cost, load_shipped_backbone
from memzoo.training.train import batch_source

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.steps=3",
        "train.batch_size=2", "train.window_segments=4", "train.bptt_segments=2", "train.max_doc_segments=4",
        "train.warmup_steps=1", "train.checkpoint_every=3", "train.log_every=1", "train.copy_distance=[4,63]",
        "data.max_docs=40", "eval.max_docs=2", "eval.max_segments_per_doc=4", "eval.batch_size=2",
        "task.init_from=null", "task.init_backbone_only=false"]


def test_the_command_ships_a_backbone_with_its_card_that_a_fine_tune_loads(tmp_path, monkeypatch, capsys):
    dest = tmp_path / "shipped"
    argv = ["backbone", "backbones/copy-stdlib", "tinycopy", *TINY, f"out_dir={tmp_path}", "--dest", str(dest),
            "--distances", "24", "40", "500", "--probe-rows", "2", "--chunk-len", "16"]
    assert main(argv) == 0
    card = json.loads((dest / "index.json").read_text())["tinycopy"]
    assert card["recipe"]["copy_share"] == 0.25 and card["recipe"]["method"] == "full"
    assert card["recipe"]["copy_layout"] == "periodic" and card["recipe"]["rope_base"] == 10000.0
    assert card["recipe"]["copy_draw"] == "log-uniform" and "uniform" not in card_cost(card)
    uniform = {**card, "recipe": {**card["recipe"], "copy_layout": "pairs", "copy_draw": "uniform"}}
    assert "copy reads 25%, pairs, d uniform)" in card_cost(uniform)  # the card says how d was drawn
    assert card["steps"] == 3 and card["valid_bpb"] > 0
    # the probe ran at the distances within the 64-byte reads only, for both kinds of chunk
    assert sorted({(r["kind"], r["distance"]) for r in card["copy_probe"]}) == [
        ("random", 24), ("random", 40), ("text", 24), ("text", 40)]
    assert "tinycopy" in capsys.readouterr().out
    # a fine-tune of another method loads exactly the trained backbone's weights
    monkeypatch.setenv("MEMZOO_BACKBONES", str(dest))
    trained = load_checkpoint(tmp_path / "backbone-copy-stdlib")["model"]
    cfg = load_config("xl", [*TINY[:4], "task.init_from=backbone:tinycopy", "task.init_backbone_only=true"])
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(cfg.task.init_from, cfg.model), cfg.task.init_from)
    for name, tensor in model.state_dict().items():
        if not is_memory_name(name):
            assert torch.equal(tensor, trained[name]), name


def test_full_training_reads_carry_state_over_the_whole_read():
    """Every segment of a read after its first continues the state (no reset), so `full` attends back to
    the read's first byte: distances up to max_doc_segments x segment_len - 1."""
    cfg = load_config("backbones/copy-stdlib", [*TINY, "train.copy_share=0"])
    sample = batch_source(cfg)
    n, cap, s = 16, 4, 4
    resets = torch.cat([sample(step).reset for step in range(3)], dim=1)  # [B, 3 x S]
    assert bool(resets[:, ::cap].all()) and not bool(resets.flatten(1)[:, [i for i in range(12) if i % cap]].any())
    model = build_model(cfg).eval()
    assert not model.cfg.attention_span and model.spec.name == "full"
    tokens = sample(0).tokens  # [B, S, N]: one whole read per row
    changed = tokens.clone()
    changed[:, 0, 0] = (changed[:, 0, 0] + 1) % 256
    with torch.no_grad():
        last = lambda x: model(x).logits[:, -1, -1]  # noqa: E731  the read's last position
        assert not torch.allclose(last(tokens), last(changed))  # it sees cap x n - 1 = 63 bytes back
    assert s * n == cap * n
