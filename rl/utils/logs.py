"""Fatal errors in the run's ``train.log`` as well as on the console, once each.

Hydra prints a single run's error to the console itself (not through ``logging``), so a fatal
error would otherwise be missing from ``train.log``, the file a researcher opens first (and the
only one a SLURM job leaves). :func:`log_fatal` writes the error with its traceback to the root
logger's file handlers (``train.log``; a resumed run's own ``train.log`` too) and, on request,
to its other handlers (the console), and remembers that it did, so an error logged deep in the
engine (where a resumed run's log file is still attached) gets only its message, not its
traceback again, when it is logged on its way out.
"""

from __future__ import annotations

import logging

_LOGGED = "_rl_fatal_logged"


def log_fatal(
    logger: logging.Logger, error: BaseException, message: str, *, console: bool = False
) -> None:
    """Log ``error`` (with its traceback) to ``train.log``, and to the console if asked.

    Args:
        logger: The logger the record comes from.
        error: The exception on its way out.
        message: The record's message (the error's own text follows the traceback).
        console: Also to the root logger's other handlers (Hydra prints single runs' errors
            itself, so only multirun jobs ask for this).
    """
    exc_info = (type(error), error, error.__traceback__)
    full = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (), exc_info)
    # Already in train.log with its traceback: the message alone there this time.
    in_files = bool(getattr(error, _LOGGED, False))
    brief = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        is_file = isinstance(handler, logging.FileHandler)
        if is_file or console:
            record = brief if is_file and in_files else full
            if record.levelno >= handler.level:
                handler.handle(record)
    try:
        setattr(error, _LOGGED, True)
    except AttributeError:  # an exception type with slots: it may be logged twice
        pass


__all__ = ["log_fatal"]
