"""The job's log lines as a test reads them: the ``stabledrl`` loggers' records (INFO and above)
while a block runs, as a list of their messages (common/job_log.py says how the job logs)."""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Iterator

from stabledrl.common.job_log import attached


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def job_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    with attached(_Lines(lines)):
        yield lines


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
    with attached(_Stop(pattern)):
        yield
