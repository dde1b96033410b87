"""MkDocs hook: the API page's layout block, generated from the package's own docstrings.

`<!-- memzoo layout -->` in docs/api.md becomes one entry per subpackage of memzoo/ (its docstring)
with each of its modules and the first line of the module's docstring, read from the source with
`ast` (nothing is imported), so the block names every module and cannot fall behind the code.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose docs/ this is
MARKER = "<!-- memzoo layout -->"


def first_line(path: Path) -> str:
    """The first sentence-line of a Python file's docstring ('' when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def layout(package: Path = ROOT / "memzoo") -> str:
    """Markdown: each subpackage (docstring) and its modules (first docstring paragraph), in name order."""
    lines = [f"- **`memzoo/`**: {first_line(package / '__init__.py')}", ""]
    for init in sorted(package.glob("*/__init__.py")):
        folder = init.parent
        lines.append(f"- **`memzoo/{folder.name}/`**: {first_line(init)}")
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py":
                lines.append(f"    - `{module.stem}`: {first_line(module)}")
    for module in sorted(package.glob("*.py")):
        if module.name != "__init__.py":
            lines.append(f"- `memzoo/{module.name}`: {first_line(module)}")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Fill the marker on the API page."""
    return markdown.replace(MARKER, layout()) if MARKER in markdown else markdown
