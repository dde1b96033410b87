"""Plugin conformance: the invariants every memory must pass, `memzoo check`, the catalogue of cards
and the footprint table (plugin, card, measured)."""
