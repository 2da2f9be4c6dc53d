"""Constants shared by the fs client tests (a module of its own: conftest is not importable by name)."""

#: the chunk size of the test directories (small, so tests cross many chunks and both stripes)
CHUNK = 64 * 1024
