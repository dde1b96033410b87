"""Which memories a suite runs: its extra plugin modules imported (`imports:`), and `methods` checked
against the registry; `plugin_methods` finds the memories one plugin registers."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from memzoo.core.config import ConfigError


def import_plugins(paths: list[str]) -> None:
    """Import the suite's extra plugin modules (dotted names or .py files): their decorators register them."""
    import importlib
    import importlib.util
    import sys

    for item in paths:
        if item.endswith(".py"):
            file = Path(item).expanduser().resolve()
            if not file.is_file():
                raise ConfigError(f"suite.imports: {item!r} is not a file")
            spec = importlib.util.spec_from_file_location(f"memzoo_suite_plugin_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # a dataclass under `from __future__ import annotations` looks its module up
            spec.loader.exec_module(module)
        else:
            importlib.import_module(item)


def plugin_methods(plugin: str) -> tuple[list[str], list[str]]:
    """Import a plugin (a .py file, a dotted module, or an installed entry point's name) and return
    (the memories its module registers, what a suite's `imports:` needs to import it again)."""
    from importlib import metadata

    from memzoo.core.plugins import ENTRY_POINT_GROUP, registered

    registered()  # discover the installed entry points first
    points = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if plugin.endswith(".py"):
        if not Path(plugin).expanduser().is_file():
            raise ConfigError(f"plugin file {plugin!r} does not exist")
        import_plugins([plugin])
        module, imports = f"memzoo_suite_plugin_{Path(plugin).stem}", [str(Path(plugin).expanduser().resolve())]
    elif plugin in points:
        points[plugin].load()
        module, imports = points[plugin].module, []  # installed: every worker discovers it
    else:
        try:
            import_plugins([plugin])
        except ModuleNotFoundError as err:
            raise ConfigError(f"{plugin!r} is no .py file, importable module or {ENTRY_POINT_GROUP} entry point "
                              f"({err})") from None
        module, imports = plugin, [plugin]
    names = [n for n, spec in registered().items() if spec.source == module or spec.source.startswith(module + ".")]
    if not names:
        raise ConfigError(f"{plugin!r} registers no memory (no @register_memory ran when it was imported)")
    return names, imports


def suite_methods(suite: DictConfig) -> list[str]:
    from memzoo.core.plugins import registered

    import_plugins(list(suite.imports))
    known = registered()
    names = list(known) if suite.methods == "all" else list(suite.methods)
    for name in names:
        if name not in known:
            raise ConfigError(f"suite method {name!r} is not registered; registered: {', '.join(known)}")
    return [n for n in names if n not in set(suite.exclude)]
