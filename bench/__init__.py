"""Benchmarks: each script starts what it measures beside its baseline and prints a table."""
