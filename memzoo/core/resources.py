"""Find the files that ship with the package (cards, presets), installed or in a checkout."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def resource_dir(package: str) -> Path:
    """Folder of `memzoo.<package>` ("registry" or "configs"): installed copy first, then the checkout."""
    try:
        return Path(str(resources.files(f"memzoo.{package}")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / package
