"""Data: the byte corpus (stdlib source, local files, Hugging Face datasets) and the synthetic
long-range tasks (passkey, associative recall)."""
