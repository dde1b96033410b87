"""MkDocs hook: one page per method, written at build time from its card in memzoo/registry/.

The card is the single source of a method's facts (citation, footprint formula and note, effective
context, update, retrieval, defaults, choices, reference results); this hook only lays them out.
Nothing is written to disk: the pages exist in the build alone (`File.generated`).

    method_pages()   {"methods/index.md": ..., "methods/NAME.md": ...}, without MkDocs
    on_config        appends a nav entry per method after `methods/index.md`
    on_files         adds the generated pages to the build

A method appears when it has a card or is registered by memzoo itself (an in-tree plugin); a
plugin from another installed package is not part of this site.
"""
from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose docs/ this is
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # document this checkout's memzoo, installed copy or not

INDEX = "methods/index.md"
_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def text(value: Any) -> str:
    """A card's prose as Markdown that renders as written: HTML characters and Markdown markup escaped."""
    return _SPECIAL.sub(r"\\\1", html.escape(str(value), quote=False))


def code(value: Any) -> str:
    """An inline code span that holds any text (a longer fence when the text has backticks)."""
    value = str(value)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def yaml_value(value: Any) -> str:
    """A default as the card writes it (true, null, 1.0e-05), not as Python prints it."""
    import yaml

    dumped = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return dumped.removesuffix("...").strip()


def page_path(name: str) -> str:
    return f"methods/{name}.md"


def in_tree(spec: Any) -> bool:
    return spec.source == "memzoo" or spec.source.startswith("memzoo.")


def methods() -> tuple[dict[str, Any], dict[str, Any]]:
    """(cards, in-tree plugin specs) by name."""
    import memzoo  # noqa: F401  (registers the in-tree plugins)
    from memzoo.core.plugins import registered
    from memzoo.conformance.catalog import load_cards

    return load_cards(), {name: spec for name, spec in registered().items() if in_tree(spec)}


def paper_link(card: Any) -> str:
    arxiv = card.paper.get("arxiv")
    return f"[arXiv {arxiv}](https://arxiv.org/abs/{arxiv})" if arxiv else ""


def implementation(name: str, spec: Optional[Any]) -> list[str]:
    if spec is None:
        return ["No plugin is registered under this name: the card describes a method memzoo does not implement."]
    module = spec.cls.__module__
    lines = [f"{spec.level.capitalize()}-level memory `{spec.cls.__name__}` in `{module.replace('.', '/')}.py` "
             f"(config `{spec.config_cls.__name__}`"
             + (", with " + ", ".join(f"`{k}: {v}`" for k, v in spec.defaults.items()) if spec.defaults else "")
             + ")."]
    from memzoo.core.resources import resource_dir

    preset = resource_dir("configs") / "presets" / f"{name}.yaml"
    if preset.is_file():
        lines += ["", f"Its preset, `memzoo/configs/presets/{name}.yaml` (`memzoo train {name}`):", "",
                  "```yaml", preset.read_text().rstrip(), "```"]
    return lines


def card_page(name: str, card: Optional[Any], spec: Optional[Any]) -> str:
    """The Markdown page of one method."""
    out = [f"# {name}", ""]
    if card is None:
        out += ["!!! warning \"No card\"", f"    `{name}` is registered but has no card in `memzoo/registry/`.", ""]
        out += ["## Implementation", "", *implementation(name, spec), ""]
        return "\n".join(out)
    out += [f"*{text(card.family)}*", ""]
    p = card.paper
    out += [f"**Paper.** {text(p.get('authors', '?'))} ({text(p.get('year', '?'))}), "
            f"*{text(p.get('title', '?'))}*. {paper_link(card)}".rstrip(), ""]
    out += ["## Footprint", "", "The paper's count of the numbers the state holds per sequence (the card's formula; "
            "`memzoo footprint CONFIG` evaluates it beside the plugin's analytic count and a measured state):", "",
            "```text", card.footprint_formula, "```", ""]
    if card.footprint_note:
        out += [text(card.footprint_note), ""]
    for title, value in (("Effective context", card.effective_context), ("Update", card.update),
                         ("Retrieval", card.retrieval)):
        out += [f"## {title}", "", text(value), ""]
    if card.defaults:
        out += ["## Defaults", "", "| option | default |", "| --- | --- |"]
        out += [f"| `{k}` | {code(yaml_value(v))} |" for k, v in card.defaults.items()]
        out += [""]
    if card.choices:
        out += ["## Choices", "", "Where the paper is silent or where memzoo departs from it:", ""]
        out += [f"- {text(c)}" for c in card.choices] + [""]
    if card.reference_results:
        out += ["## Reference results", "", "Reported by the papers (not measured here):", ""]
        out += [f"- {text(r)}" for r in card.reference_results] + [""]
    out += ["## Implementation", "", *implementation(name, spec), ""]
    out += ["---", "", f"Generated from `memzoo/registry/{name}.yaml` when the site is built; edit the card, not this page.", ""]
    return "\n".join(out)


def index_page(cards: dict[str, Any], specs: dict[str, Any]) -> str:
    """The table of every method."""
    out = ["# Methods", "",
           "Every method memzoo knows, one page each, generated from its card in `memzoo/registry/` "
           "(`memzoo list` prints the same catalogue). The footprint is the paper's count of the numbers the state "
           "holds per sequence, in the config's symbols.", "",
           "| method | family | paper | footprint formula | level |", "| --- | --- | --- | --- | --- |"]
    for name in sorted(set(cards) | set(specs)):
        card, spec = cards.get(name), specs.get(name)
        paper = (f"{text(card.paper.get('authors', '?'))} ({text(card.paper.get('year', '?'))}) {paper_link(card)}"
                 if card else "")
        formula = code(card.footprint_formula) if card else ""
        level = spec.level if spec else "not implemented"
        out.append(f"| [`{name}`]({name}.md) | {text(card.family) if card else 'no card'} | {paper} | {formula} | {level} |")
    out += ["", "Two are baselines: `local` (attention within the segment, no memory: the floor) and `full` "
            "(causal attention over the whole document: the ceiling).", ""]
    return "\n".join(out)


def method_pages() -> dict[str, str]:
    """Every generated page by its path under docs/: the index and one per method."""
    cards, specs = methods()
    pages = {INDEX: index_page(cards, specs)}
    for name in sorted(set(cards) | set(specs)):
        pages[page_path(name)] = card_page(name, cards.get(name), specs.get(name))
    return pages


# MkDocs events ------------------------------------------------------------------------------------

def _method_nav(entries: list[Any]) -> Optional[list[Any]]:
    """The nav list that holds methods/index.md, searched depth first."""
    for entry in entries:
        value = entry
        if isinstance(entry, dict):
            (value,) = entry.values()
        if value == INDEX:
            return entries
        if isinstance(value, list):
            found = _method_nav(value)
            if found is not None:
                return found
    return None


def on_config(config: Any) -> Any:
    section = _method_nav(config["nav"] or [])
    if section is None:
        raise ValueError(f"mkdocs.yml: the nav must list {INDEX} (the method pages go after it)")
    listed = {v for e in section for v in (e.values() if isinstance(e, dict) else [e])}
    cards, specs = methods()
    section += [{name: page_path(name)} for name in sorted(set(cards) | set(specs)) if page_path(name) not in listed]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in method_pages().items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            raise ValueError(f"docs/{path} exists on disk; the method pages are generated from memzoo/registry/, not written")
        files.append(File.generated(config, path, content=content))
    return files
