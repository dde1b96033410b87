"""lm-window-pairs is lm-window-rope3 with pair reads in fine-tuning, and nothing else; lm-window-conv is it
from another backbone, and nothing else; lm-window-conv3 to lm-window-conv6 are lm-window-conv from that
backbone trained further (conv6 adds XL's caches, the Compressive's and the infty-former's key caches and
rope3's eight other methods). Each suite's rows pair with its base's by method and seed
(experiments/window/finetune_reads.py), so any other difference would be read as the change's effect."""
from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from memzoo.suites.compare import expand, load_suite


def flat(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {"a.b": value}."""
    if not isinstance(cfg, dict) or not cfg:
        return {prefix: cfg}
    return {k: v for key, sub in cfg.items() for k, v in flat(sub, f"{prefix}.{key}" if prefix else key).items()}


def run_configs(suite: str) -> dict[str, dict[str, Any]]:
    return {spec.name: flat(OmegaConf.to_container(spec.cfg, resolve=True)) for spec in expand(load_suite(suite))}


def changes(variant: str, base: str = "lm-window-rope3", added: frozenset[str] = frozenset()) -> dict[str, dict[str, tuple[Any, Any]]]:
    """Run name -> every config key whose value differs between the base suite's run and the variant's;
    the variant's runs are the base's and exactly `added` besides (runs of methods the base lacks)."""
    text, other = run_configs(base), run_configs(variant)
    assert other.keys() - text.keys() == added and len(other) >= 5 * 3
    other = {name: cfg for name, cfg in other.items() if name not in added}
    return {name: {k: (text[name].get(k), other[name].get(k)) for k in text[name].keys() | other[name].keys()
                   if text[name].get(k) != other[name].get(k)} for name in other}


XL_KV = frozenset(f"xl-mem_len{m}-cachekv-s{seed}" for m in (128, 33) for seed in range(3))
XL_HIDDEN = frozenset(name.replace("cachekv", "cachehidden") for name in XL_KV)  # the same, keys re-projected
# the Compressive's and the infty-former's runs that keep the convolved keys, each beside its cachehidden twin
OTHER_KV = frozenset(f"{method}-cachekv-s{seed}" for method in ("compressive", "infty-former") for seed in range(3))
KEY_CACHES = XL_KV | OTHER_KV
# lm-window-rope3's variants that lm-window-conv5 lacks (all but its default XL), added to lm-window-conv6:
# conv6's run name -> rope3's (the Compressive's and the infty-former's name the cache they keep, as conv6's
# grid sets both).
ROPE3_ONLY = {(f"{variant}-cachehidden-s{seed}" if variant in ("compressive", "infty-former") else f"{variant}-s{seed}"):
              f"{variant}-s{seed}" for seed in range(3) for variant in
              ("infini-linear", "deltanet", "armt", "titans-mag", "titans-mac", "memorizing-mem_len0",
               "memorizing-mem_len0-store_size64", "compressive", "infty-former")}


def test_the_pair_read_suite_changes_only_what_fine_tuning_reads() -> None:
    for name, changed in changes("lm-window-pairs").items():
        assert changed == {"train.copy_share": (0.0, 0.5), "train.copy_layout": ("periodic", "pairs"),
                           "log.group": ("lm-window-rope3", "lm-window-pairs"),
                           "out_dir": ("results/lm-window-rope3/runs", "results/lm-window-pairs/runs")}, name


def test_the_convolution_suite_changes_only_the_backbone() -> None:
    """lm-window-conv is lm-window-rope3 from `copy-conv2`: the model's convolution and the backbone differ,
    every step, batch, seed and evaluation is the same, so its rows pair with lm-window-rope3's by method and seed."""
    for name, changed in changes("lm-window-conv").items():
        assert changed == {"model.qk_conv": (0, 4), "task.init_from": ("backbone:copy-stdlib-rope3", "backbone:copy-conv2"),
                           "log.group": ("lm-window-rope3", "lm-window-conv"),
                           "out_dir": ("results/lm-window-rope3/runs", "results/lm-window-conv/runs")}, name


@pytest.mark.parametrize("suite, base, backbones", [("lm-window-conv3", "lm-window-conv", ("copy-conv2", "copy-conv3")),
                                                     ("lm-window-conv4", "lm-window-conv3", ("copy-conv3", "copy-conv4")),
                                                     ("lm-window-conv5", "lm-window-conv4", ("copy-conv4", "copy-conv5")),
                                                     ("lm-window-conv6", "lm-window-conv5", ("copy-conv5", "copy-conv6"))])
def test_a_later_convolution_suite_changes_only_the_backbone_s_training(suite: str, base: str,
                                                                         backbones: tuple[str, str]) -> None:
    """lm-window-conv3 is lm-window-conv from `copy-conv3` (copy-conv2 trained further), and each later one
    the one before from the next stage (copy-conv3 trained further): nothing else differs. lm-window-conv6
    adds XL's caches at two lengths, the Compressive's and the infty-former's, of keys kept and of hidden
    states, and rope3's other methods; its other runs are lm-window-conv5's
    from `copy-conv6`."""
    added = XL_KV | XL_HIDDEN | OTHER_KV | ROPE3_ONLY.keys() if suite == "lm-window-conv6" else frozenset()
    for name, changed in changes(suite, base=base, added=added).items():
        assert changed == {"task.init_from": tuple(f"backbone:{b}" for b in backbones),
                           "log.group": (base, suite),
                           "out_dir": (f"results/{base}/runs", f"results/{suite}/runs")}, name


def test_the_methods_lm_window_conv6_adds_are_rope3_s_runs_from_its_backbone() -> None:
    """The eight methods (nine variants) lm-window-conv6 adds to conv5's are lm-window-rope3's runs with the model's convolution
    and `copy-conv6`, every step, batch, seed and evaluation the same, so all fourteen share one protocol."""
    rope3, conv6 = run_configs("lm-window-rope3"), run_configs("lm-window-conv6")
    for name, base in ROPE3_ONLY.items():
        changed = {k: (rope3[base].get(k), conv6[name].get(k)) for k in rope3[base].keys() | conv6[name].keys()
                   if rope3[base].get(k) != conv6[name].get(k) and k != "name"}
        assert changed == {"model.qk_conv": (0, 4), "task.init_from": ("backbone:copy-stdlib-rope3", "backbone:copy-conv6"),
                           "log.group": ("lm-window-rope3", "lm-window-conv6"),
                           "out_dir": ("results/lm-window-rope3/runs", "results/lm-window-conv6/runs")}, name


def test_the_cache_rows_of_lm_window_conv6_differ_in_the_keys_they_cache_beyond_the_window() -> None:
    """Its XL, Compressive and infty-former runs cache keys and values (the convolved keys, test_qk_conv.py)
    or hidden states (keys re-projected without the convolution) beyond the window, on the same backbone,
    steps and evaluation as the suite's other runs: each pair is the ablation of the keys' convolution."""
    runs = run_configs("lm-window-conv6")
    assert KEY_CACHES <= runs.keys(), KEY_CACHES - runs.keys()
    for name in KEY_CACHES:  # the pair differs in the cache alone
        kv, hidden = runs[name], runs[name.replace("cachekv", "cachehidden")]
        assert {k for k in kv.keys() | hidden.keys() if kv.get(k) != hidden.get(k)} == {"memory.cache", "name"}, name
    for name in XL_KV | XL_HIDDEN:
        cfg, floor = runs[name], runs[f"local-s{name[-1]}"]
        assert cfg["memory.cache"] == ("kv" if "cachekv" in name else "hidden"), name
        assert cfg["memory.beyond_window"] is True, name
        assert cfg["memory.mem_len"] == int(name.split("mem_len")[1].split("-")[0]), name
        same = {k for k in floor if not k.startswith(("memory.", "name"))}
        assert {k: cfg.get(k) for k in same} == {k: floor[k] for k in same}, name
