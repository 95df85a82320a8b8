"""Benchmark harnesses behind ``nearrec bench``: every system measured side by side with its
peers and the machine's limits in one run; results as JSON + Markdown under ``bench/results/``."""
