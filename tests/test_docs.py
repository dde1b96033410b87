"""The documentation site stays true: a generated page for every method, a strict build, an index of
experiments/ that misses no file, and a plugin example that works."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memzoo.core.plugins import registered, unregister_memory
from memzoo.conformance.catalog import load_cards

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# what `mkdocs build` needs, by module: the distribution that provides it (all in the `docs` extra)
BUILD_MODULES = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocstrings": "mkdocstrings",
                 "mkdocstrings_handlers.python": "mkdocstrings-python"}


def method_pages_hook() -> ModuleType:
    import docs.hooks.method_pages as module  # mkdocs.yml's hook, from the checkout (pyproject's pytest pythonpath)
    return module


def in_tree_methods(hook: ModuleType) -> list[str]:
    """The registered methods memzoo ships (a plugin from another installed package, or one a test
    registers for a moment, is no part of this site and needs no card)."""
    return [name for name, spec in registered().items() if hook.in_tree(spec)]


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def test_every_registered_method_has_a_card_and_a_generated_page() -> None:
    hook = method_pages_hook()
    pages = hook.method_pages()
    cards = load_cards()
    methods = in_tree_methods(hook)
    assert methods, "no in-tree method registered"
    for name in methods:
        assert name in cards, f"{name} is registered but has no card in memzoo/registry/"
        page = pages.get(hook.page_path(name))
        assert page is not None, f"the docs hook made no page for {name}"
        card = cards[name]
        assert card.footprint_formula in page, name
        for fact in [card.paper["title"], card.effective_context, card.update, card.retrieval, *card.choices]:
            assert hook.text(fact) in page, f"{name}'s page lacks {fact[:60]!r}"
        assert f"]({name}.md)" in pages[hook.INDEX], f"the methods table does not link {name}"
    on_disk = [path for path in pages if (DOCS / path).exists()]
    assert not on_disk, f"generated pages must not be committed: {on_disk}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    missing = sorted({dist for module, dist in BUILD_MODULES.items() if not importable(module)})
    if missing:
        pytest.fail(f"the documentation build needs {', '.join(missing)}: pip install \".[docs]\"", pytrace=False)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0, printed on every build
    # Not --quiet: with it, mkdocs 1.6 drops the warnings before --strict counts them and passes anyway.
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = f"{out.stdout}\n{out.stderr}"
    assert out.returncode == 0 and "WARNING" not in log, f"mkdocs build --strict failed:\n{log}"
    for name in in_tree_methods(method_pages_hook()):
        assert (site / "methods" / name / "index.html").is_file(), name
    assert "before_layer" in (site / "api" / "index.html").read_text()  # the API reference rendered
    assert "paired_t" in (site / "analysis" / "index.html").read_text()  # memzoo.analysis from memzoo/analysis/


def test_the_experiments_page_names_every_file_in_experiments() -> None:
    page = (DOCS / "experiments.md").read_text()
    files = [p for p in sorted((ROOT / "experiments").rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")]
    assert files
    for path in files:
        folder = path.parent.relative_to(ROOT).as_posix()
        assert f"`{folder}/`" in page, f"docs/experiments.md has no section for {folder}/"
        assert f"`{path.name}`" in page, f"docs/experiments.md does not list {path.relative_to(ROOT)}"


def test_the_plugin_page_example_passes_the_invariants() -> None:
    """The example on docs/plugins.md registers a memory that passes the invariants the page lists
    (those that need no card: causality, reach, streaming = one-shot, reset)."""
    import test_invariants as inv

    code = re.search(r"```python\n(.*?)```", (DOCS / "plugins.md").read_text(), flags=re.S).group(1)
    before = set(registered())
    exec(compile(code, "docs/plugins.md", "exec"), {})
    added = sorted(set(registered()) - before)
    try:
        assert len(added) == 1, added
        case = (added[0], added[0], {})
        for invariant in (inv.test_causality, inv.test_reach, inv.test_streaming_equals_one_shot,
                          inv.test_reset_equals_fresh_state):
            invariant(case)
    finally:
        for name in added:
            unregister_memory(name)


def test_the_api_page_layout_is_generated_and_names_every_module() -> None:
    """docs/api.md holds the marker the hook fills, mkdocs.yml runs the hook, and the generated block
    names every subpackage and module of memzoo/ with its docstring's first paragraph."""
    import docs.hooks.api_layout as hook

    assert hook.MARKER in (DOCS / "api.md").read_text()
    assert "docs/hooks/api_layout.py" in (ROOT / "mkdocs.yml").read_text()
    block = hook.layout()
    for module in sorted((ROOT / "memzoo").glob("*/*.py")):
        if module.name == "__init__.py":
            assert f"**`memzoo/{module.parent.name}/`**" in block, module
        else:
            assert f"    - `{module.stem}`: {hook.first_line(module)}" in block, module
    assert "    - `train`: " in block and hook.first_line(ROOT / "memzoo" / "training" / "train.py")
