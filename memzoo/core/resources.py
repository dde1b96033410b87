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


def rounding_sensitive(methods: list[str]) -> list[str]:
    """The methods among `methods` whose card (memzoo/registry/NAME.yaml) marks their result as decided
    by rounding (a non-empty `rounding_sensitivity`); a method without a card has no mark. Here, below
    the catalogue, so that an evaluation kind's report notes can name them."""
    import yaml

    marked = []
    for method in sorted(set(methods)):
        card = resource_dir("registry") / f"{method}.yaml"
        if card.is_file() and (yaml.safe_load(card.read_text()) or {}).get("rounding_sensitivity"):
            marked.append(method)
    return marked
