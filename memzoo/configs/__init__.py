"""The presets (small.yaml, one per method in presets/, paper/) and the comparison suites (suites/), shipped as package data."""
