"""Tools for tests and benchmarks: random-weight model directories of the real architectures (nothing is downloaded)."""
