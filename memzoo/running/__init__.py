"""Running one model: configure (presets, overrides, validation against the registry and tasks),
train, evaluate, checkpoints, long-range streaming, generation, recall capacity, torchrun/DDP."""
