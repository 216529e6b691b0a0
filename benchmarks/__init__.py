"""Benchmarks: scripts run by hand (``python benchmarks/bench_NAME.py --help``), sharing ``_common``."""
