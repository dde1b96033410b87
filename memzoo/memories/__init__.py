"""In-tree memory plugins: every module here is imported by `memzoo.plugins.discover()`."""
