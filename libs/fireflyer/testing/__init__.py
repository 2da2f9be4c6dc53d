"""Fixtures, fakes and fault injectors usable by tests and benchmarks."""
