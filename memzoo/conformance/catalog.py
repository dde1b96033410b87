"""The catalogue: one YAML card per method in memzoo/registry/, with the paper's facts.

A card's `footprint_formula` is an arithmetic expression in config symbols (model fields such as
d_head (model.head_dim when set), d_inner (= n_heads x d_head), n_heads, n_layers, d_model,
segment_len; `input_len`; and the method's own options, with the card's `defaults` filling any the
method does not define). It states the paper's Table-1
count; the plugin's `footprint()` computes its own, and a test holds the two together.
"""
from __future__ import annotations

import ast
import math
import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from memzoo.core.config import ModelConfig
from memzoo.core.plugins import registered
from memzoo.core.resources import resource_dir, rounding_sensitive  # rounding_sensitive: re-exported

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_FUNCS = {"min": min, "max": max, "ceil": lambda x: -(-x // 1)}


@dataclass
class Card:
    name: str
    family: str
    paper: dict[str, Any]
    footprint_formula: str
    effective_context: str
    update: str
    retrieval: str
    defaults: dict[str, Any] = field(default_factory=dict)
    choices: list[str] = field(default_factory=list)
    footprint_note: str = ""
    reference_results: list[str] = field(default_factory=list)
    # Where rounding alone decides the result: what a 1e-7 relative nudge of the initial weights (or 1
    # against 2 threads) moved the quick suite's valid bpb by, when above 0.01 (experiments/precision/
    # sensitivity.py), and why. Empty: within 0.01, or not measured. Reports and frozen references name these methods.
    rounding_sensitivity: str = ""

    @property
    def citation(self) -> str:
        p = self.paper
        return f"{p.get('authors', '?')} ({p.get('year', '?')}), {p.get('title', '?')}, arXiv {p.get('arxiv', '?')}"


def evaluate_formula(expr: str, symbols: dict[str, Any]) -> float:
    """Evaluate +, -, *, /, //, **, min, max, ceil over named symbols; anything else is an error."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in symbols or symbols[node.id] is None:  # a card default of null counts as unset
                raise KeyError(f"footprint formula {expr!r} uses {node.id!r}, which the config does not define")
            return symbols[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"footprint formula {expr!r}: unsupported expression {ast.dump(node)[:60]}")

    return ev(ast.parse(expr, mode="eval"))


def formula_symbols(model: ModelConfig, memory_cfg: Any, input_len: int, card: Optional[Card] = None) -> dict[str, Any]:
    symbols: dict[str, Any] = dict(card.defaults) if card else {}
    symbols.update({f.name: getattr(model, f.name) for f in dataclasses.fields(model)})
    symbols.update(d_head=model.d_head, d_key=model.d_head, d_value=model.d_head, d_inner=model.d_inner, input_len=input_len)
    options = dataclasses.asdict(memory_cfg) if dataclasses.is_dataclass(memory_cfg) else dict(memory_cfg or {})
    symbols.update({k: v for k, v in options.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    # An option left at None means "unbounded" (e.g. full's max_len): infinity, so min() ignores it.
    symbols.update({k: math.inf for k, v in options.items() if v is None and k in symbols | options})
    return symbols


def card_footprint(card: Card, model: ModelConfig, memory_cfg: Any, input_len: int) -> int:
    return int(round(evaluate_formula(card.footprint_formula, formula_symbols(model, memory_cfg, input_len, card))))


def load_cards() -> dict[str, Card]:
    cards: dict[str, Card] = {}
    names = {f.name for f in dataclasses.fields(Card)}
    for path in sorted(resource_dir("registry").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"card {path.name}: unknown fields {sorted(unknown)}; expected {sorted(names)}")
        card = Card(**raw)
        cards[card.name] = card
    return cards


def get_card(name: str) -> Card:
    cards = load_cards()
    if name not in cards:
        raise KeyError(f"no card for {name!r} in memzoo/registry/; cards: {', '.join(sorted(cards))}")
    return cards[name]


def catalogue() -> list[dict[str, Any]]:
    """Every card and every registered plugin (a plugin without a card still appears)."""
    plugins = registered()
    cards = load_cards()
    rows = []
    for name in sorted(set(cards) | set(plugins)):
        card = cards.get(name)
        spec = plugins.get(name)
        rows.append(
            {
                "name": name,
                "family": card.family if card else "",
                "paper": card.citation if card else "",
                "arxiv": card.paper.get("arxiv", "") if card else "",
                "footprint_formula": card.footprint_formula if card else "",
                "effective_context": card.effective_context if card else "",
                "update": card.update if card else "",
                "retrieval": card.retrieval if card else "",
                "implemented": spec is not None,
                "level": spec.level if spec else "",
                "source": spec.source if spec else "",
            }
        )
    return rows
