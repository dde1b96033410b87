"""No module reaches a private name (`_x`) that another memzoo module defines: not by import, not as an
attribute of another object, not by monkeypatching it by name. Private names stay the business of the
file that defines them; what other files need is public and documented."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("memzoo", "tests", "benchmarks", "checks", "experiments")


def private_definitions(package: Path = ROOT / "memzoo") -> dict[str, set[Path]]:
    """Every `_name` (not dunder) defined in the package as a function, class, method or assignment -> its files."""
    found: dict[str, set[Path]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    found.setdefault(name, set()).add(path)
    return found


def reaches(path: Path, private: dict[str, set[Path]]) -> list[str]:
    """The lines of `path` that use a private name another file defines: 'LINE: NAME: code'."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for name, owners in private.items():
            if path in owners or name not in line:
                continue
            imported = "from memzoo" in line and re.search(rf"\bimport\b.*(?<![\w.]){re.escape(name)}\b", line)
            attribute = re.search(rf"(?<!\bself)(?<!\bcls)\.{re.escape(name)}\b", line)
            patched = re.search(rf"setattr\(.*[\"']{re.escape(name)}[\"']", line)
            if imported or attribute or patched:
                out.append(f"{number}: {name}: {line.strip()}")
    return out


def test_no_file_reaches_a_private_name_another_module_defines() -> None:
    private = private_definitions()
    assert len(private) > 20  # the walk finds them
    me = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}:{hit}" for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             if path != me for hit in reaches(path, private)]
    assert not found, "private names reached across modules:\n" + "\n".join(found)


def test_the_check_catches_each_kind_of_reach(tmp_path: Path) -> None:
    private = {"_hidden": {tmp_path / "owner.py"}}
    probe = tmp_path / "probe.py"
    for line in ("from memzoo" + ".owner import public, _hidden",  # split: the layering test reads dotted names
                 "y = obj._hidden(1)", 'monkeypatch.setattr(x, "_hidden", 1)'):
        probe.write_text(line + "\n")
        assert len(reaches(probe, private)) == 1, line
    for line in ("self._hidden = 1", "cls._hidden = 2", "z = _hidden_too", "# _hidden in a comment"):
        probe.write_text(line + "\n")
        assert reaches(probe, private) == [], line
    (tmp_path / "owner.py").write_text("x = other._hidden\n")
    assert reaches(tmp_path / "owner.py", private) == []  # the defining file may use its own names


def module_patches(source: str) -> list[str]:
    """Assignments to an attribute of a module imported from memzoo (`import memzoo.memories.armt as m; m.f = g`)."""
    tree = ast.parse(source)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name.startswith("memzoo")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memzoo"):
            folder = ROOT / node.module.replace(".", "/")  # `from memzoo.memories import titans`: titans is a module
            modules |= {a.asname or a.name for a in node.names
                        if (folder / f"{a.name}.py").is_file() or (folder / a.name / "__init__.py").is_file()}
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id in modules:
                    found.append(f"line {el.lineno}: {el.value.id}.{el.attr} = ...")
    return found


def test_experiments_reach_inside_memories_through_probes_not_by_patching() -> None:
    """No experiment replaces a memzoo function by assignment (they listen to memzoo.core.probe instead),
    and the check itself sees such a patch."""
    assert module_patches("import memzoo.memories.armt as armt\narmt.denominator, armt.x = f, g\n") == [
        "line 2: armt.denominator = ...", "line 2: armt.x = ..."]
    assert module_patches("from memzoo.memories import titans\ntitans.scan_memory = f\n") == ["line 2: titans.scan_memory = ..."]
    bad = {str(p.relative_to(ROOT)): found for p in (ROOT / "experiments").rglob("*.py")
           if (found := module_patches(p.read_text()))}
    assert not bad, bad
