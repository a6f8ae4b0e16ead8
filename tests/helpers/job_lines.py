"""The job's log lines as a test reads them: the ``stabledrl`` loggers' records (INFO and above)
while a block runs, as a list of their messages (common/job_log.py says how the job logs)."""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Iterator


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def job_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    logger, handler = logging.getLogger("stabledrl"), _Lines(lines)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class _Stop(logging.Handler):
    def __init__(self, pattern: str) -> None:
        super().__init__(logging.INFO)
        self.pattern = re.compile(pattern)

    def emit(self, record: logging.LogRecord) -> None:
        if self.pattern.search(record.getMessage()):
            raise KeyboardInterrupt  # not caught by logging: the job stops there, as Ctrl-C stops it


@contextmanager
def stop_at(pattern: str) -> Iterator[None]:
    """While the block runs, the first job line that matches ``pattern`` stops the job as Ctrl-C would."""
    logger, handler = logging.getLogger("stabledrl"), _Stop(pattern)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
