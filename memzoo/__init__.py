"""memzoo: memory-augmented transformers on one segment-recurrent backbone, compared on equal terms.

    from memzoo import MemoryModel, register_memory, LayerMemory, ModelMemory
"""
from memzoo.memory import LayerInputs, LayerMemory, ModelMemory, SegmentInputs, State
from memzoo.model import MemoryModel, ModelState
from memzoo.plugins import get_memory, register_memory, registered

__version__ = "0.1.0"
__all__ = ["LayerInputs", "LayerMemory", "MemoryModel", "ModelMemory", "ModelState", "SegmentInputs", "State",
           "get_memory", "register_memory", "registered", "__version__"]
