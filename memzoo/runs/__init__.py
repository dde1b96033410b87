"""What training and evaluations share about one run: its config (presets, overrides, checks against
the registry and tasks), its checkpoints, its tracker and its processes (torchrun/DDP)."""
