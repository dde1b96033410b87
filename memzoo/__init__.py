"""memzoo: memory-augmented transformers on one segment-recurrent backbone, compared on equal terms.

    from memzoo import MemoryModel, ModelConfig, register_memory, LayerMemory, ModelMemory, load_config, train

The package's layers, each importing only from those before it: core (interface, registry,
backbone) -> memories (one file per method) -> data (corpus, tasks) -> analysis (results tables)
-> running (train, evaluate, stream) -> suites (compare, report) -> this API and the CLI.
"""
from memzoo.core.resources import find_checkout_folders

find_checkout_folders()  # first: in a checkout, memzoo.analysis/.configs/.registry are its top-level folders

import memzoo.memories  # noqa: E402  (the in-tree plugins register themselves)
from memzoo.core.config import ModelConfig  # noqa: E402  (the shared backbone's settings)
from memzoo.core.memory import LayerInputs, LayerMemory, ModelMemory, SegmentInputs, State  # noqa: E402
from memzoo.core.model import MemoryModel, ModelState  # noqa: E402
from memzoo.core.plugins import get_memory, register_memory, registered  # noqa: E402
from memzoo.core.precision import working_dtype  # noqa: E402  (the memories' precision policy)
from memzoo.running.configure import load_config  # noqa: E402
from memzoo.running.train import train  # noqa: E402

__version__ = "0.1.0"
__all__ = ["LayerInputs", "LayerMemory", "MemoryModel", "ModelConfig", "ModelMemory", "ModelState", "SegmentInputs", "State",
           "get_memory", "load_config", "register_memory", "registered", "train", "working_dtype", "__version__"]
