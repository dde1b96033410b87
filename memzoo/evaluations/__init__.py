"""What a trained run is measured by: the evaluation registry, the streaming harness, and one module
per kind (language modelling, long-range retrieval, recall against distance, capacity, BABILong)."""
