"""rkmojo's inference engine: the store format, converters, kernels and model forward passes.

This package imports no Django, Celery or Redis; it is usable alone (the `rkmojo` CLI, Python API).
"""

__version__ = "0.1.0"
