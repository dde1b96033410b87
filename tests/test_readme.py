"""The README stays true: its set-up commands are the ones CI runs, and its plugin example works."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from memzoo.publishing.overview import LM_SUITE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_ci_runs_the_readme_test_command() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    commands = [line for b in blocks for line in b.splitlines() if line.startswith("pip install torch==2.13.0")]
    assert len(commands) == 2, commands
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def readme_plugin_source() -> str:
    """The README's plugin example (the first Python block under "Register a memory")."""
    return readme_blocks()[0]


def readme_blocks() -> list[str]:
    """The Python blocks under "Register a memory", as printed: the plugin, then the lines that build it."""
    text = README.read_text().split("## Register a memory", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_plugin_example_registers_a_working_memory() -> None:
    """The printed code, run verbatim, builds a model (with `ModelConfig` from `memzoo` itself) that
    streams as it runs one-shot, reads its state, and has the footprint it declares."""
    from memzoo.core.plugins import unregister_memory

    plugin, build = readme_blocks()[:2]
    assert "from memzoo import MemoryModel, ModelConfig" in build, "the example must build its model from memzoo's API"
    namespace: dict = {}
    exec(compile(plugin, "README example", "exec"), namespace)
    exec(compile(build, "README example, built", "exec"), namespace)
    try:
        model = namespace["model"]
        assert model.method == "my-decay"
        x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            one_shot = model(x)
            state, parts = model.initial_state(2), []
            for s in range(3):
                out = model(x[:, s : s + 1], state)
                state, parts = out.state, parts + [out.logits]
            y = x.clone()
            y[:, 0, 2] += 1
            reach = (model(y).logits[:, 2] - one_shot.logits[:, 2]).abs().max()
        assert torch.allclose(torch.cat(parts, 1), one_shot.logits, atol=1e-5)
        assert reach > 0
        assert model.spec.cls.footprint(model.memory_cfg, model.cfg, 0)["total"] == sum(
            v.numel() for st in state.layers for v in st.values()) // 2
    finally:
        unregister_memory("my-decay")


def test_readme_is_short_and_its_links_resolve() -> None:
    """A newcomer's page: at most 300 lines, and every relative link or image points at a file."""
    text = README.read_text()
    assert text.count("\n") <= 300, f"README.md has {text.count(chr(10))} lines; the rest belongs in docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "no relative links found (vacuous)"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


PROSE_LIMIT = 1500  # words a newcomer reads on the front page; the rest belongs in docs/
GENERATED = re.compile(r"<!-- generated:[a-z0-9-]+ -->.*?<!-- /generated -->", flags=re.S)
FENCED = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", flags=re.S)


def prose_words(text: str) -> list[str]:
    """The words of a page's prose: outside generated blocks, fenced code blocks, tables and HTML comments
    (a fact's markers are comments, its value counts), link targets dropped; a word is a run of non-space
    characters with at least one letter or digit."""
    text = COMMENT.sub(" ", FENCED.sub(" ", GENERATED.sub(" ", text)))
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return re.findall(r"\S*[^\W_]\S*", text)


def test_the_word_count_reads_prose_only() -> None:
    page = ("# Two words\n\nXL bought <!-- fact:lm-stream.xl.after -->−0.080 ± 0.009<!-- /fact --> [here](docs/results.md).\n\n"
            "```bash\npip install not counted\n```\n\n| a table | not counted |\n| --- | --- |\n\n"
            "<!-- generated:overview -->\n| method |\nhidden words\n<!-- /generated -->\n<!-- a comment, not counted -->\n— ±\n")
    assert prose_words(page) == ["Two", "words", "XL", "bought", "−0.080", "0.009", "[here]."]


def test_readme_prose_stays_short_and_its_lines_too() -> None:
    """At most PROSE_LIMIT words of prose and no line over 300 characters outside tables: the readings
    and protocol details live on the documentation site, one link away."""
    text = README.read_text()
    words = prose_words(text)
    assert 200 < len(words) <= PROSE_LIMIT, f"README.md has {len(words)} words of prose; at most {PROSE_LIMIT}"
    long = [line[:80] for line in text.splitlines() if len(line) > 300 and not line.startswith("|")]
    assert not long, f"README.md lines over 300 characters: {long}"


def test_a_newcomer_meets_the_commands_the_figure_and_the_overview_before_any_reading() -> None:
    """In order: the two set-up commands, the headline figure (headroom recovered against state) and its
    table, the overview table (also on docs/results.md), then how to register a memory; no other
    results table."""
    text = README.read_text()
    at = {name: text.index(marker) for name, marker in (
        ("install", "pip install . && memzoo compare"), ("tests", 'pip install ".[dev,docs]" && pytest -q'),
        ("figure", f"](docs/{LM_SUITE}/headroom.png)"), ("headline", f"<!-- generated:{LM_SUITE}-table -->"),
        ("overview", "<!-- generated:overview -->"), ("register", "## Register a memory"))}
    assert list(at) == sorted(at, key=at.get), at
    assert re.search(r"!\[[^\]]*\]\(([^)]+)\)", text).group(1) == f"docs/{LM_SUITE}/headroom.png", "a figure before the headline"
    assert re.findall(r"<!-- generated:([a-z0-9-]+) -->", text) == [f"{LM_SUITE}-table", "overview"]
    assert "<!-- generated:overview -->" in (ROOT / "docs" / "results.md").read_text()
    before = text[:at["register"]]
    assert len(prose_words(before)) < 500, "the way to the overview is a reading long"
