"""In-tree memory plugins, one file per method: importing this package imports every module in it,
whose `@register_memory` decorators register the methods (`import memzoo` does so)."""
import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
