"""Shared fixtures. `tests/` is on sys.path so test modules import the shared runners directly."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
