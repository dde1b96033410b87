"""Publishing results: the shipped reference rows, the generated tables and figures, the report and
the scorecard that ranks a plugin against them."""
