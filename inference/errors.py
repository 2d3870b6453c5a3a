"""The engine's error types. Each message names the bad file/tensor/value and what to do about it."""


class RkmojoError(Exception):
    """Base class: errors a user can act on (the CLI prints them as one line, exit 1)."""


class ModelFormatError(RkmojoError):
    """A store or a source checkpoint is malformed, truncated, or fails its digests."""


class ConvertError(RkmojoError):
    """A conversion cannot proceed (unsupported architecture, bad shapes, existing output, …)."""
