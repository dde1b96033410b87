"""Baseline `local`: causal attention within the segment only, no memory (the floor, and the
control of the reach test: nothing from an earlier segment may change its output)."""
from __future__ import annotations

from dataclasses import dataclass

from memzoo.core.memory import NoMemory
from memzoo.core.plugins import register_memory


@dataclass
class LocalConfig:
    """No options: the segment length is the backbone's."""


register_memory("local", config=LocalConfig)(NoMemory)
