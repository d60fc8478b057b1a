"""Benchmarks of the platform (see bench/README.md); no part of the running platform."""
