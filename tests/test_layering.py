"""The package's folders are its layers: each module imports only from its own layer and those below,
no import cycle ties modules together, every `memzoo` import and dotted name in the repository names
something that exists, and the architecture page names every package."""
from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Low to high. A module may import modules of its own layer and of the layers before it.
LAYERS = ["core", "memories", "data", "analysis", "runs", "evaluations", "training", "diagnose", "suites", "conformance",
          "publishing", "api"]
# memzoo.<first name> -> layer; memzoo itself (the public API), memzoo.cli, memzoo.commands and memzoo.__main__ are the top.
LAYER_OF = {"core": "core", "registry": "core", "configs": "core", "memories": "memories", "data": "data",
            "analysis": "analysis", "runs": "runs", "evaluations": "evaluations", "training": "training",
            "diagnose": "diagnose", "suites": "suites", "conformance": "conformance", "publishing": "publishing",
            "cli": "api", "commands": "api", "__main__": "api"}
# Where the package's files sit: everything, the catalogue and the presets included, is under memzoo/.
SOURCES = {"memzoo": ROOT / "memzoo"}


def package_modules() -> dict[str, Path]:
    """Every module of the package as shipped: dotted name -> file."""
    modules: dict[str, Path] = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [*prefix.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def layer(module: str) -> str:
    if module == "memzoo":
        return "api"
    first = module.split(".")[1]
    if first not in LAYER_OF:
        raise AssertionError(f"{module} is in no layer; give memzoo.{first} a place in LAYER_OF")
    return LAYER_OF[first]


def source_segment(lines: list[str], node: ast.AST) -> str:
    """ast.get_source_segment(text, node) from the text's lines (that splits the whole text again on
    every call: most of this file's time). Offsets are in UTF-8 bytes, as the parser gives them."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def imported(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, int, str]]:
    """(imported memzoo module, line, statement) for every import in the file, inside functions too."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    lines = text.splitlines(keepends=True)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from package import submodule` imports the submodule; `from module import name` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target == "memzoo" or target.startswith("memzoo."):
                yield target, node.lineno, source_segment(lines, node) or target


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """module -> memzoo modules it imports, and the import problems (unknown modules, layer breaches)."""
    modules = package_modules()
    known = set(modules)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    problems = []
    for module, path in modules.items():
        for target, line, statement in imported(module, path, known):
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{line} ({module}, layer {layer(module)})"
            if target not in known:
                problems.append(f"{where} imports {target}, which is no module: {statement!r}")
                continue
            if LAYERS.index(layer(target)) > LAYERS.index(layer(module)):
                problems.append(f"{where} imports the higher layer {layer(target)}: {statement!r}")
            if target != module:
                graph[module].add(target)
    return graph, problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer_and_imports_only_its_own_layer_and_below() -> None:
    graph, problems = import_graph()
    assert {layer(m) for m in graph} == set(LAYERS)  # every layer holds modules (the walk found them all)
    assert not problems, "\n".join(problems)


def test_no_import_cycle_between_modules() -> None:
    graph, _ = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(shortest_cycle(graph, c)) for c in found)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest import cycle through the first module of a cycle component (breadth first)."""
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    for v in queue:
        for w in sorted(graph[v] & set(component)):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return component


def test_tests_benchmarks_and_experiments_import_only_modules_that_exist() -> None:
    known = set(package_modules())
    stale = [f"{path.relative_to(ROOT)}:{line} imports {target}: {statement!r}"
             for folder in ("tests", "benchmarks", "checks", "experiments") for path in sorted((ROOT / folder).rglob("*.py"))
             for target, line, statement in imported(f"{folder}.{path.stem}", path, known) if target not in known]
    assert not stale, "\n".join(stale)


def test_docs_name_only_modules_and_files_that_exist() -> None:
    """Dotted module names and module paths in the README, configs, cards, code and comments."""
    files = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "configs").rglob("*.yaml")),
             *sorted((ROOT / "registry").glob("*.yaml")), *package_modules().values(), *sorted((ROOT / "tests").glob("*.py")),
             *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "checks").rglob("*.py")),
             *sorted((ROOT / "experiments").rglob("*.py"))]
    missing = []
    for file in files:
        text = file.read_text()
        for name in set(re.findall(r"\bmemzoo(?:\.[A-Za-z_]\w*)+", text)):
            if not _resolves(name):
                missing.append(f"{file.relative_to(ROOT)}: {name}")
        for rel in set(re.findall(r"\bmemzoo/[\w/]+\.py\b", text)):
            if not (ROOT / rel).is_file():
                missing.append(f"{file.relative_to(ROOT)}: {rel}")
    assert not missing, "\n".join(sorted(missing))


def _resolves(dotted: str) -> bool:
    """A module, or an attribute reached from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_package_is_a_layer_and_the_architecture_page_names_it() -> None:
    """Each subpackage of memzoo/ (a folder with Python files) has a layer, and docs/architecture.md
    names its folder, so the page cannot fall behind the code."""
    folders = sorted(p.parent.name for p in (ROOT / "memzoo").glob("*/__init__.py"))
    bare = sorted({p.parent.name for p in (ROOT / "memzoo").glob("*/*.py")} - set(folders))
    assert not bare, f"memzoo/{bare} hold modules but no __init__.py: the wheel (packages.find) would leave them out"
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert not [f for f in folders if f not in LAYER_OF], folders
    missing = [f for f in folders if f"`memzoo/{f}/`" not in page]
    assert not missing, f"docs/architecture.md does not name {missing}"


MAX_LINES = 300  # a module a reader takes in whole; a method file that reads like its paper may run longer
PAPER_FILES = "memories"  # the folder of method files


def test_modules_stay_small_and_no_two_names_look_alike() -> None:
    """No module of memzoo/ outside the method files runs past MAX_LINES lines, and no package holds two
    modules whose names differ only by an ending (table.py beside tables.py, bpb.py beside bpb_figures.py)."""
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in sorted((ROOT / "memzoo").rglob("*.py"))
            if path.parent.name != PAPER_FILES and (n := path.read_text().count("\n")) > MAX_LINES]
    assert not long, f"modules above {MAX_LINES} lines (split them by what they hold): {long}"
    alike = []
    for folder in sorted({p.parent for p in (ROOT / "memzoo").rglob("*.py")}):
        names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        alike += [f"{folder.relative_to(ROOT)}: {a}.py ~ {b}.py" for a in names for b in names if a != b and b.startswith(a)]
    assert not alike, f"look-alike module names: {alike}"


@pytest.mark.parametrize("statement, module", [
    ("from memzoo.training.train import train", "memzoo.core.model"),
    ("import memzoo.evaluations.distance", "memzoo.evaluations.capacity"),
])
def test_the_checks_catch_a_breach_and_a_cycle(tmp_path: Path, monkeypatch, statement: str, module: str) -> None:
    """A higher-layer import inside a function of the core, and a cycle within a layer, are found."""
    modules = package_modules()
    source = modules[module].read_text() + f"\n\ndef _bad() -> None:\n    {statement}\n"
    copy = tmp_path / modules[module].name
    copy.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "package_modules", lambda: {**modules, module: copy})
    graph, problems = import_graph()
    if module == "memzoo.core.model":
        assert any(p.endswith(f"imports the higher layer training: {statement!r}") and f"({module}, layer core)" in p
                   for p in problems), problems
    else:
        assert not problems  # the same layer: allowed, but distance already imports capacity
        assert any({"memzoo.evaluations.capacity", "memzoo.evaluations.distance"} <= set(c) for c in cycles(graph)), cycles(graph)
