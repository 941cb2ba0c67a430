"""Benchmarks of safeupdates against naive baselines: run ``python benchmarks/bench.py`` (see docs/benchmarks.md)."""
