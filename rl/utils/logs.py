"""Fatal errors in the run's ``train.log`` as well as on the console, once each.

Hydra prints a single run's error to the console itself, not through ``logging``, so it would be
missing from ``train.log``, the file a researcher opens first (and all a SLURM job leaves).
"""

from __future__ import annotations

import logging

_LOGGED = "_rl_fatal_logged"


def log_fatal(
    logger: logging.Logger, error: BaseException, message: str, *, console: bool = False
) -> None:
    """Log ``error`` with ``message`` and its traceback to the root logger's file handlers.

    ``console``: to its other handlers too (multirun jobs: Hydra prints single runs'). An error
    logged twice (deep in the engine, then on its way out) has its traceback once.
    """
    exc_info = (type(error), error, error.__traceback__)
    full = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (), exc_info)
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
