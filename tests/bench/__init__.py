"""Benchmarks (``make bench`` / ``python -m tests.bench.run``); not collected as tests.

Nothing here is named ``test_*``: pytest never imports these modules on its own.
"""
