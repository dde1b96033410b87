"""Running many runs: a comparison suite's config, its expansion into runs and stages, the workers and
launchers, its progress and its results table."""
