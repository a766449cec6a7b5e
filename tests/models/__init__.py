"""A small model zoo for framejit's tests and benchmarks, written for framejit."""
