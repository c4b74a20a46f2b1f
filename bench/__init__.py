"""Benchmarks of tidegate against its peers and against the limit of the machine.

Run each as a module from the repository root (`.venv/bin/python -m bench.queues`); their latest
figures live in BENCHMARKS.md. They import tidegate through its public surface (`tidegate`) and
`tidegate.testing`, never its internals (tests/test_testing_surface.py checks it).
"""
