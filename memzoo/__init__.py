"""memzoo: memory-augmented transformers on one segment-recurrent backbone, compared on equal terms.

    from memzoo import MemoryModel, ModelConfig, register_memory, LayerMemory, ModelMemory, load_config, train

The package's layers, each importing only from those before it: core (interface, registry,
backbone) -> memories (one file per method) -> data (corpus, tasks) -> analysis (results tables)
-> runs (config, checkpoints, tracking) -> evaluations -> training -> diagnose -> suites (running
them) -> conformance (invariants, check, cards) -> publishing (references, tables, figures, report,
scorecard) -> this API and the CLI (docs/architecture.md).
"""
import memzoo.memories  # the in-tree plugins register themselves
from memzoo.core.config import ModelConfig  # the shared backbone's settings
from memzoo.core.memory import LayerInputs, LayerMemory, ModelMemory, SegmentInputs, State
from memzoo.core.model import MemoryModel, ModelState
from memzoo.core.plugins import get_memory, register_memory, registered
from memzoo.core.precision import working_dtype  # the memories' precision policy
from memzoo.runs.configure import load_config
from memzoo.training.train import train

__version__ = "0.1.0"
__all__ = ["LayerInputs", "LayerMemory", "MemoryModel", "ModelConfig", "ModelMemory", "ModelState", "SegmentInputs", "State",
           "get_memory", "load_config", "register_memory", "registered", "train", "working_dtype", "__version__"]
