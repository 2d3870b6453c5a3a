"""The engine's error types. Each message names the bad file/tensor/value and what to do about it."""


class RkmojoError(Exception):
    """Base class: errors a user can act on (the CLI prints them as one line, exit 1)."""


class ModelFormatError(RkmojoError):
    """A store or a source checkpoint is malformed, truncated, or fails its digests."""


class ConvertError(RkmojoError):
    """A conversion cannot proceed (unsupported architecture, bad shapes, existing output, …)."""


class DiskFullError(RkmojoError, OSError):
    """A write found the disk full; the writer removed what it had begun (nothing is half-written)."""


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) says the disk is full: ENOSPC, EDQUOT, or SQLite's SQLITE_FULL."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
            return True
        if "database or disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
