"""The job's log, on the standard library's ``logging``. Every room logs through its own module's
logger (``logging.getLogger(__name__)``, all under ``stabledrl``); nothing passes a log function
around. An entry point that shows the log on a terminal (`stabledrl train`, `stabledrl eval`, a
study, ``stabledrl.train``) calls ``show_log``: the INFO lines on stdout, each as it was written,
one a line, at once; warnings and errors on stderr, as Python shows them when nothing is set up.

    undo = show_log()
    with labelled("[grpo/seed0] "):      # a study's run: each of its lines carries the run's name
        Driver(cfg, stages=JOB_STAGES).run()
    undo()

Without ``show_log`` (a library user, a test) the lines go wherever the process's logging sends
them (pytest's ``caplog`` reads them); INFO is then off unless the ``stabledrl`` logger's level
says otherwise.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TextIO

ROOT = "stabledrl"


class _Below(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def _format(prefix: str = "") -> logging.Formatter:
    return logging.Formatter(prefix.replace("%", "%%") + "%(message)s")


def _console(stream: TextIO, level: int, below: Optional[int] = None) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setLevel(level)
    handler.setFormatter(_format())
    if below is not None:
        handler.addFilter(_Below(below))
    handler.stabledrl_console = True  # what ``labelled`` labels
    return handler


def show_log(stream: Optional[TextIO] = None) -> Callable[[], None]:
    """Show the ``stabledrl`` loggers' lines: INFO on ``stream`` (stdout), WARNING and above on
    stderr. The lines do not also reach the root logger's handlers (no line twice). Returns what
    undoes it."""
    logger = logging.getLogger(ROOT)
    handlers = [_console(stream or sys.stdout, logging.INFO, below=logging.WARNING),
                _console(sys.stderr, logging.WARNING)]
    level, propagate = logger.level, logger.propagate
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    def undo() -> None:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate

    return undo


def log_shown() -> bool:
    """Whether this process already shows the ``stabledrl`` lines somewhere (``show_log``, or
    logging the user configured)."""
    return bool(logging.getLogger(ROOT).handlers or logging.getLogger().handlers)


@contextmanager
def labelled(prefix: str) -> Iterator[None]:
    """Every line ``show_log`` shows while the block runs starts with ``prefix``."""
    handlers = [h for h in logging.getLogger(ROOT).handlers if getattr(h, "stabledrl_console", False)]
    for handler in handlers:
        handler.setFormatter(_format(prefix))
    try:
        yield
    finally:
        for handler in handlers:
            handler.setFormatter(_format())


@contextmanager
def attached(handler: logging.Handler) -> Iterator[logging.Handler]:
    """``handler`` receives the ``stabledrl`` loggers' records, INFO and above (whatever its own
    level lets through), while the block runs; the logger's level is restored after. What a caller
    that reads the job's lines itself attaches: a benchmark printing them, a test collecting them."""
    logger = logging.getLogger(ROOT)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
