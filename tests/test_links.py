"""No page links to a file or a section that does not exist: every relative link and image in
README.md and docs/ resolves, and every anchor names a heading of its page (as the site's table of
contents or GitHub spells it). Fast: no site build."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
EXPLICIT_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are examples, not links)."""
    return CODE.sub("", FENCE.sub("", text))


def heading_text(raw: str) -> str:
    """A heading as rendered: link targets, emphasis and code marks dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", EXPLICIT_ID.sub("", raw))
    return re.sub(r"[`*]", "", text).strip()


def slug_site(text: str) -> str:
    """Python-Markdown's toc slug (the site's anchors)."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def slug_github(text: str) -> str:
    """GitHub's anchor for a heading (how the README's readers on GitHub follow it)."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers: each heading's slugs (repeats numbered as both renderers do) and explicit ids."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    text = FENCE.sub("", page.read_text())
    out.update(re.findall(r"^::: ([\w.]+)", text, flags=re.M))  # mkdocstrings: an object's id is its dotted path
    for _, raw in HEADING.findall(text):
        if (m := EXPLICIT_ID.search(raw)):
            out.add(m.group(1))
        text = heading_text(raw)
        for slug, sep in ((slug_site(text), "_"), (slug_github(text), "-")):
            n = seen.get(slug + sep, 0)
            out.add(slug if n == 0 else f"{slug}{sep}{n}")
            seen[slug + sep] = n + 1
    return out


def generated_pages() -> set[Path]:
    """The method pages the docs hook generates at build time (not on disk)."""
    from memzoo.core.plugins import registered

    names = [n for n, spec in registered().items() if spec.cls.__module__.startswith("memzoo.memories")]
    return {DOCS / "methods" / "index.md", *(DOCS / "methods" / f"{n}.md" for n in names)}


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path, generated: set[Path]) -> list[str]:
    out = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if dest not in generated and not dest.exists():
            out.append(f"{target}: no file {shown(dest)}")
        elif anchor and dest.suffix == ".md" and dest.exists() and anchor not in anchors(dest):
            out.append(f"{target}: no heading with anchor #{anchor} in {shown(dest)}")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = broken_links(page, generated_pages())
    assert not broken, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(broken)


def test_the_checker_catches_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Top\n\n## The quick comparison (the main command), paired\n\n### Top\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#the-quick-comparison-the-main-command-paired) [ok](b.md#top_1) [ok](#here)\n"
                    "# Here\n[bad](c.md) [bad](b.md#nowhere) `[code](c.md)`\n```\n[block](c.md)\n```\n")
    broken = broken_links(page, set())
    assert len(broken) == 2 and "c.md" in broken[0] and "#nowhere" in broken[1], broken


def test_slugs_follow_both_renderers() -> None:
    title = "The memories of 2024–2026: speed"
    assert slug_site(title) == slug_github(title) == "the-memories-of-20242026-speed"
    assert slug_site("`memzoo check PLUGIN`") == "memzoo-check-plugin"


def wide_tables(text: str, limit: int = 8) -> list[str]:
    """The header rows of tables with more than `limit` columns (they scroll sideways on the site)."""
    lines = FENCE.sub("", text).splitlines()
    return [lines[i - 1] for i in range(1, len(lines))
            if re.match(r"^\|\s*:?-{3,}", lines[i]) and len(re.split(r"(?<!\\)\|", lines[i - 1].strip().strip("|"))) > limit]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_fits_the_page(page: Path) -> None:
    wide = wide_tables(page.read_text())
    assert not wide, f"{page.relative_to(ROOT)}: tables of more than 8 columns (split them):\n  " + "\n  ".join(wide)


def test_the_width_check_counts_columns() -> None:
    nine = "| " + " | ".join("abcdefghi") + " |\n|" + " --- |" * 9 + "\n"
    assert wide_tables(nine) and not wide_tables(nine.replace("| i ", "").replace(" --- |\n", "\n", 1))
    assert not wide_tables("| a \\| b | c |\n| --- | --- |\n")
