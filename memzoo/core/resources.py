"""Find the files that ship with the package (cards, presets, analysis recipes), installed or in a checkout.

An installed copy holds them inside the package (memzoo/registry, memzoo/configs, memzoo/analysis).
A checkout keeps them at the top level (registry/, configs/, analysis/) beside memzoo/, and a
checkout's memzoo/ comes first on sys.path whenever Python runs from the repository root (`python -m
pytest`, `python -c ...`), installed copy or not; `find_checkout_folders` makes those three
subpackages importable there too.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Optional

SHIPPED = ("analysis", "configs", "registry")  # top-level folders of a checkout, subpackages of memzoo when installed
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the memzoo/ folder this module was imported from


def resource_dir(package: str) -> Path:
    """Folder of `memzoo.<package>` ("registry" or "configs"), wherever this memzoo was imported from."""
    return Path(str(resources.files(f"memzoo.{package}")))


class CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds memzoo.analysis / .configs / .registry in the top-level folders of the checkout whose
    memzoo/ is imported, and nothing else."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self.root = package_dir.parent

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: object = None) -> Optional[importlib.machinery.ModuleSpec]:
        parent, _, name = fullname.rpartition(".")
        if parent != "memzoo" or name not in SHIPPED or path is None:
            return None
        if self.package_dir not in {Path(p).resolve() for p in path}:  # another memzoo (not this checkout's)
            return None
        init = self.root / name / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def find_checkout_folders() -> None:
    """In a checkout (memzoo/ without the three subpackages, the repository's top-level folders beside
    it), let `import memzoo.analysis` (and .configs, .registry) find those folders. Idempotent."""
    if any((PACKAGE_DIR / name).is_dir() for name in SHIPPED):  # an installed copy: they are inside
        return
    if not all((PACKAGE_DIR.parent / name / "__init__.py").is_file() for name in SHIPPED):
        return
    if not any(isinstance(f, CheckoutFolders) and f.package_dir == PACKAGE_DIR for f in sys.meta_path):
        # First, so that an editable install of another checkout cannot answer for this one.
        sys.meta_path.insert(0, CheckoutFolders(PACKAGE_DIR))
