"""A stand-in for rknn-toolkit-lite2's `rknnlite` package (tests only): see `rknnlite.api`."""
