"""The core: the plugin interface, the registry, the backbone, attention, shared memory parts (FIFO
buffers), the config schema, precision and the shipped resources. It names no method and imports
nothing of memzoo above it."""
