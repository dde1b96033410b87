"""Griffe extension: document `memzoo.analysis` from the checkout's top-level analysis/ folder.

In a checkout, analysis/ (like registry/ and configs/) sits beside memzoo/ and becomes
`memzoo.analysis` at import time (memzoo.core.resources) and at install time (pyproject's
package-dir). Griffe reads the source without importing it, so it finds no memzoo/analysis/; this
extension loads each shipped folder that is a Python package and attaches it under `memzoo`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe


class ShippedFolders(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "memzoo" or pkg.filepath is None:
            return
        from memzoo.core.resources import SHIPPED

        root = Path(str(pkg.filepath)).resolve().parent.parent
        for name in SHIPPED:
            if name in pkg.members or not (root / name / "__init__.py").is_file():
                continue
            folder = griffe.GriffeLoader(search_paths=[str(root)], docstring_parser=loader.docstring_parser,
                                         docstring_options=loader.docstring_options,
                                         lines_collection=loader.lines_collection)
            pkg.set_member(name, folder.load(name, try_relative_path=False))
