"""Benchmark-only models of section 5 ("save()"): one table shape, three ways of saving it."""
