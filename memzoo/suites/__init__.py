"""Many runs: comparison suites and their launchers, the report, the catalogue of cards and the
footprint tables across methods."""
