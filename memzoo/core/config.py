"""The run configuration's schema (OmegaConf): dataclasses, YAML presets, `key=value` overrides.

A run config has fixed sections (model, data, train, eval, task) checked against these dataclasses.
The checks that need the registry or the tasks (the `memory` section against the chosen plugin's
own config dataclass, the task's layout) sit above both, in memzoo.running.configure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memzoo.core.resources import resource_dir


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
    rope_base: float = 10000.0
    dropout: float = 0.0
    attention_backend: str = "auto"  # auto | sdpa | xformers (xformers: CUDA only)
    checkpoint_activations: bool = False
    # small: normal(0.02), residual projections 0.02/sqrt(2 n_layers) (GPT-2's); torch: PyTorch's own
    # defaults (Linear kaiming-uniform, Embedding N(0, 1)), with which tiny models trained from scratch
    # learn associative recall (the capacity suite; README "Which memory recalls the most ...").
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

    source: str = "stdlib"  # "stdlib", a file, a folder, a glob, or hf:NAME[:CONFIG][:SPLIT] (memzoo.data.hf)
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
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 (autocast; memory state stays float32) | auto (bf16 on a bf16 CUDA device)
    device: str = "auto"  # auto | cpu | cuda
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
    init_from: Optional[str] = None  # a run folder whose trained weights to start from
    # True: take only the backbone's weights from init_from (e.g. one pretrained `local` transformer
    # shared by every method) and leave this memory's own parameters at their initialisation: a
    # memory added to a pretrained transformer, as the Infini-attention and RMT papers do
    init_backbone_only: bool = False
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])  # example bytes; one drawn per step
    loss: str = "answer"  # answer: loss on the answer bytes only | all: on every byte
    key_digits: int = 5  # passkey: digits of the key
    # passkey: [] = the key at a uniform depth; [k, ...] = per row, one k drawn and the key's last
    # digit placed exactly k segments before the segment holding the question's last byte (a
    # curriculum grows k stage by stage: 1 -> 2 -> 4)
    key_segments_back: list[int] = field(default_factory=list)
    # task runs: each step's loss = (1 - f) x task loss + f x corpus LM loss on a corpus batch of the
    # task batch's shape (memzoo.running.mixing), so a fine-tune keeps the language model; 0 = task only
    lm_fraction: float = 0.0
    pairs: int = 16  # recall: key-value pairs
    queries: int = 8  # recall: keys asked again
    # recall across segments (the capacity suite): 0 = the free layout above (pairs, filler up to a
    # length, queries); g >= 1 = the pairs in segment 0 and the queries, drawn with replacement, at
    # the start of segment g (examples of g + 1 segments; `lengths` is not used).
    gap_segments: int = 0
    local_queries: int = 0  # recall across segments: training queries right after the pairs, in segment 0
    alphabet: int = 64  # recall across segments: keys and values drawn from this many bytes each (<= 64)
    babilong: StoryTaskConfig = field(default_factory=StoryTaskConfig)


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
    # Per-method memory options for commands that consider several methods on one backbone
    # (footprint tables, comparison suites): {method name: {option: value}}.
    methods: Any = field(default_factory=dict)
    # The method whose footprint the others' `compression` ratios are relative to (None: no ratios).
    footprint_reference: Optional[str] = None


def preset_path(name_or_path: str) -> Path:
    """A YAML path as given, else a preset shipped in configs/ (e.g. `infini-linear`, `paper/table1`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    root = resource_dir("configs")
    for candidate in (root / name_or_path, root / f"{name_or_path}.yaml", root / "presets" / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    raise ConfigError(f"config {name_or_path!r} is neither a file nor a shipped preset; presets: {', '.join(known)}")


def _load_yaml_chain(path: Path) -> DictConfig:
    """Load YAML honouring an optional `defaults: [other.yaml, ...]` list (paths relative to the file)."""
    raw = OmegaConf.load(path)
    parents = raw.pop("defaults", []) if isinstance(raw, DictConfig) else []
    merged = OmegaConf.create()
    for parent in parents:
        merged = OmegaConf.merge(merged, _load_yaml_chain((path.parent / parent).resolve()))
    return OmegaConf.merge(merged, raw)


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"could not parse overrides {overrides}: {err}") from err


def _merge_checked(schema: Any, *layers: Any, where: str) -> DictConfig:
    try:
        return OmegaConf.merge(schema, *layers)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        where_key = f"{where}.{key}" if where and key else (key or where)
        raise ConfigError(f"bad config key or value at {where_key!r}: {err.msg if hasattr(err, 'msg') else err}") from None


def model_config(cfg: DictConfig) -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
