"""Nested, timed logging in the style of the nixpkgs test driver.

``with log.nested("booting machine"):`` prints the step, indents what happens inside it, and
prints the elapsed time when it ends, whether it ended normally or with an exception. The lines
go to stderr (or the stream given); nothing is kept: a caller that reports step times measures
them itself (``vmtests.scenario.runner.scenario.Scenario.step``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class NestedLogger:
    """A logger that indents nested steps and logs how long each took."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._local = threading.local()
        self._lock = threading.Lock()

    @property
    def _stack(self) -> list[str]:
        stack: list[str] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = []
            self._local.stack = stack
        return stack

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stderr
        with self._lock:
            stream.write("  " * len(self._stack) + line + "\n")
            stream.flush()

    def info(self, message: str) -> None:
        """Log one line at the current nesting level."""
        self._write(message)

    def warning(self, message: str) -> None:
        """Log a warning line at the current nesting level."""
        self._write(f"WARNING: {message}")

    @contextmanager
    def nested(self, title: str) -> Iterator[None]:
        """Log ``title``, indent everything inside, then log the elapsed time."""
        self._write(f"{title}...")
        self._stack.append(title)
        start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            elapsed = time.monotonic() - start
            self._stack.pop()
            self._write(f"({'done' if ok else 'FAILED'}: {title}, {elapsed:.2f}s)")


log = NestedLogger()
