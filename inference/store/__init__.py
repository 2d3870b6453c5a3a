"""The `.rkmojo` store: a directory with manifest.json, dense.bin and experts/layer_NN.bin."""

from .reader import ExpertLayout, Store
from .writer import StoreWriter

__all__ = ["Store", "StoreWriter", "ExpertLayout"]
