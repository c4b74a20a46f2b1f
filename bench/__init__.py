"""Benchmarks of tidegate against its peers and against the limit of the machine.

Run them as scripts (`python bench/queue.py`); their latest figures live in BENCHMARKS.md.
"""
