"""Sparse ranking models used by the demo, tests and benchmarks (TensorFlow)."""
