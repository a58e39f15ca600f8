"""Benchmark harness: times the same Beam pipelines on several runners.

Entry point: ``python -m bench.run --scale quick|full``. See ``bench/run.py``.
"""
