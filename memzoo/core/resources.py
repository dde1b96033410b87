"""Find the files that ship inside the package (cards, presets), installed or in a checkout.

memzoo/registry/ (one card per method) and memzoo/configs/ (presets and suites) are package data,
read through importlib.resources, so the same call works from a checkout, an editable install or a
wheel, from any working directory.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def resource_dir(package: str) -> Path:
    """Folder of `memzoo.<package>` ("registry" or "configs"), wherever this memzoo was imported from."""
    return Path(str(resources.files(f"memzoo.{package}")))
