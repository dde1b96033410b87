"""The catalogue: one card per method (NAME.yaml) with the paper's facts, shipped as package data."""
